"""Algorithm settings: which advantage estimator, objective, aggregation and KL each method uses.

The trainer reads only an `AlgoConfig`; presets (`ALGOS["grpo"]`, ...) fill it in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgoConfig:
    """Settings of the policy-gradient method (the `algo.*` keys of a recipe)."""

    name: str = "grpo"
    """Preset name: grpo (more presets are added by the algorithm-family work)."""
    advantage: str = "group_zscore"
    """Advantage estimator: group_zscore (GRPO: (r - mean_G r) / (std_G r + eps))."""
    objective: str = "clipped"
    """Policy objective: clipped (PPO/GRPO surrogate)."""
    aggregation: str = "seq_mean"
    """How per-token losses become one number: seq_mean (GRPO paper) or token_mean (DAPO)."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 - eps_low."""
    eps_high: float = 0.2
    """Upper clip range: the ratio is clipped at 1 + eps_high (DAPO clip-higher uses 0.28)."""
    beta: float = 0.0
    """Weight of the KL penalty to the frozen reference; 0 keeps no reference model at all."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: k3 = exp(lr) - lr - 1 with lr = log pi_ref - log pi_theta."""
    mu: int = 1
    """Inner policy updates per rollout batch (mu in the GRPO paper); >1 needs old log-probs."""
    adv_eps: float = 1e-4
    """eps in the group z-score denominator, guards against std = 0."""


ALGOS: dict[str, dict] = {
    "grpo": {},
}
