"""Advantage estimators: how much better than expected was each completion?

Every estimator is a baseline b subtracted from the reward. The policy-gradient theorem
(Williams 1992) gives

    grad J = E_y[ R(y) grad log pi(y) ] = E_y[ (R(y) - b) grad log pi(y) ]     if b does not depend on y,

because E_y[grad log pi(y)] = sum_y grad pi(y) = grad 1 = 0. The baseline changes the variance of the
Monte-Carlo estimate, never its expectation -- as long as it is independent of the sample it is
subtracted from. tests/test_unbiased.py checks this numerically (on grpolab.app.lab.bandit), including the one estimator here that
is *not* exactly unbiased (batch_mean, whose mean includes the sample itself).

Layout: N = B * G rewards, grouped contiguously: [prompt0 sample0..G-1, prompt1 sample0..G-1, ...].
All functions are pure and work on any float dtype; integer rewards are promoted to float32.

Reward-side changes (DAPO's dynamic-sampling filter and overlong punishment, KL in the reward) live in
grpolab.algo.shaping. Per-token GAE advantages for PPO live in grpolab.model.critic (they need a value model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # the settings type only
    from grpolab.algo.presets import AlgoConfig


def _float(r: Tensor) -> Tensor:
    return r if r.is_floating_point() else r.float()


def _groups(r: Tensor, G: int) -> Tensor:
    """(N,) -> (B, G); N must be a multiple of G."""
    if G < 1 or r.dim() != 1 or r.numel() % G != 0:
        raise ValueError(f"rewards of shape {tuple(r.shape)} cannot be split into groups of G={G}")
    return _float(r).view(-1, G)  # (B, G)


# --- estimators: (r (N,), G, eps) -> adv (N,) ---------------------------------------------------------


def adv_none(r: Tensor, G: int, eps: float) -> Tensor:
    """REINFORCE without a baseline (Williams 1992): A_i = r_i.

    Unbiased, highest variance: every sample pushes its own log-prob up in proportion to r, even when
    all rewards are equal.
    """
    return _float(r).clone()  # (N,)


def adv_batch_mean(r: Tensor, G: int, eps: float) -> Tensor:
    """Batch-mean baseline: A_i = r_i - (1/N) sum_j r_j.

    Not exactly unbiased: r_i is part of the mean, so for i.i.d. samples
    E[A_i grad log pi(y_i)] = (1 - 1/N) grad J (the term r_i / N correlates with y_i). The bias is a
    shrink factor, not a change of direction, and vanishes as N grows; rloo is the unbiased version.
    """
    r = _float(r)
    return r - r.mean()  # (N,)


def adv_rloo(r: Tensor, G: int, eps: float) -> Tensor:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"):

        A_i = r_i - 1/(G-1) sum_{j != i, same group} r_j  =  G/(G-1) * (r_i - mean_G r).

    Unbiased: the baseline uses only the other samples of the group, independent of y_i.
    G = 1 has no other sample, hence no baseline and no signal: A = 0 (never NaN).
    """
    rg = _groups(r, G)  # (B, G)
    if G == 1:
        return torch.zeros_like(rg).view(-1)  # (N,)
    others = (rg.sum(dim=1, keepdim=True) - rg) / (G - 1)  # (B, G) mean of the other G-1
    return (rg - others).view(-1)  # (N,)


def adv_group_mean(r: Tensor, G: int, eps: float) -> Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_G r.

    The group mean is the baseline. It includes r_i itself, which scales the expected gradient by
    (1 - 1/G) per group (exactly like batch_mean within the group); G = 1 gives A = 0.
    """
    rg = _groups(r, G)  # (B, G)
    return (rg - rg.mean(dim=1, keepdim=True)).view(-1)  # (N,)


def group_std(r: Tensor, G: int) -> Tensor:
    """Population std of each group's rewards, broadcast back to (N,) (correction 0, so G = 1 gives 0)."""
    rg = _groups(r, G)  # (B, G)
    return rg.std(dim=1, correction=0, keepdim=True).expand_as(rg).reshape(-1)  # (N,)


