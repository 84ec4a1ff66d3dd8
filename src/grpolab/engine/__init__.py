"""Rollout engines (layer 5, beside env/): what samples a step's completions, behind one seam.

- `base`         the seam: RolloutEngine (generate, generate_turns, sync, close), Sampling, TurnLimits.
- `native`       grpolab's own decode loop on the policy, its lean decode step and C kernel (a package).
- `vllm_engine`  vLLM in this process; weights synced after every optimizer step (the `vllm` extra).
- `settings`     the recipe's rollout.* keys (RolloutConfig).
- `kv_cache`     the size of an engine's KV cache for a run (vLLM on a CPU).

ENGINES maps each `rollout.engine` name to its builder; `choose` resolves `auto` and says why;
`rollout_precision` gives precision=auto's rollout dtype of an engine with its own kernels, `rollout_probe` the
native engine's timing of a rollout for it. This is the
only place that tells engines apart by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpolab.engine.settings import EngineError, RolloutConfig

if TYPE_CHECKING:  # importing the settings (grpolab.Config) must not import torch
    import torch
    from torch import nn

    from grpolab.engine.base import RolloutEngine


@dataclass
class EngineContext:
    """What an engine is built from."""

    settings: RolloutConfig
    policy: nn.Module
    tokenizer: object
    model_path: Path
    device: torch.device
    dtype: torch.dtype | None  # the rollout's compute dtype (grpolab.model.precision), None = fp32
    decoder: str  # the `decoder` setting of the native engine
    eos_ids: set[int]
    max_model_len: int | None  # the longest sequence a rollout holds (None: the model's own limit)
    seed: int
    kv_tokens: int = 0  # the most tokens one generate call holds at once (sequences x length), for KV sizing


def _native(ctx: EngineContext) -> RolloutEngine:
    from grpolab.engine.native.engine import NativeEngine

    return NativeEngine(
        ctx.policy, ctx.tokenizer, device=ctx.device, dtype=ctx.dtype, decoder=ctx.decoder, eos_ids=ctx.eos_ids
    )


def _vllm(ctx: EngineContext) -> RolloutEngine:
    from grpolab.engine.vllm_engine import VllmEngine

    return VllmEngine(
        ctx.settings,
        model_path=ctx.model_path,
        tokenizer=ctx.tokenizer,
        device=ctx.device,
        dtype=ctx.dtype,
        eos_ids=ctx.eos_ids,
        max_model_len=ctx.max_model_len,
        seed=ctx.seed,
        kv_tokens=ctx.kv_tokens,
    )


ENGINES: dict[str, Callable[[EngineContext], RolloutEngine]] = {"native": _native, "vllm": _vllm}

# vLLM's CPU attention kernels take these head sizes only (vllm.v1.attention.backends.cpu_attn).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# auto on a CPU stays native: there vLLM's CPU build writes about the native engine's tokens/s, after a long
# compiled start-up, while holding its own weights beside the update (docs/performance.md, "Rollout engines";
# the figures: docs/results.md).
CPU_AUTO = "native"


def head_size(model_path: Path) -> int | None:
    """The attention head size of the model in `model_path` (config.json), None if it cannot be read."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return None


def vllm_unusable(model_path: Path, device: torch.device) -> str | None:
    """Why vLLM cannot serve this run (None: it can)."""
    from grpolab.engine.vllm_engine import missing_reason

    hs = head_size(model_path)
    if device.type == "cpu" and hs not in CPU_HEAD_SIZES:
        return (
            f"vLLM's CPU attention does not take this model's head size ({hs}; it takes "
            f"{', '.join(map(str, CPU_HEAD_SIZES))})"
        )
    return missing_reason()


def choose(settings: RolloutConfig, *, model_path: Path, device: torch.device, distributed: bool) -> tuple[str, str]:
    """(engine name, why): on a CPU auto is native, on a GPU vLLM where it can serve the model; under
    torchrun auto is native, and rollout.engine=vllm runs vLLM in every process (grpolab.engine.vllm_engine.
    launch_options)."""
    if settings.engine == "native":
        return "native", "rollout.engine=native"
    unusable = vllm_unusable(model_path, device)
    if settings.engine == "vllm":
        if unusable:
            raise EngineError(f"rollout.engine=vllm: {unusable}")
        return "vllm", "rollout.engine=vllm"
    if distributed:
        return "native", (
            "rollout.engine=auto: native under torchrun; rollout.engine=vllm runs vLLM in every process "
            "(rollout.vllm_tensor_parallel_size: one vLLM sharded over that many processes)"
        )
    if unusable:
        return "native", f"rollout.engine=auto: {unusable.split('; ')[0]}"
    if device.type == "cpu":
        return CPU_AUTO, (
            "rollout.engine=auto: native on a CPU (vLLM is no faster there: docs/performance.md, "
            '"Rollout engines"); rollout.engine=vllm to use it'
        )
    return "vllm", "rollout.engine=auto: vLLM is installed and supports the model, on a GPU"


def rollout_precision(name: str) -> tuple[torch.dtype | None, str] | None:
    """precision=auto's rollout dtype and why for engine `name`, or None where grpolab's own decoder
    samples (grpolab.model.precision then times it on the policy)."""
    if name == "native":
        return None
    from grpolab.engine.vllm_engine import auto_dtype

    return auto_dtype()


def rollout_probe(name: str, decoder: str) -> Callable[..., float] | None:
    """precision=auto's timing of one rollout for engine `name` (grpolab.model.precision.RolloutProbe):
    the native decode loop's own steppers for the `decoder` setting; None for an engine with its own rule
    (rollout_precision)."""
    if name != "native":
        return None
    from functools import partial

    from grpolab.engine.native.probe import decode_seconds

    return partial(decode_seconds, decoder=decoder)


def build_engine(name: str, ctx: EngineContext) -> RolloutEngine:
    """The engine `name` (a key of ENGINES) for this run."""
    return ENGINES[name](ctx)


__all__ = [
    "ENGINES",
    "EngineContext",
    "EngineError",
    "RolloutConfig",
    "build_engine",
    "choose",
    "head_size",
    "rollout_precision",
    "rollout_probe",
    "vllm_unusable",
]
