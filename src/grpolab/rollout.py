"""Rollout engine: G completions per prompt, with the token ids, masks, sampling log-probs and
truncation flags that the update needs.

The loop is ours, not `model.generate`, for three reasons that are each a speed-up or a number we keep:
1. the prompt is prefilled once per group and its KV cache repeated G times (a group shares its prompt);
2. a sequence that reached EOS leaves the batch, so no step decodes finished rows;
3. the log-prob of each sampled token under the sampling distribution is recorded as it is drawn.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Rollout:
    """A batch of N = B*G completions, grouped contiguously: [p0 s0..s(G-1), p1 s0.., ...]."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P) 1 = real token
    completion_ids: torch.Tensor  # (N, C) right-padded with pad_id
    completion_mask: torch.Tensor  # (N, C) float, 1 = generated token (EOS included)
    sample_logp: torch.Tensor  # (N, C) log-prob of each sampled token under the sampling distribution
    truncated: torch.Tensor  # (N,) bool: hit max_new_tokens without EOS
    texts: list[str]  # decoded completions (special tokens removed)
    G: int

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)  # (N,)

    def select(self, idx: torch.Tensor) -> "Rollout":
        """Rows `idx` (used by dynamic sampling to keep whole groups)."""
        il = idx.tolist()
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx],
                       self.completion_mask[idx], self.sample_logp[idx], self.truncated[idx],
                       [self.texts[i] for i in il], self.G)


def _pad_id_of(parts: list[Rollout]) -> int:
    """The padding id the rollouts already use: the id at any masked-out position (0 if there is none)."""
    for r in parts:
        for ids, mask in ((r.completion_ids, r.completion_mask), (r.prompt_ids, r.prompt_mask)):
            pad = ids[mask == 0]
            if pad.numel():
                return int(pad[0])
    return 0


def concat_rollouts(parts: list[Rollout], pad_id: int | None = None) -> Rollout:
    """Stack rollouts (padding prompts on the left and completions on the right to a common width).

    pad_id: the id written into new padding; by default the one the rollouts already pad with.
    """
    P = max(r.prompt_ids.shape[1] for r in parts)
    C = max(r.completion_ids.shape[1] for r in parts)

    def lpad(x, w, v):
        return F.pad(x, (w - x.shape[1], 0), value=v)

    def rpad(x, w, v):
        return F.pad(x, (0, w - x.shape[1]), value=v)

    if pad_id is None:
        pad_id = _pad_id_of(parts)
    return Rollout(
        torch.cat([lpad(r.prompt_ids, P, pad_id) for r in parts]),
        torch.cat([lpad(r.prompt_mask, P, 0) for r in parts]),
        torch.cat([rpad(r.completion_ids, C, pad_id) for r in parts]),
        torch.cat([rpad(r.completion_mask, C, 0) for r in parts]),
        torch.cat([rpad(r.sample_logp, C, 0) for r in parts]),
        torch.cat([r.truncated for r in parts]),
        [t for r in parts for t in r.texts],
        parts[0].G,
    )


def chat_prompts(tokenizer, prompts: list, system_prompt: str | None) -> list[list[int]]:
    """Token ids of each prompt wrapped in the model's chat template, ready for the assistant turn.

    A prompt is the user message (a string), or a list of chat messages ({"role", "content"}: system,
    user and assistant turns, as datasets give them); `system_prompt` goes first unless the list has
    its own system message. A bare tokenizer (no chat template) gets the text (the messages' contents
    joined by blank lines)."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": p}]
            text = p
        else:
            msgs = [{"role": m["role"], "content": m["content"]} for m in p]
            if system_prompt and not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": system_prompt})
            text = "\n\n".join(m["content"] for m in msgs)
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:  # a bare tokenizer: plain text prompt
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and mask, padded on the left."""
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, P - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, P - len(s):] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, greedy: bool,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. Returns (token (B,), log-prob of it under the sampling distribution (B,)).

    Sampling distribution: softmax(logits / T), restricted to the smallest set of tokens whose mass
    reaches top_p (nucleus), renormalised.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop = (cum - sorted_logp.exp()) >= top_p  # keep the token that crosses top_p
        sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
        logp = torch.log_softmax(logp, dim=-1)
    if greedy:
        tok = logp.argmax(-1)
    else:
        tok = inverse_cdf_sample(logp.exp(), generator)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


@functools.lru_cache(maxsize=None)
def _cache_arg(forward_owner: type) -> str:
    """Name of the KV-cache argument: `cache` in newer transformers (5.24 has it), `past_key_values` in older ones."""
    return "cache" if "cache" in inspect.signature(forward_owner.forward).parameters else "past_key_values"


def with_cache(module, cache) -> dict:
    """Keyword arguments passing a KV cache to `module` under the name its transformers version uses
    (a peft wrapper passes its keyword arguments through: the name is the wrapped model's)."""
    inner = module.get_base_model() if hasattr(module, "get_base_model") else module
    return {_cache_arg(type(inner)): cache}


def cache_of(out):
    """The KV cache a forward returned (`cache` or `past_key_values`, by transformers version)."""
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of `probs` (B, V): the first token whose cumulative mass exceeds u ~ U(0, total).

    Exact inverse-CDF sampling; a token of probability 0 can never be drawn (its CDF step is empty).
    About 10x faster than torch.multinomial over a 49k vocabulary on the CPU.
    """
    cdf = probs.cumsum(-1)  # (B, V)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(-1)  # (B,)


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

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.attn, position_ids=pos[:, None],
                         use_cache=True, **with_cache(self.model, self.cache))
        self.cache = cache_of(out)
        return out.logits[:, -1]


def use_lean(decoder: str, dtype: torch.dtype | None, device: torch.device) -> bool:
    """Whether a rollout in `dtype` (None: fp32) on `device` runs the lean step, for the `decoder` setting:
    lean always; auto where it was measured faster than the HF forward, bf16 on a CPU (2-core CPU,
    2026-12-01, benchmarks/decode_step.py: 58.5 vs 88.5 ms per token in bf16, but 146 vs 128 in fp32;
    not yet measured on a GPU); hf never."""
    return decoder == "lean" or (decoder == "auto" and dtype == torch.bfloat16 and device.type == "cpu")


def stepper_for(model, dtype: torch.dtype, max_new_tokens: int, lean: bool):
    """The lean step (grpolab.decoder) where the model is one it supports and `lean`, else HFStepper."""
    from grpolab import decoder

    w = decoder.weights_of(model, dtype) if lean else None
    return decoder.LeanStepper(w, max_new_tokens) if w is not None else HFStepper(model)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], *, G: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
             autocast_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
             eos_ids: set[int] | None = None, lean: bool = True) -> Rollout:
    """Sample G completions for each prompt (token ids, already chat-templated).

    lean: run the model through grpolab.decoder where it supports the model (Llama, Qwen2, Mistral),
    with its weights in `autocast_dtype` (else the model's own dtype); otherwise its HF forward."""
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = torch.tensor(sorted(eos_ids if eos_ids is not None else {tokenizer.eos_token_id}), dtype=torch.long, device=device)
    ids, mask = left_pad(prompt_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    # One autocast context around the whole decode: autocast caches the low-precision copy of each
    # weight only while its context is open, so entering it per forward call re-cast every weight at
    # every token (bf16 rollout x0.92 of fp32 that way, x0.70 with one context; docs/performance.md).
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
