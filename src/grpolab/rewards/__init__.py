"""Reward functions (verifiers) and how the trainer runs them.

    fns = build_rewards([{"name": "format", "weight": 0.1}, {"name": "math", "extract": "boxed"}])
    scores = score_completions(fns, completions, examples, timeout_s=10.0, workers=4)
    scores.total, scores.per_fn["math"], scores.metrics["reward/errors"]

Each spec is {"name": <reward>, "weight": float (default 1.0), "label": optional display name,
**options of that reward}. Names and options (see each factory's docstring):

    format     think_tag, answer_tag, value, partial, prefix
    math       extract (answer_tag|boxed|gsm8k|last_number|auto), answer_tag, timeout_s,
               max_answer_chars, max_chars, units
    countdown  extract (auto|answer_tag), partial
    code       timeout_s, memory_mb, cpu_s, isolation (require|best_effort), allow_untagged,
               max_code_chars
    tool_call  partial_parse, partial_tool, partial_args, max_chars, max_depth
    reward_model  path (a local directory), tokenizer, dtype (auto|float32|bfloat16), batch_size:
               a learned sequence-classification reward model, scored as TRL scores one
               (grpolab.rewards.reward_model)

A name may also point at a function of your own, by import path (`mypkg.rewards:my_fn`) or by file
(`path/to/rewards.py:my_fn`), written in TRL's form `fn(completions, prompts=..., **columns) ->
list[float | None]` or grpolab's per-sample form `fn(completion, example) -> float`; other spec keys
are passed to it as keyword arguments (grpolab.rewards.custom; docs/rewards.md). A registered
factory may return either form too. In a multi-turn run the TRL form receives each completion's
whole conversation as messages, the per-sample form the last turn's text; a None from the TRL form
means "does not apply" (left out, counted in reward/none), as in TRL.

A verifier that extracts an answer (math, countdown) carries `fn.answer_found(completion, example) ->
bool`: the evaluation reads it to split its failures into "no parsable answer" and "wrong answer"
(grpolab.training.evaluation; a function of your own may carry one too).

A failing verifier never crashes a run: see grpolab.rewards.scoring.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpolab.util.fields import ConfigError

if TYPE_CHECKING:
    from grpolab.rewards.scoring import RewardFn

_SCORING = ("RewardFn", "Scores", "score_completions")


def __getattr__(name: str) -> Any:
    """RewardFn, Scores and score_completions, imported from grpolab.rewards.scoring on first use: scoring
    (and custom) need torch, and the package stays importable without it, so that the config reads
    grpolab.rewards.contract before torch starts (grpolab.util.threads)."""
    if name in _SCORING:
        from grpolab.rewards import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "REWARDS",
    "RewardFn",
    "Scores",
    "as_factory",
    "build_rewards",
    "check_rewards",
    "get_factory",
    "score_completions",
]

# name -> "module:factory"; factories are imported on first use (code/tool_call pull in more).
REWARDS: dict[str, str] = {
    "format": "grpolab.rewards.format:make_format",
    "math": "grpolab.rewards.math_answer:make_math",
    "countdown": "grpolab.rewards.countdown:make_countdown",
    "code": "grpolab.rewards.code:make_code",
    "tool_call": "grpolab.rewards.tool_call:make_tool_call",
    "reward_model": "grpolab.rewards.reward_model:make_reward_model",
}


BUILTIN = frozenset(REWARDS)
"""grpolab's own verifiers: they bound their own time (worker processes, the sandbox, linear parsers) and run
in this process; every other reward is a function of the user's (RewardFn.user)."""


def as_factory(fn: Callable) -> Callable:
    """A registry entry for a reward function itself (TRL or per-sample form): the spec's options are
    passed to `fn` as keyword arguments on every call, as for `module:function` names."""

    def factory():
        return fn

    factory.reward_fn = fn  # type: ignore[attr-defined]
    return factory


def get_factory(name: str) -> Callable:
    """The factory registered under `name` (ConfigError listing the known names)."""
    if name not in REWARDS:
        raise ConfigError(
            f"rewards: unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))} "
            f"(or a function of your own: 'package.module:function' or 'path/to/file.py:function')"
        )
    target = REWARDS[name]
    if callable(target):
        return target
    module, attr = target.split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"rewards: {name!r} is not available in this install ({e})") from e


def build_rewards(specs: list[dict]) -> list[RewardFn]:
    """Turn recipe reward specs into RewardFn objects (ConfigError on any bad spec)."""
    from grpolab.rewards import custom
    from grpolab.rewards.scoring import RewardFn

    if not isinstance(specs, (list, tuple)):
        raise ConfigError(f"rewards: expected a list of reward specs, got {type(specs).__name__}")
    fns: list[RewardFn] = []
    for i, spec in enumerate(specs):
        where = f"rewards[{i}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: expected a mapping like {{name: math, weight: 1.0}}, got {spec!r}")
        opts = dict(spec)
        name = opts.pop("name", None)
        if name is None:
            raise ConfigError(f"{where}: missing 'name'; known rewards: {', '.join(sorted(REWARDS))}")
        if not isinstance(name, str):
            raise ConfigError(f"{where}.name: expected a reward name or 'module:function', got {name!r}")
        weight = opts.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError(f"{where}.weight: expected a number, got {weight!r}")
        direct = None
        if name not in REWARDS and custom.is_reference(name):
            direct = custom.resolve(name, where)
            default_label = name.rpartition(":")[2].rsplit(".", 1)[-1]
        else:
            factory = get_factory(name)
            direct = getattr(factory, "reward_fn", None)
            default_label = name
        label = opts.pop("label", default_label)
        if not isinstance(label, str) or not label:
            raise ConfigError(f"{where}.label: expected a non-empty string, got {label!r}")
        if direct is not None:
            fn, batch = custom.adapt(direct, opts, where)
        else:
            known = [p for p in inspect.signature(factory).parameters]
            for key in opts:
                if key not in known:
                    raise ConfigError(
                        f"{where}.{key}: unknown option for reward {name!r}; "
                        f"known options: name, weight, label, {', '.join(known)}"
                    )
            try:
                fn = factory(**opts)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from e
            try:
                batch = custom.is_batch(fn, where)
            except ConfigError:
                batch = False  # a registered factory's function of unknown shape: the per-sample form
            if batch:
                fn, batch = custom.adapt(fn, {}, where)
        if any(f.name == label for f in fns):
            raise ConfigError(f"{where}: reward {label!r} listed twice; give one a distinct 'label'")
        user = name not in BUILTIN  # a function of the user's: run in a child process under reward_process
        fns.append(RewardFn(name=label, weight=float(weight), fn=fn, batch=batch, user=user))
    return fns


def check_rewards(fns: list[RewardFn], task, *, environment: bool) -> None:
    """Before training: refuse (ConfigError) a TRL-form function that requires a keyword nothing provides,
    reading the task's columns from one example (task.sample(1, a fresh generator)). `environment`: the
    run has one, so `environments` is provided."""
    import random

    from grpolab.rewards import custom

    examples = task.sample(1, random.Random(0))
    available = set(custom.columns(examples)) | set(custom.TRL_KEYWORDS)
    if not environment:
        available.discard("environments")
    for rf in fns:
        custom.check_available(rf.name, rf.fn, available)
