"""Reward functions of your own: found by import path or file, called in TRL's form or grpolab's.

A reward spec's `name` may point at a function instead of a registered reward:

    {name: "mypkg.rewards:my_fn"}            imported with importlib (mypkg must be importable)
    {name: "path/to/rewards.py:my_fn"}       the file is loaded as a module (relative to the cwd)

The function is the reward itself (not a factory). Its form is read from its parameters:

    TRL form    fn(completions, prompts=..., **columns) -> list[float | None]
                a parameter named `completions`, `prompts` or `environments`, or only keyword-able
                parameters and **kwargs (TRL calls every function with keywords): called with
                keyword arguments, one call per group of completions that share a prompt. `completions` are strings, or chat messages
                ([{"role": "assistant", "content": text}]) when the prompt is a message list; in a
                multi-turn run, each completion is the whole conversation after the prompt
                ([{"role": "assistant", ...}, {"role": "tool", "name": ..., "content": ...}, ...]),
                as TRL gives a tool run's completions, and the prompts are message lists too.
                `prompts` are the prompts as the task gave them (strings or message lists); every
                other column of the example comes as a list, one value per completion: `answer`
                (the reference answer) and each key of the example's meta (a dataset's other
                columns, countdown's `numbers` and `target`, ...). A function without **kwargs gets
                only the arguments it names. In a run with an environment, `prompts` are the prompts
                the trajectories started from (messages; reset's text included), and `environments` holds each
                completion's environment instance (the user's object an adapter wraps: the TRL class
                instance, the OpenEnv or SkyRL environment), as TRL passes them; plain tool functions
                have none (None). The rest of TRL's contract comes too (grpolab.rewards.contract):
                `completion_ids`, `trainer_state`, `log_extra`, `log_metric`. An `async def` function
                returns a coroutine, awaited by grpolab.rewards.scoring. A None in the returned list:
                the function does not apply to that completion (TRL's meaning; grpolab.rewards.scoring).
                A required parameter that nothing provides is refused before training
                (check_available).
    per-sample  fn(completion, example) -> float        (a first parameter named `completion`, or
                two positional parameters): grpolab's own form, one call per completion; in a
                multi-turn run `completion` is the last model turn's text. None is an error.

Any other key of the spec (besides name, weight, label) is passed to the function as a keyword
argument on every call. The metric name is the function's name (`reward/my_fn/mean`) unless the spec
gives a `label`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path

from grpolab.batch import Example
from grpolab.rewards.contract import is_async_callable
from grpolab.util.fields import ConfigError
from grpolab.util.user_code import NotImportable, import_file

TRL_KEYWORDS = ("completions", "prompts", "environments", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""Keywords TRL's GRPOTrainer passes every reward function (besides the dataset's columns;
grpolab.rewards.contract)."""
RESERVED = TRL_KEYWORDS
"""Keywords grpolab passes itself: a spec option of that name is refused."""


def is_reference(name: object) -> bool:
    """Does a reward name point at a function (`module:attr` or `file.py:attr`)?"""
    return isinstance(name, str) and ":" in name


def _load_file(path: Path, where: str):
    """Import a .py file as a module (once per absolute path: a second spec reuses it)."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"{where}: reward file not found: {path}")
    try:
        return import_file(path, "grpolab_user_rewards")
    except NotImportable as e:
        raise ConfigError(f"{where}: {e}") from e


def resolve(name: str, where: str) -> Callable:
    """The function a `module:attr` or `file.py:attr` name points at (ConfigError on any problem)."""
    target, _, attr = name.rpartition(":")
    if not target or not attr:
        raise ConfigError(f"{where}.name: {name!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(Path(target), where)
        source = str(Path(target))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(f"{where}.name: cannot import module {target!r} ({e}); is it on PYTHONPATH?") from e
        except Exception as e:
            raise ConfigError(f"{where}.name: importing {target!r} failed: {type(e).__name__}: {e}") from e
        source = target
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            known = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ConfigError(f"{where}.name: {source} has no {attr!r}; its functions: {', '.join(known) or 'none'}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}.name: {name!r} is a {type(obj).__name__}, not a function")
    return obj


def _signature(fn: Callable, where: str) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: cannot read the parameters of {fn!r} ({e})") from e


def is_batch(fn: Callable, where: str) -> bool:
    """True for TRL's form (a `completions` parameter), False for grpolab's per-sample form."""
    params = _signature(fn, where).parameters
    if "completions" in params:
        return True
    if "completion" in params:
        return False
    positional = [
        p
        for p in params.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if any(name in params for name in TRL_KEYWORDS):  # e.g. fn(environments, **kwargs)
        return True
    if len(positional) >= 2 or any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params.values()):
        return False
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True  # fn(**kwargs), fn(x, **kwargs): TRL calls it with keywords (check_available checks x)
    raise ConfigError(
        f"{where}: cannot tell how to call {getattr(fn, '__name__', fn)!r}: write it as "
        f"fn(completions, prompts=None, **kwargs) -> list (TRL's form) or fn(completion, example) -> float"
    )


def check_options(fn: Callable, options: dict, where: str, batch: bool) -> None:
    """Spec options become keyword arguments: the function must accept each one."""
    params = _signature(fn, where).parameters
    takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in options:
        if key in RESERVED and batch:
            raise ConfigError(f"{where}.{key}: reserved (grpolab passes {key} itself)")
        if not takes_any and key not in params:
            raise ConfigError(
                f"{where}.{key}: {getattr(fn, '__name__', 'the function')}() has no parameter "
                f"{key!r} (its parameters: {', '.join(params)})"
            )


def columns(examples: list[Example]) -> dict[str, list]:
    """TRL's extra columns: `answer` and every meta key that each example has, one value per completion."""
    out: dict[str, list] = {"answer": [e.answer for e in examples]}
    if examples:
        keys = [k for k in examples[0].meta if all(k in e.meta for e in examples[1:])]
        for k in keys:
            if k not in RESERVED and k != "answer" and isinstance(k, str):
                out[k] = [e.meta[k] for e in examples]
    return out