def adv_group_zscore(r: Tensor, G: int, eps: float) -> Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 / sec. 4.1.2): A_i = (r_i - mean_G r) / (std_G r + eps).

    std is the population std (correction 0): it is defined for G = 1, where r - mean = 0 and the
    advantage is 0 / eps = 0 -- no signal, no NaN. (TRL and verl use the Bessel-corrected std, which
    scales every advantage by sqrt((G-1)/G); the direction of the update is the same.)
    A group whose rewards are all equal gets A = 0 for every member.
    """
    return adv_group_mean(r, G, eps) / (group_std(r, G) + eps)  # (N,)


def adv_group_zscore_unbiased(r: Tensor, G: int, eps: float) -> Tensor:
    """GRPO as TRL computes it (trl/trainer/grpo_trainer.py, scale_rewards="group", its default):

        A_i = (r_i - mean_G r) / (std_G r + eps),   std_G with Bessel's correction: sqrt(sum (r - mean)^2 / (G - 1)).

    It is group_zscore times about sqrt(G / (G-1)). G = 1 has no Bessel std (TRL requires G >= 2): the
    advantage is then 0, as group_zscore's.
    """
    rg = _groups(r, G)  # (B, G)
    if G < 2:
        return torch.zeros_like(rg).view(-1)  # (N,)
    std = rg.std(dim=1, correction=1, keepdim=True).expand_as(rg).reshape(-1)  # (N,)
    return adv_group_mean(r, G, eps) / (std + eps)  # (N,)


ADVANTAGES: dict[str, Callable[[Tensor, int, float], Tensor]] = {
    "none": adv_none,
    "batch_mean": adv_batch_mean,
    "rloo": adv_rloo,
    "group_mean": adv_group_mean,
    "group_zscore": adv_group_zscore,
    "group_zscore_unbiased": adv_group_zscore_unbiased,
}
"""Sequence-level estimators: name -> fn(r (N,), G, eps) -> adv (N,). "gae" is grpolab.algo.gae.gae."""


# --- scales: (adv (N,), r (N,), G, eps) -> adv (N,) -----------------------------------------------------


def scale_none(adv: Tensor, r: Tensor, G: int, eps: float) -> Tensor:
    """No scaling."""
    return adv


def scale_group_std(adv: Tensor, r: Tensor, G: int, eps: float) -> Tensor:
    """Divide by the group's reward std: adv / (std_G r + eps). group_mean + group_std = group_zscore."""
    return adv / (group_std(r, G) + eps)  # (N,)


def scale_batch_std(adv: Tensor, r: Tensor, G: int, eps: float) -> Tensor:
    """Divide by the reward std of the whole batch: adv / (std_N r + eps).

    Group mean with batch std is the "Lite PPO" normalisation of Liu et al. 2025 ("Tricks or Traps?"):
    it keeps GRPO's scale invariance without up-weighting near-unanimous groups the way a per-group
    std does. Population std (correction 0).
    """
    r = _float(r)
    return adv / (r.std(correction=0) + eps)  # (N,)


def scale_batch_std_unbiased(adv: Tensor, r: Tensor, G: int, eps: float) -> Tensor:
    """Divide by the Bessel-corrected reward std of the whole batch, adv / (std_N r + eps), std_N =
    sqrt(sum (r - mean_N r)^2 / (N - 1)): TRL's scale_rewards="batch" (trl/trainer/grpo_trainer.py) with
    the group-mean advantage. One completion: no std, adv / eps."""
    r = _float(r)
    std = r.std(correction=1) if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
    return adv / (std + eps)  # (N,)


ADV_SCALES: dict[str, Callable[[Tensor, Tensor, int, float], Tensor]] = {
    "none": scale_none,
    "group_std": scale_group_std,
    "batch_std": scale_batch_std,
    "batch_std_unbiased": scale_batch_std_unbiased,
}


# --- several reward functions: (r (N, K), w (K,), G, eps) -> r (N,) ---------------------------------------


