"""Learning-rate schedules: a multiplier of the peak learning rate for each optimizer update (pure
functions; grpolab.model.optim.build_scheduler wraps them in torch's LambdaLR)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from grpolab.util.fields import ConfigError

# --- the learning-rate schedule: a multiplier of the peak learning rate for each optimizer update --------
#
# update i (0-based) runs with lr * factor(i), W warm-up updates, N updates in the run:
#
#     warmup_constant        min(1, (i + 1) / W)                                  grpolab's own: update 0 learns
#     constant               1                                                    transformers' get_scheduler names
#     constant_with_warmup   i / W for i < W, then 1                              (transformers.optimization, the
#     linear                 i / W for i < W, then max(0, (N - i) / (N - W))       _get_*_lr_lambda functions;
#     cosine                 i / W for i < W, then 0.5 (1 + cos(pi p)),           TRL's lr_scheduler_type)
#                            p = (i - W) / (N - W)
#
# W and N of a run: grpolab.training.options.lr_updates.


def warmup_constant(i: int, warmup: int, total: int) -> float:
    """grpolab's schedule: min(1, (i + 1) / W), then constant; the first update runs at lr / W, not 0."""
    return min(1.0, (i + 1) / warmup) if warmup > 0 else 1.0


def constant(i: int, warmup: int, total: int) -> float:
    """transformers' "constant": 1 at every update, no warm-up."""
    return 1.0


def constant_with_warmup(i: int, warmup: int, total: int) -> float:
    """transformers' "constant_with_warmup": i / max(1, W) for i < W, then 1."""
    return i / max(1.0, warmup) if i < warmup else 1.0


def linear(i: int, warmup: int, total: int) -> float:
    """transformers' "linear": i / W for i < W, then max(0, (N - i) / max(1, N - W))."""
    if i < warmup:
        return i / max(1, warmup)
    return max(0.0, (total - i) / max(1, total - warmup))


def cosine(i: int, warmup: int, total: int) -> float:
    """transformers' "cosine" (half a cycle): i / W for i < W, then max(0, 0.5 (1 + cos(pi p))),
    p = (i - W) / max(1, N - W)."""
    if i < warmup:
        return i / max(1, warmup)
    progress = (i - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


LrScheduler = Literal["warmup_constant", "constant", "constant_with_warmup", "linear", "cosine"]
"""The `lr_scheduler` setting: one name of SCHEDULES (tests/test_config_types.py holds the two equal)."""

SCHEDULES: dict[LrScheduler, Callable[[int, int, int], float]] = {
    "warmup_constant": warmup_constant,
    "constant": constant,
    "constant_with_warmup": constant_with_warmup,
    "linear": linear,
    "cosine": cosine,
}
"""lr_scheduler name -> factor(i, warmup W, total N)."""


def check_scheduler(name: str) -> None:
    """ConfigError (exit 2) for a schedule that does not exist (for callers of build_scheduler; a config's
    lr_scheduler is checked against its type, LrScheduler)."""
    if name not in SCHEDULES:
        raise ConfigError(f"lr_scheduler: unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