def trl_call(fn: Callable, options: dict) -> Callable[[list[str], list[Example]], object]:
    """Adapt a TRL-form function to RewardFn(batch=True): (completions, examples) -> its return value.
    `completions` are texts, or (multi-turn) each completion's conversation as a list of messages."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())

    def call(
        completions: list[str] | list[list[dict]],
        examples: list[Example],
        environments: list | None = None,
        prompts: list | None = None,
        **contract,
    ):
        conversation = bool(completions) and isinstance(completions[0], list)  # multi-turn: messages already
        chat = bool(examples) and not isinstance(examples[0].prompt, str)
        kwargs = columns(examples)
        kwargs.update(options)
        # TRL's conversational form holds both: message-list completions come with message-list prompts
        kwargs["prompts"] = (
            [
                [{"role": "user", "content": e.prompt}] if conversation and isinstance(e.prompt, str) else e.prompt
                for e in examples
            ]
            if prompts is None
            else list(prompts)
        )
        kwargs.update(contract)  # completion_ids, trainer_state, log_extra, log_metric (grpolab.rewards.contract)
        if environments is not None:  # the user's objects, as TRL passes its environment instances
            kwargs["environments"] = [getattr(e, "user_env", e) for e in environments]
        if conversation:
            kwargs["completions"] = list(completions)
        else:
            kwargs["completions"] = (
                [[{"role": "assistant", "content": c}] for c in completions] if chat else list(completions)
            )
        if not takes_any:
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return fn(**kwargs)

    call.__name__ = getattr(fn, "__name__", "reward")
    call.takes_context = True  # type: ignore[attr-defined]
    call.is_async = is_async_callable(fn)  # type: ignore[attr-defined]  # returns a coroutine: awaited
    call.user_fn, call.options = fn, dict(options)  # type: ignore[attr-defined]  # for check_available
    return call


def sample_call(fn: Callable, options: dict) -> Callable[[str, Example], object]:
    """A per-sample function with the spec's options bound as keyword arguments."""
    if not options:
        return fn

    def call(completion: str, example: Example):
        return fn(completion, example, **options)

    call.__name__ = getattr(fn, "__name__", "reward")
    call.is_async = is_async_callable(fn)  # type: ignore[attr-defined]
    return call


def adapt(fn: Callable, options: dict, where: str) -> tuple[Callable, bool]:
    """(the callable RewardFn holds, batch?) for a user's function and its spec options."""
    batch = is_batch(fn, where)
    check_options(fn, options, where, batch)
    wrapped = trl_call(fn, options) if batch else sample_call(fn, options)
    limit = getattr(fn, "max_concurrency", None)
    if limit is not None and wrapped is not fn:
        wrapped.max_concurrency = limit  # type: ignore[attr-defined]
    return wrapped, batch


def required_keywords(fn: Callable) -> list[str]:
    """The parameters a TRL-form function cannot be called without (no default, not * or **)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_available(name: str, fn: Callable, available: set[str], where: str = "rewards") -> None:
    """Refuse (ConfigError) a reward function that requires a keyword nothing provides: TRL's contract
    (TRL_KEYWORDS; `environments` only in a run with an environment), the task's columns, the spec's
    options. RewardFn.fn as built by `adapt`: a per-sample function needs nothing beyond its options
    (checked by check_options)."""
    user_fn = getattr(fn, "user_fn", None)
    if user_fn is None:
        return
    options = set(getattr(fn, "options", {}))
    missing = [k for k in required_keywords(user_fn) if k not in available and k not in options]
    if not missing:
        return
    shown = ", ".join(sorted(available))
    close = [m for k in missing for m in difflib.get_close_matches(k, sorted(available), n=1, cutoff=0.8)]
    hint = (
        f" Did you mean {', '.join(repr(c) for c in close)}?"
        if close
        else " `environments` is given only in a run with an environment (env.name)."
        if "environments" in missing
        else " Add the column to the data, give the parameter a default (e.g. =None), or pass it as an option "
        "of the reward spec."
    )
    raise ConfigError(
        f"{where}: reward {name!r} requires {', '.join(repr(k) for k in missing)}, which no column "
        f"of the task and nothing TRL's contract passes provides; it would fail on every "
        f"completion. Available keywords: {shown}.{hint}"
    )


__all__ = [
    "TRL_KEYWORDS",
    "adapt",
    "check_available",
    "columns",
    "is_batch",
    "is_reference",
    "required_keywords",
    "resolve",
]
