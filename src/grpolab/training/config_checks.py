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


EVAL_METRIC = re.compile(
    r"eval/(accuracy(_lo|_hi)?|reward|reward_std|loss|length|length_min|length_max|truncated_frac|zero_std_frac"
    r"|ended_length_(mean|min|max)|turns|pass@(\d+)(_lo|_hi)?|reward/.+/(mean|std)|extract/.+/(no_answer|wrong|right))"
)
"""The metrics of an evaluation (grpolab.training.evaluation.eval_metrics) that can rank evaluations: save_best's
and eval_stop_at's. Group 4 is pass@K's K."""

EVAL_METRIC_NAMES = (
    "eval/accuracy, eval/reward, eval/loss, eval/length, eval/pass@K, eval/reward/NAME/mean, eval/reward_std, "
    "eval/truncated_frac, eval/zero_std_frac, eval/ended_length_mean, eval/turns, eval/extract/NAME/right, ..."
)


def eval_checks(cfg) -> list[tuple[bool, str, str]]:
    """The evaluation settings' checks, as (ok, key, message) rows of validate()."""
    metric = cfg.save_best or "eval/accuracy"
    m = EVAL_METRIC.fullmatch(metric)
    n = max(1, cfg.eval_num_generations)
    return [
        (cfg.eval_steps >= 0, "eval_steps", "must be >= 0 (0: evaluate only before and after training)"),
        (cfg.eval_delay >= 0, "eval_delay", "must be >= 0 (0: evaluate from the first eval_steps on)"),
        (cfg.eval_num_generations >= 0, "eval_num_generations", "must be >= 0 (0: one greedy completion per prompt)"),
        (cfg.eval_temperature > 0, "eval_temperature", "must be > 0"),
        (
            m is not None,
            "save_best",
            f"{metric!r} is not an eval metric; use one the evaluation logs: {EVAL_METRIC_NAMES} (docs/evaluation.md)",
        ),
        (
            m is None or m.group(4) is None or 1 <= int(m.group(4)) <= n,
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


__all__ = ["COMPILE_WITH_CHECKPOINTING", "EVAL_METRIC", "EVAL_METRIC_NAMES", "compile_checks", "eval_checks"]
