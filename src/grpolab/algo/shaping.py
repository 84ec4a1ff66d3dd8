"""Reward shaping: every change made to the verifier's reward before the advantages, in one place.

    r_raw   (N,)    the verifiers' weighted total                           (grpolab.rewards)
    keep    (B,)    DAPO dynamic sampling: only groups whose rewards differ  informative_groups
    r       (N,)    r_raw + overlong penalty - beta * sum_t k_t              shape_rewards
    r_tok   (N, C)  terminal r on the last token - beta * k_t per token      (for a critic: GAE)

The raw reward is never overwritten: the step keeps r_raw and r side by side (samples.jsonl writes
both), so what the verifier said and what the optimiser saw can always be compared.
The dynamic-sampling filter runs while the batch is collected (it decides whether to sample more
prompts); the other shapings run once on the collected batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from grpolab.algo.kl import kl_per_token


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.float()


def informative_groups(r: Tensor, G: int) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, sec. 3.2, eq. 11): keep prompt groups with
    0 < #correct < G, i.e. whose G rewards are not all equal. A group of equal rewards has A = 0 for
    every member under any group baseline, so it adds no gradient while still diluting the token mean.

    Returns keep (B,) bool; the sample mask is keep.repeat_interleave(G). With G = 1 every group is
    "all equal", so nothing is kept. 1 - keep.mean() is the `groups/zero_std_frac` metric.
    """
    if G < 1 or r.dim() != 1 or r.numel() % G != 0:
        raise ValueError(f"rewards of shape {tuple(r.shape)} cannot be split into groups of G={G}")
    rg = _float(r).view(-1, G)  # (B, G)
    return rg.amax(dim=1) > rg.amin(dim=1)  # (B,)


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (sec. 3.4, eq. 13), with L_max = max_len and L_cache = buffer:

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max

    times `penalty` (DAPO: 1). Added to the verifier's reward. Returns (N,) float, <= 0.
    buffer = 0 turns it off; a buffer longer than max_len is a ValueError (it would punish every
    completion, however short). DAPO: L_max = 20480, L_cache = 4096 (20% of the limit).
    """
    lengths = _float(lengths)  # (N,)
    buffer, max_len = int(buffer), int(max_len)
    if buffer > max_len:
        raise ValueError(
            f"overlong buffer ({buffer} tokens) is longer than max_len ({max_len}): every completion would be punished"
        )
    if buffer <= 0 or penalty == 0:
        return torch.zeros_like(lengths)  # (N,)
    expected = max_len - buffer  # L_max - L_cache
    ramp = (expected - lengths) / buffer  # (N,) in [-1, 0) inside the buffer
    out = torch.where(lengths <= expected, torch.zeros_like(lengths), ramp.clamp(min=-1.0))  # (N,)
    return out * penalty  # (N,)


def kl_token_penalty(
    policy_logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float, estimator: str
) -> tuple[Tensor, Tensor]:
    """KL in the reward (Ziegler et al. 2019, eq. 2; Ouyang et al. 2022; the RLOO paper):

        pen_t = beta * k_t      on every completion token, k_t = KL_ESTIMATORS[estimator]
        r    <- r - sum_t pen_t  (the sequence KL is the sum of the token KLs)

    policy_logp: log pi_theta of the sampled tokens before the update (the rollout's own log-probs
    when it sampled at top_p = 1), ref_logp: log pi_ref; (N, C) each, detached.
    Returns (pen (N, C), k (N, C)), both 0 on padding; k is kept for the `kl` metric.
    """
    with torch.no_grad():
        k = kl_per_token(policy_logp.float(), ref_logp.float(), mask, estimator)  # (N, C)
        return beta * k, k


def terminal_rewards(r: Tensor, mask: Tensor) -> Tensor:
    """Sequence reward r_i on the last valid token of completion i, 0 elsewhere: (N,) -> (N, C).

    The last valid token is the last position where mask > 0: with multi-turn trajectories the mask
    has holes (environment tokens), and the reward goes on the model's last token. An empty completion
    gets no reward token (it has no token to credit). This is how a per-token estimator (GAE) sees one
    final reward.
    """
    mask = mask.float()
    has = mask.sum(dim=1) > 0  # (N,)
    last = ((mask > 0) * torch.arange(1, mask.shape[1] + 1, device=mask.device)).amax(dim=1) - 1  # (N,)
    out = torch.zeros_like(mask)  # (N, C)
    rows = torch.nonzero(has).squeeze(1)  # (N',)
    out[rows, last[rows]] = r.to(out.dtype)[rows]
    return out  # (N, C)


@dataclass
class Shaped:
    """The shaped rewards of one batch and what shaping measured."""

    reward: Tensor  # (N,) r_raw + overlong - beta * sum_t k_t
    token_reward: Tensor  # (N, C) terminal(r_raw + overlong) - beta * k_t
    metrics: dict[str, float] = field(default_factory=dict)


def shape_rewards(
    raw: Tensor,
    lengths: Tensor,
    mask: Tensor,
    algo,
    *,
    max_len: int,
    beta: float,
    policy_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
) -> Shaped:
    """All reward shaping of one batch: overlong penalty (algo.overlong_buffer > 0) and KL in the
    reward (algo.kl_in_reward and a reference, i.e. ref_logp given).

    raw (N,), lengths (N,), mask (N, C). Metrics: reward/overlong_penalty_mean (when on), kl (mean
    k_t over valid tokens, when the KL is in the reward).
    """
    r = _float(raw)  # (N,)
    metrics: dict[str, float] = {}
    if algo.overlong_buffer > 0:
        pen = overlong_penalty(lengths, max_len, algo.overlong_buffer, algo.overlong_penalty)  # (N,)
        r = r + pen
        metrics["reward/overlong_penalty_mean"] = float(pen.mean())
    token_reward = terminal_rewards(r, mask)  # (N, C)
    if algo.kl_in_reward and ref_logp is not None:
        if policy_logp is None:
            raise ValueError("KL in the reward needs the policy's log-probs of the sampled tokens")
        pen_tok, k = kl_token_penalty(policy_logp, ref_logp, mask, beta, algo.kl_estimator)  # (N, C) each
        r = r - pen_tok.sum(-1)  # (N,)
        token_reward = token_reward - pen_tok  # (N, C)
        metrics["kl"] = float(k.sum() / mask.sum())
    return Shaped(r, token_reward, metrics)


__all__ = ["Shaped", "informative_groups", "kl_token_penalty", "overlong_penalty", "shape_rewards", "terminal_rewards"]
