"""Rollout engine: G completions per prompt, with the token ids, masks, sampling log-probs and
truncation flags that the update needs.

The loop is ours, not `model.generate`, for three reasons that are each a speed-up or a number we keep:
1. the prompt is prefilled once per group and its KV cache repeated G times (a group shares its prompt);
2. a sequence that reached EOS leaves the batch, so no step decodes finished rows;
3. the log-prob of each sampled token under the sampling distribution is recorded as it is drawn.
"""

from __future__ import annotations

import torch

from grpolab.batch import Rollout, Stop
from grpolab.engine.native.sampling import PLAIN, Filters, sample_token, seen_tokens
from grpolab.engine.native.session import decode_session
from grpolab.model.cache import positions


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    G: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    autocast_dtype: torch.dtype | None = None,
    generator: torch.Generator | None = None,
    eos_ids: set[int] | None = None,
    lean: bool = True,
    filters: Filters = PLAIN,
) -> Rollout:
    """Sample G completions for each prompt (token ids, already chat-templated).

    filters: top-k, min-p and the repetition penalty (grpolab.engine.native.sampling), each off by default.

    lean: run the model through grpolab.engine.native.decoder where it supports the model (Llama, Qwen2, Mistral),
    with its weights in `autocast_dtype` (else the model's own dtype); otherwise its HF forward."""
    with decode_session(
        model, tokenizer, prompt_ids, autocast_dtype=autocast_dtype, capacity=max_new_tokens, lean=lean, eos_ids=eos_ids
    ) as sess:
        return _decode(
            sess.stepper,
            tokenizer,
            sess.ids,
            sess.mask,
            G,
            max_new_tokens,
            temperature,
            top_p,
            greedy,
            generator,
            sess.eos,
            sess.pad_id,
            filters,
        )


def _decode(
    stepper,
    tokenizer,
    ids,
    mask,
    G,
    max_new_tokens,
    temperature,
    top_p,
    greedy,
    generator,
    eos,
    pad_id,
    filters: Filters = PLAIN,
) -> Rollout:
    """Prefill once per group, then one token per step for the rows still decoding (see generate)."""
    device = ids.device
    B = ids.shape[0]
    N = B * G
    logits = stepper.prefill(ids, mask, positions(mask))  # (B, V)
    if G > 1:
        stepper.repeat(G)
        logits = logits.repeat_interleave(G, 0)  # (N, V)
    pos = positions(mask.repeat_interleave(G, 0))[:, -1]  # (N,) position of the last prompt token

    tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lps = torch.zeros((N, max_new_tokens), device=device)
    cmask = torch.zeros((N, max_new_tokens), device=device)
    finished = torch.zeros(N, dtype=torch.bool, device=device)
    active = torch.arange(N, device=device)  # rows still decoding, in cache order
    seen = seen_tokens(ids, mask, logits.shape[-1]).repeat_interleave(G, 0) if filters.penalised else None  # (N, V)
    for t in range(max_new_tokens):
        tok, lp = sample_token(
            logits, temperature, top_p, greedy, generator, filters, None if seen is None else seen[active]
        )
        if seen is not None:
            seen[active, tok] = True
        tokens[active, t] = tok
        lps[active, t] = lp
        cmask[active, t] = 1.0
        done = torch.isin(tok, eos)
        finished[active[done]] = True
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        keep = ~done
        if not bool(keep.all()):  # finished rows leave the batch
            keep_idx = keep.nonzero().squeeze(-1)
            stepper.keep(keep_idx)
            active, pos, tok = active[keep_idx], pos[keep_idx], tok[keep_idx]
        pos = pos + 1
        logits = stepper.step(tok, pos)
    C = int(cmask.sum(0).nonzero().max()) + 1 if cmask.any() else 1
    tokens, lps, cmask = tokens[:, :C], lps[:, :C], cmask[:, :C]
    texts = tokenizer.batch_decode(
        [row[m.bool()].tolist() for row, m in zip(tokens.cpu(), cmask.cpu())], skip_special_tokens=True
    )
    return Rollout(
        prompt_ids=ids.repeat_interleave(G, 0).cpu(),
        prompt_mask=mask.repeat_interleave(G, 0).cpu(),
        completion_ids=tokens.cpu(),
        completion_mask=cmask.cpu(),
        sample_logp=lps.float().cpu(),
        truncated=(~finished).cpu(),
        texts=texts,
        G=G,
        stops=[Stop.EOS if f else Stop.LENGTH for f in finished.tolist()],
    )


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(model, "generation_config", None)
    e = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(e, int):
        ids.add(e)
    elif isinstance(e, (list, tuple)):
        ids.update(int(x) for x in e)
    return ids
