"""The entropy bonus and its adaptive coefficient.

    loss = policy loss - c * H,     H the mean per-token entropy of the policy over the tokens the bonus reads

c fixed (algo.entropy_coef; TRL 1.16's entropy_coef), or moved each optimizer update by AdaptiveEntropy
(Skywork-OR1's adaptive entropy control; TRL's use_adaptive_entropy). H_it = -sum_v pi(v) log pi(v) at each
completion position (grpolab.model.logprobs), with its gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def entropy_bonus(entropy: Tensor, mask: Tensor, n_tok: int, coef: float, keep: Tensor | None = None) -> Tensor:
    """The entropy bonus of a micro-batch (subtracted from the loss), its share of the optimizer batch's:

        coef * sum_it m_it H_it / n_tok                                    (keep None: every valid token)
        coef * [ sum_it m_it k_it H_it / sum_it m_it k_it ] * sum_it m_it / n_tok   (keep: a token mask k)

    n_tok the optimizer batch's valid tokens, so micro-batches add up to coef times the batch's mean entropy
    (TRL 1.16, GRPOConfig.entropy_coef: the mean per-token entropy whatever the aggregation). With a keep mask
    (top_entropy_quantile: TRL's effective_mask) the mean is over the kept tokens of the micro-batch, weighted
    by its share of the batch's tokens: with one micro-batch exactly TRL's mean over the kept tokens."""
    h = torch.where(mask > 0, entropy, torch.zeros_like(entropy))  # (b, T)
    n_tok = max(int(n_tok), 1)
    if keep is None:
        return coef * h.sum() / n_tok
    kept = (mask > 0).to(h.dtype) * keep  # (b, T)
    return coef * (h * kept).sum() / kept.sum().clamp(min=1) * (mask > 0).sum() / n_tok


class AdaptiveEntropy:
    """Adaptive entropy control of Skywork-OR1 (He et al. 2025, "Skywork Open Reasoner 1 Technical Report",
    arXiv 2505.22312, "Adaptive Entropy Control"), as TRL 1.16 computes it (GRPOTrainer._compute_loss, use_adaptive_entropy):

        applied c_k = c_k  if H_{k-1} <= H_target  else 0
        c_{k+1}     = min(c_k + delta, c_max)  if H_k <= H_target  else  max(c_k - delta, c_min)

    H_k the mean token entropy measured over the tokens of optimizer update k (`update`); H_0 = +inf, so the
    first update applies no bonus. The bonus switches on only once the entropy has fallen to the target and
    grows while it stays there; above the target the coefficient decays and is not applied. Saved in each
    checkpoint (state_dict) so that a resumed run continues the same coefficient."""

    def __init__(self, coef: float, coef_min: float, coef_max: float, delta: float, target: float):
        self.coef, self.coef_min, self.coef_max = float(coef), float(coef_min), float(coef_max)
        self.delta, self.target = float(delta), float(target)
        self.last_entropy = math.inf

    @classmethod
    def from_algo(cls, algo) -> AdaptiveEntropy:
        return cls(algo.entropy_coef, algo.entropy_coef_min, algo.entropy_coef_max, algo.entropy_coef_delta,
                   algo.entropy_target)  # fmt: skip

    @property
    def applied(self) -> float:
        """The coefficient the next update's loss uses."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> float:
        """After an optimizer update whose tokens had mean entropy `entropy`: the next coefficient."""
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = float(entropy)
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])


__all__ = ["AdaptiveEntropy", "entropy_bonus"]
