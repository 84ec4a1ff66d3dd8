"""Learning-rate schedules: a multiplier of the peak learning rate for each optimizer update (pure
functions; grpolab.model.optim.build_scheduler wraps them in torch's LambdaLR)."""

from __future__ import annotations

import inspect
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
#     cosine_with_restarts, polynomial, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr,
#     warmup_stable_decay    below, with their options (transformers' lr_scheduler_kwargs)
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


def cosine(i: int, warmup: int, total: int, num_cycles: float = 0.5) -> float:
    """transformers' "cosine": i / W for i < W, then max(0, 0.5 (1 + cos(2 pi c p))),
    p = (i - W) / max(1, N - W), c = num_cycles (0.5: half a cycle, down to 0 at the end)."""
    if i < warmup:
        return i / max(1, warmup)
    progress = (i - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def cosine_with_restarts(i: int, warmup: int, total: int, num_cycles: int = 1) -> float:
    """transformers' "cosine_with_restarts" (hard restarts): i / W for i < W; 0 once p >= 1; else
    max(0, 0.5 (1 + cos(pi ((c p) mod 1)))), p = (i - W) / max(1, N - W), c = num_cycles."""
    if i < warmup:
        return i / max(1, warmup)
    progress = (i - warmup) / max(1, total - warmup)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def polynomial(
    i: int, warmup: int, total: int, lr_end: float = 1e-7, power: float = 1.0, lr_init: float = 1.0
) -> float:
    """transformers' "polynomial": i / W for i < W; lr_end / lr_init past N; else
    ((lr_init - lr_end) (1 - p)^power + lr_end) / lr_init, p = (i - W) / (N - W) (lr_init: the peak lr)."""
    if i < warmup:
        return i / max(1, warmup)
    if i > total:
        return lr_end / lr_init
    remaining = 1 - (i - warmup) / (total - warmup)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def inverse_sqrt(i: int, warmup: int, total: int, timescale: int | None = None) -> float:
    """transformers' "inverse_sqrt": i / W for i < W, then 1 / sqrt((i + T - W) / T), T = timescale
    (None: W, or 10,000 without warm-up); N is not read."""
    if i < warmup:
        return i / max(1, warmup)
    t = timescale if timescale is not None else (warmup or 10_000)
    return 1.0 / math.sqrt((i + t - warmup) / t)


def cosine_with_min_lr(i: int, warmup: int, total: int, num_cycles: float = 0.5, min_lr_rate: float = 0.0) -> float:
    """transformers' "cosine_with_min_lr": i / W for i < W, then max(0, f (1 - m) + m),
    f = 0.5 (1 + cos(2 pi c p)), m = min_lr_rate (min_lr / lr when given as min_lr)."""
    if i < warmup:
        return i / max(1, warmup)
    progress = (i - warmup) / max(1, total - warmup)
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


def cosine_warmup_with_min_lr(
    i: int,
    warmup: int,
    total: int,
    num_cycles: float = 0.5,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    """transformers' "cosine_warmup_with_min_lr": warm-up (i + 1) / W (or w + (1 - w) i / max(1, W - 1),
    w = warmup_lr_rate), then max(0, f (1 - m) + m), f = 0.5 (1 + cos(2 pi c p)),
    p = (i - W + 1) / max(1, N - W): the first update after warm-up already decays."""
    if i < warmup:
        if warmup_lr_rate is None:
            return (i + 1.0) / max(1.0, warmup)
        return warmup_lr_rate + (1.0 - warmup_lr_rate) * i / max(1, warmup - 1)
    progress = (i - warmup + 1.0) / max(1.0, total - warmup)
    factor = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


WSD_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: p,
    "cosine": lambda p: 0.5 * (1.0 - math.cos(math.pi * p)),
    "1-sqrt": lambda p: 1.0 - math.sqrt(1.0 - p),
}
"""warmup_stable_decay's warm-up shapes: progress p in [0, 1] -> factor (the decay runs them backwards)."""


def warmup_stable_decay(
    i: int,
    warmup: int,
    total: int,
    num_decay_steps: int = 0,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """transformers' "warmup_stable_decay": W warm-up updates (warmup_type's shape from min_lr_ratio m to 1),
    S stable ones at 1 (None: N - W - D), D = num_decay_steps decaying to m (linear 1 - p, cosine
    0.5 (1 + cos(2 pi c p)), 1-sqrt 1 - sqrt(p)), then m: each shape f is scaled f (1 - m) + m."""
    m = min_lr_ratio
    stable = total - warmup - num_decay_steps if num_stable_steps is None else num_stable_steps
    if i < warmup:
        return max(0.0, WSD_SHAPES[warmup_type](i / max(1, warmup)) * (1.0 - m) + m)
    if i < warmup + stable:
        return 1.0
    if i < warmup + stable + num_decay_steps:
        p = (i - warmup - stable) / max(1, num_decay_steps)
        decay = {
            "linear": 1.0 - p,
            "cosine": 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * p)),
            "1-sqrt": 1.0 - math.sqrt(p),
        }[decay_type]
        return max(0.0, decay * (1.0 - m) + m)
    return m


