"""AdamW as grpolab builds it, for the policy and for a critic, and its learning-rate schedules.

theta <- theta - lr * (m_hat / (sqrt(v_hat) + eps) + wd * theta), with m, v the bias-corrected first and
second moments (torch.optim.AdamW). grpolab asks for torch's fused implementation, one kernel over all
parameters per step, wherever it applies (parameters on a CPU or a CUDA device, not FSDP-sharded):
one pass over the weights instead of a sequence of per-operation kernels over lists of tensors, which
on a CPU is several times faster than torch's default (foreach) implementation (docs/performance.md,
"The update on a CPU"). The two compute the same update in another
float order (about 2e-7 apart after 3 steps, tests/test_optim.py).
"""

from __future__ import annotations

from functools import partial

import torch


def adamw(
    params, *, lr: float, betas: tuple[float, float], weight_decay: float, sharded: bool = False
) -> torch.optim.AdamW:
    """torch.optim.AdamW over `params`, fused where it applies (see the module docstring)."""
    params = list(params)
    fused = (
        not sharded and bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    )
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


# the schedules themselves are pure functions: grpolab.algo.schedules
from grpolab.algo.schedules import SCHEDULES, check_scheduler, schedule_options  # noqa: E402,F401


def build_scheduler(
    optimizer: torch.optim.Optimizer, name: str, *, warmup: int, total: int, options: dict | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR with factor(i) = SCHEDULES[name](i, warmup, total, **options) (options: transformers'
    lr_scheduler_kwargs, read against the optimizer's lr as get_scheduler reads them); it steps once per
    optimizer update made."""
    opts = schedule_options(name, options, optimizer.defaults["lr"])
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(SCHEDULES[name], warmup=warmup, total=total, **opts))
