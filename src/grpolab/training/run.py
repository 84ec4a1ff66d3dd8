"""What one training run holds: the models, their optimiser, the task and the verifiers.

Built by grpolab.training.trainer.setup; read by every stage of grpolab.training.step. It is the only state a step
touches, and everything in it that changes during training is saved by the checkpoint.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from grpolab.training.config import Config


@dataclass
class Run:
    """One training (or evaluation) run."""

    cfg: Config
    out: Path
    device: torch.device
    amp_dtype: torch.dtype | None
    """Autocast dtype of the scoring passes (update, reference, critic), None for plain fp32 (grpolab.model.precision)."""
    tokenizer: Any
    policy: Any
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    task: Any
    reward_fns: list
    eos_ids: set[int]
    advantage: Any
    """The advantage component: grpolab.algo.advantages.GroupBaseline, or grpolab.model.critic.Critic for PPO.
    Both offer targets, add_loss, step, trained_params and state_dict."""
    kl: Any
    """grpolab.algo.kl.AdaptiveKL: the current beta (fixed unless algo.adaptive_kl)."""
    ref: Any | None = None
    """The reference pi_ref (grpolab.model.reference: a frozen copy, or under LoRA the policy with its adapter
    off; `with ref.model() as m:` gives the network), or None when beta = 0 (no KL term, no reference pass)."""
    log: Callable[[str], None] = print
    components: dict[str, Any] = field(default_factory=dict)
    """Stateful parts besides the policy (e.g. {"critic": Critic}), saved as NAME.pt in each checkpoint."""
    dist: Any = None
    """grpolab.parallel.distributed.Dist: this process's rank and the world size (None: one process)."""
    precision: Any = None
    """grpolab.model.precision.Precision: the autocast dtype of each phase and why (None: fp32 everywhere)."""
    nonfinite_streak: int = 0
    """Optimizer updates skipped in a row for a non-finite loss or gradient norm (reset by a good one)."""

    def autocast(self):
        """The autocast context of the model passes (a no-op in fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def rollout_dtype(self) -> torch.dtype | None:
        """Autocast dtype of the rollout (generation), None for fp32."""
        return self.precision.rollout if self.precision is not None else self.amp_dtype

    def trained_params(self) -> int:
        """Parameters with gradients: the policy's and the advantage component's (a critic's)."""
        own = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        return own + self.advantage.trained_params()


def step_rng(seed: int, step: int, device: torch.device, rank: int = 0) -> tuple[random.Random, torch.Generator]:
    """Per-step generators derived from (seed, step): a resumed run draws exactly what it would have.

    The python generator (prompts) is the same on every data-parallel rank: each rank draws the global
    step's prompts and keeps its slice. The torch generator (sampling) lives on `device` and differs per
    rank (rank 0 is the single-process stream); it is made once per step, so every rollout call of the
    step (DAPO's refill rounds included) continues its stream instead of restarting it.
    """
    s = (seed * 1_000_003 + step) % (2**63)
    g = torch.Generator(device=device)
    g.manual_seed((s + rank * 0x9E3779B97F4A7C15) % (2**63))
    return random.Random(s), g


__all__ = ["Run", "step_rng"]
