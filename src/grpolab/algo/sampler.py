"""The sampler is not the trainer: importance weights that correct for the engine that sampled.

When an inference engine (vLLM) samples the rollouts, its token probabilities mu(y_t) differ from the
trainer's pi_old(y_t) for the same weights (other kernels, bf16, another attention). The update's
surrogate is an expectation under pi_old, but the tokens were drawn from mu; each token's loss term is
weighted by the (truncated) importance ratio

    r_t = pi_old(y_t) / mu(y_t) = exp(log pi_old(y_t) - log mu(y_t))

  token_truncate     w_t = min(r_t, C)                               (truncated IS, "TIS": Yao et al. 2025,
                                                                      "Your Efficient RL Framework Secretly
                                                                      Brings You Off-Policy RL Training";
                                                                      verl's default, C = 2)
  token_mask         w_t = r_t if r_t <= C else 0
  sequence_truncate  w_t = min(R_i, C),   R_i = prod_t r_it = exp(sum_t log r_it)
  sequence_mask      w_t = R_i if R_i <= C else 0                    (TRL 1.16's default, C = 3)
  none               w_t = 1

With a lower bound C_min (rollout.correction_clip_min; TRL 1.16's vllm_importance_sampling_clip_min) the
truncating modes clip from below too, w = clip(r, C_min, C), and the masking modes also zero a weight below
C_min: a token (or sequence) the trainer finds far less likely than the sampler did is dropped or bounded.

The weight is a constant (no gradient flows through it) and multiplies the policy term only, as TRL
does; the KL term to the reference is left as it is. The native engine samples from the trainer's own
weights and needs none.

Metrics (docs/metrics.md, "Sampler"): the mismatch KL(mu || pi_old) by the k3 estimator over the
sampled tokens, E_mu[r - 1 - log r] (>= 0, unbiased), the largest |log r|, the weights' mean and
maximum, and the share of tokens whose weight the clip changed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpolab.algo.kl import LR_CLAMP


def log_ratio(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """log r_t = log pi_old(y_t) - log mu(y_t) on valid tokens, 0 elsewhere, clamped to +-LR_CLAMP. (b, T)"""
    valid = mask > 0
    lr = torch.where(
        valid, trainer_logp.float() - sampler_logp.float(), torch.zeros_like(trainer_logp, dtype=torch.float32)
    )
    return lr.clamp(-LR_CLAMP, LR_CLAMP)


def _sequence_log_ratio(lr: Tensor, mask: Tensor) -> Tensor:
    """log R_i = sum_t m_it log r_it, broadcast over the tokens. (b, T)"""
    return lr.sum(-1, keepdim=True).clamp(-LR_CLAMP, LR_CLAMP).expand_as(lr)


def _outside(ratio: Tensor, clip: float, clip_min: float | None) -> Tensor:
    """(b, T) bool: r > C, or r < C_min where there is a lower bound."""
    return (ratio > clip) | (ratio < clip_min) if clip_min is not None else ratio > clip


def _truncate(ratio: Tensor, clip: float, clip_min: float | None) -> tuple[Tensor, Tensor]:
    return ratio.clamp(min=clip_min, max=clip), _outside(ratio, clip, clip_min)


def _mask(ratio: Tensor, clip: float, clip_min: float | None) -> tuple[Tensor, Tensor]:
    out = _outside(ratio, clip, clip_min)
    return torch.where(out, torch.zeros_like(ratio), ratio), out


def token_truncate(lr: Tensor, mask: Tensor, clip: float, clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """w_t = clip(r_t, C_min, C) (C_min None: min(r_t, C)). Returns (w (b, T), clipped (b, T) bool)."""
    return _truncate(lr.exp(), clip, clip_min)


def token_mask(lr: Tensor, mask: Tensor, clip: float, clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """w_t = r_t where C_min <= r_t <= C, else 0."""
    return _mask(lr.exp(), clip, clip_min)


def sequence_truncate(lr: Tensor, mask: Tensor, clip: float, clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """w_t = clip(R_i, C_min, C) for every token of sequence i."""
    return _truncate(_sequence_log_ratio(lr, mask).exp(), clip, clip_min)


def sequence_mask(lr: Tensor, mask: Tensor, clip: float, clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """w_t = R_i where C_min <= R_i <= C, else 0, for every token of sequence i."""
    return _mask(_sequence_log_ratio(lr, mask).exp(), clip, clip_min)


def no_correction(lr: Tensor, mask: Tensor, clip: float, clip_min: float | None = None) -> tuple[Tensor, Tensor]:
    """w_t = 1."""
    return torch.ones_like(lr), torch.zeros_like(lr, dtype=torch.bool)


CORRECTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "token_truncate": token_truncate,
    "token_mask": token_mask,
    "sequence_truncate": sequence_truncate,
    "sequence_mask": sequence_mask,
    "none": no_correction,
}
"""rollout.correction -> fn(log r (b,T), mask (b,T), C, C_min) -> (weights (b,T), clipped (b,T))."""


def correction_weights(
    trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, mode: str, clip: float, clip_min: float | None = None
) -> tuple[Tensor, Tensor]:
    """(w (b, T) detached, 0 on padding; clipped (b, T) bool) of the `mode` correction (module docstring)."""
    lr = log_ratio(trainer_logp.detach(), sampler_logp, mask)
    w, clipped = CORRECTIONS[mode](lr, mask, clip, clip_min)
    valid = mask > 0
    return torch.where(valid, w, torch.zeros_like(w)), clipped & valid


@torch.no_grad()
def mismatch_metrics(
    trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, weights: Tensor, clipped: Tensor
) -> dict[str, float]:
    """sampler/* metrics over the valid tokens (module docstring); {} when there is none."""
    valid = mask > 0
    n = int(valid.sum())
    if n == 0:
        return {}
    lr = log_ratio(trainer_logp, sampler_logp, mask)[valid]  # (n,)
    w = weights[valid]
    return {
        "sampler/mismatch_kl": float((lr.exp() - 1.0 - lr).mean()),
        "sampler/logp_diff_max": float(lr.abs().max()),
        "sampler/is_mean": float(w.mean()),
        "sampler/is_max": float(w.max()),
        "sampler/is_clipped_frac": float(clipped[valid].float().mean()),
    }


__all__ = ["CORRECTIONS", "correction_weights", "log_ratio", "mismatch_metrics"]
