"""What a run's settings imply beyond their own values: the learning-rate schedule's length, the
generation_kwargs that only vLLM takes. Functions of a Config (grpolab.training.config)."""

from __future__ import annotations

import math

from grpolab.training.config import SAMPLING_KEYS, Config
from grpolab.util.fields import ConfigError


def lr_updates(cfg: Config) -> dict[str, int]:
    """The schedule's W and N (grpolab.algo.schedules.SCHEDULES): total N = steps * algo.mu *
    algo.steps_per_generation optimizer updates; warmup W = ceil(warmup_ratio * N) when warmup_ratio > 0
    (transformers' TrainingArguments.get_warmup_steps), else warmup_steps * algo.mu * algo.steps_per_generation."""
    per_step = cfg.algo.mu * cfg.algo.steps_per_generation
    total = cfg.steps * per_step
    warmup = math.ceil(total * cfg.warmup_ratio) if cfg.warmup_ratio > 0 else cfg.warmup_steps * per_step
    return {"warmup": warmup, "total": total}


def extra_generation_kwargs(cfg: Config) -> dict:
    """generation_kwargs beyond SAMPLING_KEYS: for vLLM's SamplingParams."""
    return {k: v for k, v in cfg.generation_kwargs.items() if k not in SAMPLING_KEYS}


def check_engine_kwargs(cfg: Config, engine_name: str) -> None:
    """generation_kwargs beyond the sampling options, and rollout.structured_outputs_regex, reach only vLLM; the
    native engine refuses them by name (exit 2) before any model is loaded."""
    if cfg.rollout.structured_outputs_regex is not None and engine_name != "vllm":
        raise ConfigError(
            f"rollout.structured_outputs_regex: only vLLM constrains decoding (its structured outputs); the "
            f"{engine_name} rollout engine samples every token the policy gives: use rollout.engine=vllm "
            f"(TRL: use_vllm=True), or drop the regex"
        )
    extra = extra_generation_kwargs(cfg)
    if extra and engine_name != "vllm":
        raise ConfigError(
            f"generation_kwargs.{next(iter(extra))}: the {engine_name} rollout engine takes only "
            f"{', '.join(SAMPLING_KEYS)}; other keys are vLLM SamplingParams fields: use "
            f"rollout.engine=vllm, or drop the key"
        )
