"""Rows of grpolab.training.config.validate for settings checked against each other: the evaluation's, and
torch.compile's. Each is (ok, key, message); the cfg is a grpolab.training.config.Config (not imported: config
imports this module)."""

from __future__ import annotations

import re

COMPILE_WITH_CHECKPOINTING = (
    "compile=true with grad_checkpointing=true: grpolab's per-layer checkpointing restores each layer's KV-cache "
    "slot from Python when the backward replays the layer, a mutation torch.compile cannot trace inside the "
    "checkpoint (dynamo: mutating a variable from outside the scope of this HOP), so the layers would run eager; "
    "set grad_checkpointing=false (TRL: gradient_checkpointing=False) to compile them"
)


def eval_checks(cfg) -> list[tuple[bool, str, str]]:
    """The evaluation settings' checks, as (ok, key, message) rows of validate()."""
    metric = cfg.save_best or "eval/accuracy"
    m = re.fullmatch(r"eval/(accuracy|reward|pass@(\d+))", metric)
    n = max(1, cfg.eval_num_generations)
    return [
        (cfg.eval_steps >= 0, "eval_steps", "must be >= 0 (0: evaluate only before and after training)"),
        (cfg.eval_delay >= 0, "eval_delay", "must be >= 0 (0: evaluate from the first eval_steps on)"),
        (cfg.eval_num_generations >= 0, "eval_num_generations", "must be >= 0 (0: one greedy completion per prompt)"),
        (cfg.eval_temperature > 0, "eval_temperature", "must be > 0"),
        (
            m is not None,
            "save_best",
            f"{metric!r} is not an eval metric; use eval/accuracy, eval/reward or eval/pass@K",
        ),
        (
            m is None or m.group(2) is None or 1 <= int(m.group(2)) <= n,
            "save_best",
            f"{metric}: K must be between 1 and eval_num_generations={cfg.eval_num_generations} (greedy: only pass@1)",
        ),
        (
            not (cfg.save_best or cfg.eval_stop_at is not None) or cfg.eval_size > 0,
            "eval_size",
            "must be > 0 for save_best or eval_stop_at (they read the held-out evaluation)",
        ),
        (
            cfg.eval_stop_at is None or cfg.eval_steps > 0,
            "eval_stop_at",
            "needs eval_steps > 0 (the run evaluates only before and after training otherwise)",
        ),
        (not cfg.save_best or not cfg.fsdp, "save_best", "is not supported with fsdp=true (the model is sharded)"),
    ]


def compile_checks(cfg) -> list[tuple[bool, str, str]]:
    """compile=true needs the update's layers plain: not checkpointed (COMPILE_WITH_CHECKPOINTING), not sharded."""
    if not cfg.compile:
        return []
    return [
        (not cfg.grad_checkpointing, "compile", COMPILE_WITH_CHECKPOINTING.removeprefix("compile=true ")),
        (not cfg.fsdp, "compile", "with fsdp=true: the sharded layers are not compiled by grpolab; set compile=false"),
        (bool(cfg.compile_backend), "compile_backend", "must name a torch.compile backend (e.g. inductor)"),
    ]


__all__ = ["COMPILE_WITH_CHECKPOINTING", "compile_checks", "eval_checks"]
