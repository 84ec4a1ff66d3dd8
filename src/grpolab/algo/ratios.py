"""The pieces every policy objective shares: the importance log-ratio on valid tokens, the sequence's
geometric-mean ratio, the clip of a ratio and which bound acted, and the masked mean of a metric.

    log rho_it = logp_it - old_logp_it   (0 on padding, clamped to +-LR_CLAMP before any exp)

Padding positions may hold anything (0, -inf, NaN): they are replaced with torch.where, never multiplied
by the mask, so they cannot leak NaN (grpolab.algo.losses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from grpolab.algo.kl import LR_CLAMP

if TYPE_CHECKING:  # the settings type only; grpolab.algo.presets imports no registry, nor this module
    from grpolab.algo.presets import AlgoConfig


def _where_valid(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))  # (b, T)


@torch.no_grad()
def masked_mean(x: Tensor, mask: Tensor) -> float:
    """(1 / max(sum m, 1)) * sum m_t x_t over valid positions, as a float: the mean every metric uses."""
    valid = mask > 0
    count = max(int(valid.sum().item()), 1)
    return float(torch.where(valid, x.float(), torch.zeros_like(x, dtype=torch.float32)).sum().item() / count)


def _importance_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log rho = logp - old_logp on valid tokens, 0 on padding, clamped to +-LR_CLAMP."""
    lr = _where_valid(logp, mask) - _where_valid(old_logp, mask)  # (b, T)
    return lr.clamp(-LR_CLAMP, LR_CLAMP)  # (b, T)


def clip_ratio(ratio: Tensor, adv: Tensor | None, algo: AlgoConfig) -> tuple[Tensor, Tensor, Tensor]:
    """The ratio clipped to [1 - eps_low, 1 + eps_high], and the tokens whose term a bound changed:

        clip(rho, 1 - eps_low, 1 + eps_high)
        clip_low = A < 0 and rho < 1 - eps_low,     clip_high = A > 0 and rho > 1 + eps_high

    For the clipped surrogate (PPO, Schulman et al. 2017, eq. 7; DAPO's clip-higher, Yu et al. 2025,
    eq. 10) these are the tokens where min(rho A, clip(rho) A) is the clipped term, which has no gradient.
    adv None: CISPO's weight sg(clip(rho)) (Chen et al. 2025, eq. 4), truncated whatever the sign of A:
    clip_low = rho < 1 - eps_low, clip_high = rho > 1 + eps_high. The objectives, their metrics and the
    report's clip codes all read the decision here. Returns (clipped rho, clip_low, clip_high), shaped as rho.
    """
    low, high = ratio < 1.0 - algo.eps_low, ratio > 1.0 + algo.eps_high
    if adv is not None:
        low, high = low & (adv < 0), high & (adv > 0)
    return ratio.clamp(1.0 - algo.eps_low, 1.0 + algo.eps_high), low, high


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO's log s_i = (1/|y_i|) sum_t m_it log rho_it (b,), clamped to +-LR_CLAMP: the log of the sequence's
    geometric-mean ratio (Zheng et al. 2025, eq. 7)."""
    length = mask.sum(dim=1).clamp(min=1)  # (b,) |y_i|
    return (_where_valid(log_ratio, mask).sum(dim=1) / length).clamp(-LR_CLAMP, LR_CLAMP)  # (b,)


__all__ = ["clip_ratio", "masked_mean", "sequence_log_ratio"]