def sum_then_normalize(r: Tensor, w: Tensor, G: int, eps: float) -> Tensor:
    """One reward from K functions: the weighted sum r_i = sum_k w_k r_ik (NaN terms count 0, as TRL's nansum;
    a row whose every term is NaN stays NaN). The advantage estimator then normalises that sum."""
    r = _float(r)  # (N, K)
    total = (r.nan_to_num(nan=0.0) * w.to(r)).sum(dim=1)  # (N,)
    return torch.where(r.isnan().all(dim=1), torch.full_like(total, float("nan")), total)  # (N,)


def normalize_then_sum(r: Tensor, w: Tensor, G: int, eps: float) -> Tensor:
    """GDPO (Group reward-Decoupled normalization Policy Optimization, arXiv 2601.05242), as TRL 1.16
    computes it (GRPOTrainer._generate_and_score_completions, multi_objective_aggregation "normalize_then_sum"):
    each function's reward is z-scored within its group before the weighted sum,

        r~_ik = (r_ik - mean_G r_k) / (std_G r_k + eps),     r_i = sum_k w_k r~_ik,

    std with Bessel's correction, NaN terms left out of the group statistics (nanmean / nanstd) and of the
    sum. Summing raw rewards first lets a reward with a large spread drown the others; normalised, each
    function moves the advantage by its weight. TRL then normalises r over the whole batch: advantage
    batch_mean with adv_scale batch_std_unbiased. G = 1: every r~ is 0."""
    r = _float(r)  # (N, K)
    N, K = r.shape
    rg = r.view(-1, G, K)  # (B, G, K)
    mean = rg.nanmean(dim=1, keepdim=True)  # (B, 1, K)
    valid = (~rg.isnan()).sum(dim=1, keepdim=True)  # (B, 1, K)
    sq = ((rg - mean) ** 2).nan_to_num(nan=0.0).sum(dim=1, keepdim=True)  # (B, 1, K)
    std = (sq / (valid - 1).clamp(min=1)).sqrt() if G > 1 else torch.zeros_like(mean)  # (B, 1, K) Bessel
    z = ((rg - mean) / (std + eps)).view(N, K)  # (N, K)
    return sum_then_normalize(z, w, G, eps)  # (N,)


REWARD_AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int, float], Tensor]] = {
    "sum_then_normalize": sum_then_normalize,
    "normalize_then_sum": normalize_then_sum,
}
"""algo.reward_aggregation -> fn(per-function rewards (N, K), weights (K,), G, eps) -> one reward (N,)."""


def compute_advantages(r: Tensor, G: int, algo: AlgoConfig) -> Tensor:
    """Sequence advantages for rewards r (N,) in groups of G: ADVANTAGES[algo.advantage], then
    ADV_SCALES[algo.adv_scale]. Returns (N,) float, no grad (rewards carry none).

    advantage "gae" is per token and needs a value model: use grpolab.algo.gae.ppo_advantages.
    """
    if algo.advantage == "gae":
        raise ValueError("advantage 'gae' is per-token and needs a critic: use grpolab.algo.gae.ppo_advantages")
    if algo.advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage {algo.advantage!r}; known: {', '.join(sorted(ADVANTAGES))}")
    r = _float(r).detach()  # (N,)
    _groups(r, G)  # shape check for every estimator, batch-level ones included
    adv = ADVANTAGES[algo.advantage](r, G, algo.adv_eps)  # (N,)
    return ADV_SCALES[algo.adv_scale](adv, r, G, algo.adv_eps)  # (N,)


def per_token(adv: Tensor, shape: tuple[int, int]) -> Tensor:
    """Advantages as the objective multiplies them, (N, C): a sequence advantage (N,) repeated over its
    tokens (a view, no copy), a per-token one (N, C) as it is."""
    return adv if adv.dim() == 2 else adv[:, None].expand(*shape)  # (N, C)


__all__ = ["ADVANTAGES", "ADV_SCALES", "REWARD_AGGREGATIONS", "compute_advantages", "group_std", "per_token"]
