"""KL divergence to the frozen reference policy: per-token estimators and beta control.

Where the KL goes: `in_loss` adds beta * k_t to the per-token loss (grpolab.algo.losses.policy_loss);
`in_reward` subtracts it from the reward before the advantages (grpolab.algo.shaping.kl_token_penalty).

Estimators (Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).
With tokens sampled from pi_theta and the log-ratio lr = log pi_ref(y_t) - log pi_theta(y_t):

    k1 = -lr                  unbiased for KL(pi_theta || pi_ref), high variance, can be negative
    k2 = lr^2 / 2             biased (exact only to second order), low variance, >= 0
    k3 = exp(lr) - lr - 1     unbiased (E[exp(lr)] = 1), low variance, >= 0 (since e^x >= 1 + x)

GRPO (Shao et al. 2024, eq. 4) uses k3 in the loss. The exponent is clamped to [-LR_CLAMP, LR_CLAMP]
before exp, so a token the reference finds very unlikely (lr -> +inf) cannot overflow to inf/NaN;
the clamp only acts where |lr| > 20, i.e. probability ratios beyond e^20 ~ 5e8.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

LR_CLAMP = 20.0
"""|log pi_ref - log pi_theta| is clamped to this before exp in k3: e^20 ~ 4.9e8 is finite in fp32 and
bf16 (not in fp16, max 65504: compute the KL on fp32 log-probs)."""


def _reference_log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return ref_logp - logp  # (b, T) lr = log pi_ref - log pi_theta


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = -lr = log pi_theta - log pi_ref. Unbiased; its gradient is grad log pi_theta, whose
    expectation under pi_theta is 0 -- as a loss term it does not pull towards the reference on
    average (use it in the reward, as PPO-RLHF does)."""
    return -_reference_log_ratio(logp, ref_logp)  # (b, T)


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = lr^2 / 2. Biased as a value (it matches KL only to second order in lr), always >= 0.
    As a loss its gradient is (log pi_theta - log pi_ref) grad log pi_theta, whose expectation under
    pi_theta is exactly grad KL(pi_theta || pi_ref)."""
    lr = _reference_log_ratio(logp, ref_logp)  # (b, T)
    return 0.5 * lr * lr  # (b, T)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(lr) - lr - 1 with lr clamped to [-LR_CLAMP, LR_CLAMP] (GRPO's KL term, eq. 4).
    Unbiased for KL(pi_theta || pi_ref) under samples from pi_theta because E[exp(lr)] = 1, and
    >= 0 pointwise because e^x >= 1 + x. (As a loss, its on-policy expected gradient is
    (1 - pi_ref/pi_theta) grad log pi_theta -> grad KL(pi_ref || pi_theta): it still pulls towards
    the reference, through the other KL direction.)"""
    lr = _reference_log_ratio(logp, ref_logp).clamp(-LR_CLAMP, LR_CLAMP)  # (b, T)
    return torch.exp(lr) - lr - 1.0  # (b, T)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
"""name -> fn(logp (b,T), ref_logp (b,T)) -> per-token KL estimate (b,T). Padding is not masked here."""


def kl_per_token(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str) -> Tensor:
    """KL_ESTIMATORS[estimator] with padding set to exactly 0 (whatever garbage the padding held)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; known: {', '.join(sorted(KL_ESTIMATORS))}")
    valid = mask > 0  # (b, T)
    logp = torch.where(valid, logp, torch.zeros_like(logp))  # (b, T)
    ref_logp = torch.where(valid, ref_logp, torch.zeros_like(ref_logp))  # (b, T)
    k = KL_ESTIMATORS[estimator](logp, ref_logp)  # (b, T)
    return torch.where(valid, k, torch.zeros_like(k))  # (b, T)


class AdaptiveKL:
    """Fixed or adaptive KL coefficient beta.

    Adaptive: the proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from
    Human Preferences", sec. 2.2), as in lm-human-preferences and TRL:

        e      = clip(KL_current / KL_target - 1, -0.2, 0.2)
        beta  <- beta * (1 + e * n_steps / horizon)

    so beta grows when the policy drifts further than the target and shrinks when it stays closer.
    With target None, beta stays fixed and update() just returns it.
    """

    def __init__(self, beta: float, target: float | None = None, horizon: int = 10000):
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self.value = float(beta)
        self.target = target
        self.horizon = int(horizon)

    @classmethod
    def from_algo(cls, algo) -> AdaptiveKL:
        """From an AlgoConfig: adaptive iff algo.adaptive_kl."""
        return cls(algo.beta, algo.kl_target if algo.adaptive_kl else None, algo.kl_horizon)

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    def update(self, current_kl: float, n_steps: int = 1) -> float:
        """Feed the measured KL of the last batch (same units as target); returns the new beta."""
        if self.target is not None:
            error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target, self.horizon = float(state["value"]), state["target"], int(state["horizon"])


__all__ = ["AdaptiveKL", "KL_ESTIMATORS", "LR_CLAMP", "kl_per_token"]
