"""Rollout engine: G completions per prompt, with the token ids, masks, sampling log-probs and
truncation flags that the update needs.

The loop is ours, not `model.generate`, for three reasons that are each a speed-up or a number we keep:
1. the prompt is prefilled once per group and its KV cache repeated G times (a group shares its prompt);
2. a sequence that reached EOS leaves the batch, so no step decodes finished rows;
3. the log-prob of each sampled token under the sampling distribution is recorded as it is drawn.
"""

from __future__ import annotations

import contextlib

import torch

from grpolab.batch import Rollout
from grpolab.model.cache import cache_of, left_pad, positions, with_cache
from grpolab.model.sampling import sample_token


class HFStepper:
    """The rollout's model steps on the model's own forward and its KV cache (any causal LM)."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache, self.attn = cache_of(out), mask
        return out.logits[:, -1]

    def repeat(self, G: int) -> None:
        self.cache.batch_repeat_interleave(G)
        self.attn = self.attn.repeat_interleave(G, 0)

    def keep(self, idx: torch.Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.attn = self.attn[idx]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Logits after one new token per row; valid (n,) bool False: that row's slot is a hole (a row
        waiting for the others to end their turn), which no later token attends to."""
        new = torch.ones_like(self.attn[:, :1]) if valid is None else valid[:, None].to(self.attn.dtype)
        self.attn = torch.cat([self.attn, new], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.attn, position_ids=pos[:, None],
                         use_cache=True, **with_cache(self.model, self.cache))
        self.cache = cache_of(out)
        return out.logits[:, -1]

    def extend(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append L tokens per row onto the cache (environment tokens between turns), left-padded:
        ids/mask/pos (n, L). Returns the logits after each row's last token (n, V)."""
        self.attn = torch.cat([self.attn, mask.to(self.attn.dtype)], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **with_cache(self.model, self.cache))
        self.cache = cache_of(out)
        return out.logits[:, -1]


def use_lean(decoder: str, dtype: torch.dtype | None, device: torch.device) -> bool:
    """Whether a rollout in `dtype` (None: fp32) on `device` runs the lean step, for the `decoder` setting:
    lean always; auto where it was measured faster than the HF forward: bf16 on a CPU (in fp32 its fused
    products gain nothing and it copies the weights per rollout, so there it was slower; on a GPU it is
    not yet measured); hf never. benchmarks/decode_step.py measures both; the figures are in
    docs/performance.md, "The lean decode step"."""
    return decoder == "lean" or (decoder == "auto" and dtype == torch.bfloat16 and device.type == "cpu")


def stepper_for(model, dtype: torch.dtype, max_new_tokens: int, lean: bool):
    """The lean step (grpolab.model.decoder) where the model is one it supports and `lean`, else HFStepper."""
    from grpolab.model import decoder

    w = decoder.weights_of(model, dtype) if lean else None
    return decoder.LeanStepper(w, max_new_tokens) if w is not None else HFStepper(model)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], *, G: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
             autocast_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
             eos_ids: set[int] | None = None, lean: bool = True) -> Rollout:
    """Sample G completions for each prompt (token ids, already chat-templated).

    lean: run the model through grpolab.model.decoder where it supports the model (Llama, Qwen2, Mistral),
    with its weights in `autocast_dtype` (else the model's own dtype); otherwise its HF forward."""
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = torch.tensor(sorted(eos_ids if eos_ids is not None else {tokenizer.eos_token_id}), dtype=torch.long, device=device)
    ids, mask = left_pad(prompt_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    # One autocast context around the whole decode: autocast caches the low-precision copy of each
    # weight only while its context is open, so entering it per forward call re-cast every weight at
    # every token, which cost bf16 most of its gain over fp32 (benchmarks/bench_cpu.py; measured in
    # docs/performance.md, "What the loop avoids").
    was_training = model.training
    model.eval()
    try:
        stepper = stepper_for(model, autocast_dtype or next(model.parameters()).dtype, max_new_tokens, lean)
        hf = isinstance(stepper, HFStepper)  # the lean step holds its weights in the compute dtype already
        amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype and hf else contextlib.nullcontext()
        with amp:
            return _decode(stepper, tokenizer, ids, mask, G, max_new_tokens, temperature, top_p, greedy, generator,
                           eos, pad_id)
    finally:
        model.train(was_training)


def _decode(stepper, tokenizer, ids, mask, G, max_new_tokens, temperature, top_p, greedy, generator, eos,
            pad_id) -> Rollout:
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
    for t in range(max_new_tokens):
        tok, lp = sample_token(logits, temperature, top_p, greedy, generator)
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
    texts = tokenizer.batch_decode([row[m.bool()].tolist() for row, m in zip(tokens.cpu(), cmask.cpu())],
                                   skip_special_tokens=True)
    return Rollout(
        prompt_ids=ids.repeat_interleave(G, 0).cpu(), prompt_mask=mask.repeat_interleave(G, 0).cpu(),
        completion_ids=tokens.cpu(), completion_mask=cmask.cpu(), sample_logp=lps.float().cpu(),
        truncated=(~finished).cpu(), texts=texts, G=G,
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