LrScheduler = Literal[
    "warmup_constant",
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
]
"""The `lr_scheduler` setting: one name of SCHEDULES (tests/test_config_types.py holds the two equal)."""

SCHEDULES: dict[LrScheduler, Callable[..., float]] = {
    "warmup_constant": warmup_constant,
    "constant": constant,
    "constant_with_warmup": constant_with_warmup,
    "linear": linear,
    "cosine": cosine,
    "cosine_with_restarts": cosine_with_restarts,
    "polynomial": polynomial,
    "inverse_sqrt": inverse_sqrt,
    "cosine_with_min_lr": cosine_with_min_lr,
    "cosine_warmup_with_min_lr": cosine_warmup_with_min_lr,
    "warmup_stable_decay": warmup_stable_decay,
}
"""lr_scheduler name -> factor(i, warmup W, total N, **options); the options are transformers'
lr_scheduler_kwargs (schedule_options)."""


def options_of(name: str) -> list[str]:
    """The options (keyword arguments after i, W, N) a schedule takes, as lr_scheduler_kwargs names them
    (min_lr beside min_lr_rate; polynomial's lr_init is the peak lr itself, not an option)."""
    params = list(inspect.signature(SCHEDULES[name]).parameters)[3:]  # type: ignore[index]
    out = [p for p in params if p != "lr_init"]
    return out + (["min_lr"] if "min_lr_rate" in out else [])


def schedule_options(name: str, kwargs: dict | None, lr: float) -> dict:
    """lr_scheduler_kwargs -> the schedule's options, as transformers' get_scheduler reads them:
    min_lr becomes min_lr_rate = min_lr / lr; cosine_with_min_lr and cosine_warmup_with_min_lr need one of
    the two; polynomial gets lr_init = lr (and lr_end < lr); warmup_stable_decay needs num_decay_steps.
    ConfigError (exit 2) naming the key otherwise."""
    check_scheduler(name)
    given = dict(kwargs or {})
    known = options_of(name)
    for key in given:
        if key not in known:
            raise ConfigError(
                f"lr_scheduler_kwargs.{key}: not an option of the {name} schedule "
                f"({', '.join(known) if known else 'it takes none'})"
            )
    if "min_lr_rate" in known:
        if given.get("min_lr") is not None and given.get("min_lr_rate") is not None:
            raise ConfigError("lr_scheduler_kwargs: give min_lr or min_lr_rate, not both")
        if given.get("min_lr") is not None:
            given["min_lr_rate"] = float(given.pop("min_lr")) / lr
        given.pop("min_lr", None)
        if given.get("min_lr_rate") is None:
            raise ConfigError(
                f"lr_scheduler_kwargs: the {name} schedule needs min_lr or min_lr_rate "
                f"(e.g. lr_scheduler_kwargs.min_lr_rate=0.1)"
            )
    if name == "polynomial":
        given["lr_init"] = lr
        if not lr > given.get("lr_end", 1e-7):
            raise ConfigError(f"lr_scheduler_kwargs.lr_end={given.get('lr_end', 1e-7)}: must be below the lr ({lr})")
    if name == "warmup_stable_decay":
        if "num_decay_steps" not in given:
            raise ConfigError("lr_scheduler_kwargs.num_decay_steps: the warmup_stable_decay schedule needs it")
        for key in ("warmup_type", "decay_type"):
            if given.get(key, "linear") not in WSD_SHAPES:
                raise ConfigError(f"lr_scheduler_kwargs.{key}={given[key]!r}: one of {', '.join(WSD_SHAPES)}")
    return given


def check_scheduler(name: str) -> None:
    """ConfigError (exit 2) for a schedule that does not exist (for callers of build_scheduler; a config's
    lr_scheduler is checked against its type, LrScheduler)."""
    if name not in SCHEDULES:
        raise ConfigError(f"lr_scheduler: unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
