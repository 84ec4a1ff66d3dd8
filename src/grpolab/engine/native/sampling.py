"""Drawing one token per row from the sampling distribution, with its log-prob.

The sampling distribution is built from the model's logits z in the order of transformers' `generate`
(GenerationMixin._get_logits_processor: the repetition penalty is a logits processor, then the warpers
temperature, top-k, top-p, min-p), which TRL's GRPOTrainer samples with when it does not use vLLM:

    z'   = repetition_penalty(z, seen)          (Keskar et al. 2019, CTRL, sec. 4.1)
    q    = softmax(z' / T)
    q    restricted to the top_k largest, then to the nucleus of mass top_p, then to the tokens with
         q_v >= min_p * max_u q_u, renormalised after each step.

Each filter is off at its neutral value (repetition_penalty 1, top_k 0 or -1, top_p 1, min_p 0): with
all of them off the distribution is softmax(z / T), the policy's own (`is_plain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Filters:
    """The sampling filters beyond temperature and top-p (each off at its default)."""

    top_k: int = 0
    """Keep the top_k most likely tokens; 0 or -1: off (TRL's and vLLM's conventions)."""
    min_p: float = 0.0
    """Keep the tokens whose probability is at least min_p times the largest one; 0: off."""
    repetition_penalty: float = 1.0
    """Penalty > 1 on every token already in the sequence (prompt and completion so far); 1: off."""

    @property
    def penalised(self) -> bool:
        """True when the repetition penalty changes the logits (the rollout then tracks seen tokens)."""
        return self.repetition_penalty != 1.0


PLAIN = Filters()


def is_plain(top_p: float, filters: Filters = PLAIN) -> bool:
    """True when the sampling distribution is softmax(z / T) itself: no filter changes it, so the
    sampled token's log-prob is the policy's."""
    return top_p >= 1.0 and filters.top_k <= 0 and filters.min_p <= 0.0 and not filters.penalised


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, sec. 4.1) as transformers'
    RepetitionPenaltyLogitsProcessor computes it, for every token v already in the row's sequence:

        z'_v = z_v / penalty   if z_v > 0
        z'_v = z_v * penalty   if z_v <= 0

    (the token gets less likely for penalty > 1 whatever the sign of its logit); other tokens keep z_v.
    logits (B, V), seen (B, V) bool."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)  # (B, V)
    return torch.where(seen, penalised, logits)  # (B, V)


def top_k_filter(logp: torch.Tensor, top_k: int) -> torch.Tensor:
    """transformers' TopKLogitsWarper: -inf for every token below the k-th largest value (ties with it
    are kept). logp (B, V) -> (B, V), not renormalised."""
    k = min(top_k, logp.shape[-1])
    kth = torch.topk(logp, k, dim=-1).values[..., -1:]  # (B, 1)
    return logp.masked_fill(logp < kth, float("-inf"))


def top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus (Holtzman et al. 2020): keep the smallest set of most likely tokens whose mass reaches
    top_p (the token that crosses top_p is kept). logp (B, V) normalised -> (B, V), not renormalised."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    p = sorted_logp.exp()
    drop = (p.cumsum(-1) - p) >= top_p  # the mass before this token already reaches top_p
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    return torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)


def min_p_filter(logp: torch.Tensor, min_p: float) -> torch.Tensor:
    """transformers' MinPLogitsWarper (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling"): drop
    every token with q_v < min_p * max_u q_u; the most likely token always stays. logp (B, V) normalised
    -> (B, V), not renormalised. The test is a ratio, so it does not depend on the normalisation."""
    top = logp.amax(-1, keepdim=True)  # (B, 1)
    return logp.masked_fill(logp < top + torch.log(torch.tensor(min_p, dtype=logp.dtype)), float("-inf"))


def sampling_logp(
    logits: torch.Tensor, temperature: float, top_p: float, filters: Filters = PLAIN, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """log q (B, V) of the sampling distribution (module docstring); -inf where a filter removed a token."""
    z = logits.float()
    if filters.penalised:
        if seen is None:
            raise ValueError("repetition_penalty needs the tokens seen so far (seen, (B, V) bool)")
        z = apply_repetition_penalty(z, seen, filters.repetition_penalty)
    logp = torch.log_softmax(z / temperature, dim=-1)  # (B, V)
    if filters.top_k > 0:
        logp = torch.log_softmax(top_k_filter(logp, filters.top_k), dim=-1)
    if top_p < 1.0:
        logp = torch.log_softmax(top_p_filter(logp, top_p), dim=-1)
    if filters.min_p > 0.0:
        logp = torch.log_softmax(min_p_filter(logp, filters.min_p), dim=-1)
    return logp


def sample_token(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
    filters: Filters = PLAIN,
    seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. Returns (token (B,), log-prob of it under the sampling distribution (B,)).

    Sampling distribution: `sampling_logp` (the repetition penalty needs `seen` (B, V) bool: the tokens
    of each row's sequence so far). greedy: its argmax (the penalty still applies, as in transformers).
    With no filter (`is_plain`) on fp32 CPU logits, grpolab.engine.native.kernels' sampler draws the same
    token from the same uniform number in one pass over the logits (its sums in another float order).
    """
    if is_plain(top_p, filters) and logits.dtype == torch.float32 and logits.device.type == "cpu":
        from grpolab.engine.native import kernels

        fused = kernels.sample()
        drawn = fused(logits, temperature, greedy, generator) if fused is not None else None
        if drawn is not None:
            return drawn
    logp = sampling_logp(logits, temperature, top_p, filters, seen)
    if greedy:
        tok = logp.argmax(-1)
    else:
        tok = inverse_cdf_sample(logp.exp(), generator)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V) bool: which tokens each row of ids (B, L) holds at its valid positions (mask (B, L))."""
    seen = torch.zeros((ids.shape[0], vocab), dtype=torch.bool, device=ids.device)
    valid = mask.bool()
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)
    seen[rows[valid], ids[valid]] = True
    return seen


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of `probs` (B, V): the first token whose cumulative mass exceeds u ~ U(0, total).

    Exact inverse-CDF sampling; a token of probability 0 can never be drawn (its CDF step is empty).
    Faster than torch.multinomial over a large vocabulary on the CPU (benchmarks/bench_cpu.py; measured
    in docs/performance.md, "What the loop avoids").
    """
    cdf = probs.cumsum(-1)  # (B, V)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(-1)  # (B,)
