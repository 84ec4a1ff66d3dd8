"""What a run's settings imply beyond their own values: the sampling options in force (generation_kwargs
over the config's own), the learning-rate schedule's length, the evaluation settings' checks. Functions of
a Config (grpolab.training.config), which imports them for its validation."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from grpolab.util.fields import ConfigError

if TYPE_CHECKING:
    from grpolab.training.config import Config


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""generation_kwargs keys that override the config's own sampling options (the native engine knows only these)."""


def eval_checks(cfg: Config) -> list[tuple[bool, str, str]]:
    """The evaluation settings' checks, as (ok, key, message) rows of validate()."""
    metric = cfg.save_best or "eval/accuracy"
    m = re.fullmatch(r"eval/(accuracy|reward|pass@(\d+))", metric)
    n = max(1, cfg.eval_num_generations)
    return [
        (cfg.eval_steps >= 0, "eval_steps", "must be >= 0 (0: evaluate only before and after training)"),
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


def lr_updates(cfg: Config) -> dict[str, int]:
    """The schedule's W and N (grpolab.algo.schedules.SCHEDULES): total N = steps * algo.mu *
    algo.steps_per_generation optimizer updates; warmup W = ceil(warmup_ratio * N) when warmup_ratio > 0
    (transformers' TrainingArguments.get_warmup_steps), else warmup_steps * algo.mu * algo.steps_per_generation."""
    per_step = cfg.algo.mu * cfg.algo.steps_per_generation
    total = cfg.steps * per_step
    warmup = math.ceil(total * cfg.warmup_ratio) if cfg.warmup_ratio > 0 else cfg.warmup_steps * per_step
    return {"warmup": warmup, "total": total}


def sampling_values(cfg: Config) -> dict:
    """The sampling options a run uses: temperature, top_p, top_k, min_p, repetition_penalty from the
    config, each overridden by generation_kwargs where it names it (TRL: generation_kwargs win)."""
    out = {k: getattr(cfg, k) for k in SAMPLING_KEYS}
    out.update({k: v for k, v in cfg.generation_kwargs.items() if k in SAMPLING_KEYS})
    return out


def extra_generation_kwargs(cfg: Config) -> dict:
    """generation_kwargs beyond SAMPLING_KEYS: for vLLM's SamplingParams."""
    return {k: v for k, v in cfg.generation_kwargs.items() if k not in SAMPLING_KEYS}


def check_sampling_kwargs(cfg: Config) -> None:
    """generation_kwargs' sampling keys obey the same bounds as the options they override (its keys, and
    chat_template_kwargs', are strings by their type, dict[str, Any])."""
    v = sampling_values(cfg)
    checks = [
        (isinstance(v["temperature"], (int, float)) and v["temperature"] > 0, "temperature", "must be a number > 0"),
        (isinstance(v["top_p"], (int, float)) and 0 < v["top_p"] <= 1, "top_p", "must be in (0, 1]"),
        (isinstance(v["top_k"], int) and v["top_k"] >= -1, "top_k", "must be an integer >= 1, or 0 / -1 for off"),
        (isinstance(v["min_p"], (int, float)) and 0 <= v["min_p"] < 1, "min_p", "must be in [0, 1)"),
        (
            isinstance(v["repetition_penalty"], (int, float)) and v["repetition_penalty"] > 0,
            "repetition_penalty",
            "must be a number > 0",
        ),
    ]
    for ok, key, msg in checks:
        if not ok and key in cfg.generation_kwargs:
            raise ConfigError(f"generation_kwargs.{key}: {msg}, got {cfg.generation_kwargs[key]!r}")


def check_engine_kwargs(cfg: Config, engine_name: str) -> None:
    """generation_kwargs beyond the sampling options reach only vLLM; the native engine refuses them by name
    (exit 2) before any model is loaded."""
    extra = extra_generation_kwargs(cfg)
    if extra and engine_name != "vllm":
        raise ConfigError(
            f"generation_kwargs.{next(iter(extra))}: the {engine_name} rollout engine takes only "
            f"{', '.join(SAMPLING_KEYS)}; other keys are vLLM SamplingParams fields: use "
            f"rollout.engine=vllm, or drop the key"
        )
