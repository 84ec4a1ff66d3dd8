"""precision=auto's measured answers, remembered per machine and model shape in grpolab's cache.

Timing bf16 against fp32 on the policy (grpolab.model.precision.measure) takes seconds; its answer holds
for as long as the machine, torch, the model's shape and the run's rollout shape stay the same, so it is
written to `$GRPOLAB_CACHE/precision/<key>.json` (default `~/.cache/grpolab/precision`) and read by the
next run with the same key instead of measuring again. The key is a hash of everything the answer depends
on (`shape_key`): the host and its CPU (model name, torch's capability, oneDNN's bf16 check, the
variables that cap the instruction sets), torch's and grpolab's versions, the compute threads, the
model's architecture and size, the trainable parameters, the probe's rows and tokens, whether the update
is timed and which rollout probe. Delete the file (the run's line names it) to measure again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import torch

ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
CONFIG_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def folder() -> Path:
    """$GRPOLAB_CACHE/precision (grpolab.model.load.cache_dir)."""
    from grpolab.model.load import cache_dir

    return cache_dir() / "precision"


def _probe_name(probe) -> str:
    """A rollout probe as text: its function's qualified name and, for a functools.partial, its keywords."""
    if probe is None:
        return ""
    fn = getattr(probe, "func", probe)
    kw = getattr(probe, "keywords", {}) or {}
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return name + "".join(f" {k}={v!r}" for k, v in sorted(kw.items()))


def shape_key(model, facts, *, training: bool, rows: int, tokens: int, probe=None, engine_rollout=None) -> dict:
    """What a measured answer depends on, as a JSON-ready dict (its hash names the file). `facts`:
    grpolab.model.cpu_bf16.CpuFacts of this CPU."""
    from grpolab import __version__

    config = getattr(model, "config", None)
    return {
        "host": platform.node(),
        "cpu": facts.model,
        "arch": facts.arch,
        "capability": facts.capability,
        "onednn_bf16": facts.onednn_bf16,
        "isa_variables": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
        "torch": torch.__version__,
        "grpolab": __version__,
        "threads": torch.get_num_threads(),
        "model": {k: getattr(config, k, None) for k in CONFIG_FIELDS},
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "training": training,
        "rows": rows,
        "tokens": tokens,
        "rollout_probe": _probe_name(probe),
        "engine_rollout": None if engine_rollout is None else str(engine_rollout[0]),
    }


def path_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return folder() / f"{digest}.json"


def read(key: dict) -> tuple[dict, Path] | None:
    """(the remembered entry: {"key", "precision", "measured_at"}, its file), or None where there is none
    for this key or the file is unreadable (then the run measures again and rewrites it)."""
    path = path_for(key)
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(key, default=str)):
        return None
    return entry, path


def write(key: dict, precision_json: dict) -> Path | None:
    """Remember a measured answer (atomically); a cache that cannot be written costs nothing but the
    next run's measurement. Returns the file, or None where it was not written."""
    from grpolab.util.fileio import atomic_write

    path = path_for(key)
    entry = {"key": key, "precision": precision_json, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(entry, indent=2, default=str) + "\n")
    except OSError:
        return None
    return path


__all__ = ["folder", "path_for", "read", "shape_key", "write"]
