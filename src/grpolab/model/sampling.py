"""Drawing one token per row from the sampling distribution (temperature, nucleus), with its log-prob.
"""

from __future__ import annotations

import torch


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


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of `probs` (B, V): the first token whose cumulative mass exceeds u ~ U(0, total).

    Exact inverse-CDF sampling; a token of probability 0 can never be drawn (its CDF step is empty).
    Faster than torch.multinomial over a large vocabulary on the CPU (benchmarks/bench_cpu.py; measured
    in docs/performance.md, "What the loop avoids").
    """
    cdf = probs.cumsum(-1)  # (B, V)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(-1)  # (B,)


