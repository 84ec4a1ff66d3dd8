"""Token masks of the policy term: which tokens' policy loss counts, beyond the completion mask.

Each is a detached (b, T) float tensor of 0s and 1s that multiplies the per-token policy loss l_it (not the
KL term, and not the normalisers: a masked token still counts in n_tok and |y_i|, as in TRL 1.16's
GRPOTrainer._compute_loss). grpolab.algo.losses.policy_loss applies the product of those an AlgoConfig
turns on (`policy_masks`):

    top_entropy_quantile < 1   high_entropy_mask    Wang et al. 2025, "Beyond the 80/20 Rule"
    off_policy_mask = delta    off_policy_mask      DeepSeek-AI 2025, DeepSeek-V3.2, eq. 9

Both are computed from the pass at hand (the current log-probs and entropies), micro-batch by micro-batch,
as TRL computes them in each call of its loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # the settings type only
    from grpolab.algo.presets import AlgoConfig


@torch.no_grad()
def high_entropy_mask(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """The top-rho entropy tokens (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens
    Drive Effective Reinforcement Learning for LLM Reasoning", arXiv 2506.01939):

        tau = quantile_{1 - rho}( {H_it : m_it = 1} ),     M_it = 1[H_it >= tau] m_it

    the quantile over the valid tokens passed in (linear interpolation, torch.quantile; TRL 1.16's
    get_high_entropy_mask over a micro-batch). rho = 1 keeps every token; rho = 0 the highest-entropy ones.
    No valid token: all 0. Returns (b, T) float."""
    valid = mask > 0  # (b, T)
    h = entropy.detach().float()  # (b, T)
    if not bool(valid.any()):
        return torch.zeros_like(h)
    tau = torch.quantile(h[valid], 1.0 - rho)  # ()
    return ((h >= tau) & valid).float()  # (b, T)


@torch.no_grad()
def off_policy_mask(adv: Tensor, logp: Tensor, sampler_logp: Tensor, mask: Tensor, delta: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv 2512.02556, eq. 9),
    as TRL 1.16's GRPOTrainer.get_off_policy_mask:

        KL_i = (1 / |y_i|) sum_t m_it ( log pi_sampler(y_it) - log pi_theta(y_it) )
        M_it = 0  if A_it < 0 and KL_i > delta,   else 1

    pi_sampler the policy that sampled (the engine's log-probs where it is not the trainer, else log pi_old);
    pi_theta the current policy, detached. A bad sequence that the policy has already moved far from teaches
    it little and destabilises it; a good one is always kept. NaN sampler log-probs count 0. Returns (b, T)
    float."""
    valid = mask > 0  # (b, T)
    diff = (sampler_logp.float() - logp.detach().float()).nan_to_num(nan=0.0)  # (b, T)
    diff = torch.where(valid, diff, torch.zeros_like(diff))
    kl = diff.sum(dim=1, keepdim=True) / valid.sum(dim=1, keepdim=True).clamp(min=1)  # (b, 1)
    keep = (adv >= 0) | (kl <= delta)  # (b, T) with adv (b, T)
    return keep.float()  # (b, T)


def _entropy_mask(algo: AlgoConfig, entropy, mask, **_) -> Tensor | None:
    if algo.top_entropy_quantile >= 1.0:
        return None
    if entropy is None:
        raise ValueError("algo.top_entropy_quantile < 1 needs the policy's entropy (entropy=...)")
    return high_entropy_mask(entropy, mask, algo.top_entropy_quantile)


def _off_policy(algo: AlgoConfig, adv, logp, sampler_logp, mask, **_) -> Tensor | None:
    if algo.off_policy_mask is None:
        return None
    return off_policy_mask(adv, logp, sampler_logp, mask, algo.off_policy_mask)


POLICY_MASKS: dict[str, Callable[..., Tensor | None]] = {"entropy": _entropy_mask, "off_policy": _off_policy}
"""name -> fn(algo, *, adv, logp, sampler_logp, mask, entropy) -> (b, T) mask, or None where algo leaves it off."""


def policy_masks(algo: AlgoConfig, **tensors) -> dict[str, Tensor]:
    """The masks algo turns on, by name (POLICY_MASKS): {} for a run that uses none. The "entropy" mask also
    restricts the entropy bonus and the adaptive entropy's measurement (TRL's effective_mask)."""
    out = {name: fn(algo, **tensors) for name, fn in POLICY_MASKS.items()}
    return {k: v for k, v in out.items() if v is not None}


__all__ = ["POLICY_MASKS", "high_entropy_mask", "off_policy_mask", "policy_masks"]
