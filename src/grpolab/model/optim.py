"""AdamW as grpolab builds it, for the policy and for a critic, and its learning-rate schedules.

theta <- theta - lr * (m_hat / (sqrt(v_hat) + eps) + wd * theta), with m, v the bias-corrected first and
second moments (torch.optim.AdamW). grpolab asks for torch's fused implementation, one kernel over all
parameters per step, wherever it applies (parameters on a CPU or a CUDA device, not FSDP-sharded):
one pass over the weights instead of a sequence of per-operation kernels over lists of tensors, which
on a CPU is several times faster than torch's default (foreach) implementation (benchmarks/cpu_kernels.py;
measured in docs/performance.md, "The update on a CPU"). The two compute the same update in another
float order (about 2e-7 apart after 3 steps, tests/test_optim.py).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch

from grpolab.util.fields import ConfigError


def adamw(params, *, lr: float, betas: tuple[float, float], weight_decay: float,
          sharded: bool = False) -> torch.optim.AdamW:
    """torch.optim.AdamW over `params`, fused where it applies (see the module docstring)."""
    params = list(params)
    fused = not sharded and bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                                 for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)


IMPLEMENTATION_KEYS = ("fused", "foreach")  # how a step is computed, not what it computes


def load_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """optimizer.load_state_dict(state), keeping this optimizer's own implementation (fused or not):
    torch would take it from the saved param groups, so a checkpoint written by the other one (an
    older foreach run, a sharded run) would switch it. The moments and step counts load as saved."""
    own = [{k: g[k] for k in IMPLEMENTATION_KEYS if k in g} for g in getattr(optimizer, "param_groups", [])]
    optimizer.load_state_dict(state)  # (a loader without param_groups, FSDP's, only loads)
    for group, keep in zip(getattr(optimizer, "param_groups", []), own):  # the new groups load_state_dict made
        group.update(keep)


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
# W and N of a run: grpolab.training.config.lr_updates.


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


SCHEDULES: dict[str, Callable[[int, int, int], float]] = {
    "warmup_constant": warmup_constant,
    "constant": constant,
    "constant_with_warmup": constant_with_warmup,
    "linear": linear,
    "cosine": cosine,
}
"""lr_scheduler name -> factor(i, warmup W, total N)."""


def check_scheduler(name: str) -> None:
    """ConfigError (exit 2) for a schedule that does not exist."""
    if name not in SCHEDULES:
        raise ConfigError(f"lr_scheduler: unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


def build_scheduler(optimizer: torch.optim.Optimizer, name: str, *, warmup: int,
                    total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR with factor(i) = SCHEDULES[name](i, warmup, total); it steps once per optimizer update made."""
    check_scheduler(name)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(SCHEDULES[name], warmup=warmup, total=total))
