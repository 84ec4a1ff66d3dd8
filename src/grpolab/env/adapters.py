"""Adapters from the shapes people already write to the Environment contract (base.py).

- `FunctionTools(tools=[fn, ...])`: TRL's `tools=` form. A turn with tool calls gets one `tool`
  message per call, in order, and the trajectory goes on; a turn without a call ends it.
- `FactoryEnvironment(factory)`: TRL's `environment_factory=` form (a class whose public methods
  are its tools, `reset(**fields)`, optional `get_reward()`), one instance per trajectory taken
  from an `InstancePool` (created once, reset between uses).
- `GymAdapter(env)`: gym-style `reset()` / `step(action)`; the model's turn is the action and the
  observation comes back as a `user` message; rewards are summed.

What follows TRL 1.16 (trl/trainer/grpo_trainer.py, `GRPOTrainer.__init__` and
`_generate_and_score_completions`):

- tools of an environment class: the functions found by `inspect.getmembers(type(instance),
  inspect.isfunction)` (so inherited methods and staticmethods count; classmethods and properties do
  not), minus names starting with `_`, `reset` and `get_reward`; in that (alphabetical) order,
  after any standalone `tools=`. A class without a `reset` function is refused.
- `reset` receives the example's fields as keyword arguments (TRL passes the whole dataset row,
  `prompt` included; the rollout loop passes the same); a returned string goes into the last
  message of the prompt (grpolab.env.rollout.prompt_messages: after a blank line, where TRL
  appends it as is); None appends nothing.
- instances are pooled and reused: created when more are needed at once than exist, never more.
- `get_reward()` takes no argument and may be async; it is called once per finished trajectory; its
  None means "no reward for this sample". Tools may be async too.
- tool messages are `{"role": "tool", "name": <tool>, "content": <text>}`.

Deliberate differences from TRL:

- a non-string result is `json.dumps`-ed when possible (TRL uses `str()`: `True`, `{'a': 1}`),
  so the model reads JSON; results longer than `max_result_chars` are cut with a marker. A list
  result (TRL passes it through as multimodal content blocks) is JSON text for the model (no
  images); reward functions receive the list itself, as in TRL (timeouts.ToolText, Reply.values).
- a failing call's content is "Error: ..." in words (TRL's is `str({"error": "..."})`), and
  arguments are checked against the schema before the tool runs (TRL calls `fn(**arguments)`
  and reports whatever TypeError results).
- every call has a timeout (TRL waits forever), on a daemon thread of its own (TRL runs sync tools
  on the main thread): env.tool_thread=main (`here=True`) runs them in the calling thread, as TRL;
  env.tool_process=true (`process=True`) in a forked child process, killed at the timeout.
- `reset` gets only the fields its signature accepts, unless it takes **kwargs (TRL passes all and
  a narrower signature raises TypeError).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from grpolab.env.base import EnvironmentShapeError, Reply
from grpolab.env.calls import parse_tool_calls
from grpolab.env.runner import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TIMEOUT_S, ToolRunner, cut
from grpolab.env.schema import function_schema
from grpolab.env.timeouts import Raised, call_with_timeout, short_error, to_text

RESERVED = ("reset", "get_reward")
"""Public methods of an environment class that are not tools (as in TRL)."""

_schema_lock = threading.Lock()
_schema_cache: dict[Any, dict] = {}


def tool_method_names(cls_or_obj: Any) -> list[str]:
    """Names of the tool methods of an environment class (or of an instance's class), TRL's rule."""
    cls = cls_or_obj if inspect.isclass(cls_or_obj) else type(cls_or_obj)
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED and not name.startswith("_")
    ]


def _class_has(cls: type, name: str) -> bool:
    """True if the class has a plain function of that name (TRL's test for reset / get_reward)."""
    return any(n == name for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction))


def cached_schema(fn: Callable) -> dict:
    """function_schema(fn), computed once per underlying function (a method's schema does not
    depend on the instance, and a pool of many instances would otherwise parse it many times)."""
    key = getattr(fn, "__func__", fn)
    with _schema_lock:
        hit = _schema_cache.get(key)
    if hit is None:
        hit = function_schema(fn)
        with _schema_lock:
            _schema_cache[key] = hit
    return hit


def _named_tools(fns: Sequence[Callable], owner: str) -> tuple[dict[str, Callable], list[dict]]:
    """name -> function and the schemas, in order; refuses non-callables and duplicate names."""
    functions: dict[str, Callable] = {}
    schemas: list[dict] = []
    for fn in fns:
        if not callable(fn):
            raise EnvironmentShapeError(f"{owner}: tool {fn!r} is not callable; pass functions, e.g. tools=[add].")
        name = getattr(fn, "__name__", None)
        if not name:
            raise EnvironmentShapeError(f"{owner}: tool {fn!r} has no __name__; define it with `def`.")
        if name in functions:
            raise EnvironmentShapeError(f"{owner}: two tools are named {name!r}; rename one.")
        functions[name] = fn
        schemas.append(cached_schema(fn))
    return functions, schemas


def tool_step(runner: ToolRunner, turn_text: str) -> Reply:
    """A tool environment's step: run the turn's calls, or end the trajectory if it makes none."""
    items = parse_tool_calls(turn_text)
    if not items:
        return Reply(done=True)
    return runner.run(items)


class FunctionTools:
    """TRL's `tools=[fn, ...]`: plain functions as tools, no state, no reward of its own."""

    user_env = None
    """What a reward function's `environments` holds for this trajectory: nothing (TRL passes none)."""
    has_reward = False
    """Plain functions give no reward of their own (no `env` reward column)."""

    def __init__(
        self,
        tools: Sequence[Callable],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
        process: bool = False,
    ) -> None:
        functions, self.tools = _named_tools(list(tools), "FunctionTools")
        self.runner = ToolRunner(
            functions,
            {s["function"]["name"]: s for s in self.tools},
            timeout_s=timeout_s,
            max_result_chars=max_result_chars,
            here=here,
            process=process,
        )

    def reset(self, fields: dict) -> str | None:
        """Nothing to reset: plain functions keep no state."""
        return None

    def step(self, turn_text: str) -> Reply:
        """Run the turn's calls in order (done=False), or end the trajectory if there are none."""
        return tool_step(self.runner, turn_text)

    def reward(self) -> float | None:
        """Plain tools give no reward; the verifiers score the final answer."""
        return None


class InstancePool:
    """Hands out instances made by a factory: a released one if any, else a new one.

    TRL's contract: one instance per trajectory, created once and reset between uses. Instances
    are created only when more are in use at once than exist.
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.created = 0
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self) -> Any:
        """A free instance, or a new one from the factory."""
        with self._lock:
            if self._free:
                return self._free.pop()
            self.created += 1
        return self.factory()

    def release(self, instance: Any) -> None:
        """Give an instance back for the next trajectory (it will be reset before use)."""
        with self._lock:
            self._free.append(instance)


def _accepted(fn: Callable, fields: dict) -> dict:
    """The fields `fn` accepts as keyword arguments (all of them if it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(fields)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(fields)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in fields.items() if k in names}


def _resolve(value: Any) -> Any:
    """The value of an awaitable (async reset / get_reward), else the value itself."""
    if inspect.isawaitable(value):

        async def wait():
            return await value

        return asyncio.run(wait())
    return value


class FactoryEnvironment:
    """TRL's `environment_factory=`: one instance of the user's class per trajectory.

    factory: zero-argument callable (usually the class) making an instance.
    tools: standalone tool functions offered alongside the instance's methods (TRL's `tools=`).
    pool: an InstancePool shared by the trajectories (one is made if not given).
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        tools: Sequence[Callable] = (),
        pool: InstancePool | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
        process: bool = False,
    ) -> None:
        self._pool = pool if pool is not None else InstancePool(factory)
        self.instance = self._pool.acquire()
        cls = type(self.instance)
        if not _class_has(cls, "reset"):
            self._pool.release(self.instance)
            raise EnvironmentShapeError(
                f"{cls.__name__}: an environment class needs a `reset(self, **kwargs)` method (it may just "
                "`return None`); its public methods are its tools, and `get_reward(self)` is optional."
            )
        methods = [getattr(self.instance, n) for n in tool_method_names(cls)]
        functions, self.tools = _named_tools(list(tools) + methods, cls.__name__)
        self.runner = ToolRunner(
            functions,
            {s["function"]["name"]: s for s in self.tools},
            timeout_s=timeout_s,
            max_result_chars=max_result_chars,
            here=here,
            process=process,
        )
        self._has_reward = _class_has(cls, "get_reward")
        self._closed = False

    @property
    def user_env(self) -> Any:
        """The user's instance: what TRL's reward functions receive in `environments`."""
        return self.instance

    @property
    def has_reward(self) -> bool:
        """Whether the class defines get_reward (TRL then adds its reward column)."""
        return self._has_reward

    def reset(self, fields: dict) -> str | None:
        """instance.reset(**fields); a string it returns is appended to the user message."""
        out = _resolve(self.instance.reset(**_accepted(self.instance.reset, fields)))
        if out is not None and not isinstance(out, str):
            raise EnvironmentShapeError(
                f"{type(self.instance).__name__}.reset returned {type(out).__name__}; return a string "
                "(appended to the user message) or None."
            )
        return out

    def step(self, turn_text: str) -> Reply:
        """Run the turn's calls on this instance's methods, in order; no call ends the trajectory."""
        return tool_step(self.runner, turn_text)

    def reward(self) -> float | None:
        """instance.get_reward() if the class defines it (None stays None), else None."""
        if not self._has_reward:
            return None
        value = _resolve(self.instance.get_reward())
        return None if value is None else float(value)

    def close(self) -> None:
        """Return the instance to the pool (once); this object is not used afterwards."""
        if not self._closed:
            self._closed = True
            self._pool.release(self.instance)


def _observation_of(value: Any) -> Any:
    """The observation of a reset() result: gymnasium returns (observation, info)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        return value[0]
    return value


def _unpack_step(result: Any) -> tuple[Any, float, bool]:
    """(observation, reward, done) from a gym-style step result.

    Accepted: (obs, reward, done), (obs, reward, done, info), (obs, reward, terminated, truncated,
    info), and an object with `observation`, `reward` and `done` attributes (OpenEnv's StepResult).
    A reward of None counts as 0.
    """
    if isinstance(result, tuple) and len(result) in (3, 4):
        obs, reward, done = result[:3]
    elif isinstance(result, tuple) and len(result) == 5:
        obs, reward, terminated, truncated, _ = result
        done = bool(terminated) or bool(truncated)
    elif hasattr(result, "reward") and hasattr(result, "done"):
        obs, reward, done = getattr(result, "observation", None), result.reward, result.done
    else:
        raise EnvironmentShapeError(
            f"step returned {type(result).__name__}; expected (observation, reward, done) or "
            "(observation, reward, terminated, truncated, info)"
        )
    return obs, 0.0 if reward is None else float(reward), bool(done)


class GymAdapter:
    """A gym-style environment (reset() / step(action)) driven by the model's turns.

    The model's whole turn text is the action. The observation after each step comes back as a
    `user` message (text as is, anything else as JSON or str(), cut to max_obs_chars with a
    `truncated` event). Rewards of all steps are summed for reward(). reset() receives the
    example's fields its signature accepts (a plain `reset()` gets none); its observation, if not
    None, is the text appended to the user message.

    A step that raises or runs past timeout_s ends the trajectory (the environment's state is
    unknown after it), with an error message and an `exception` / `timeout` event.
    """

    def __init__(
        self,
        env: Any,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_obs_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
    ) -> None:
        if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
            raise EnvironmentShapeError(f"GymAdapter: {type(env).__name__} needs reset() and step(action) methods.")
        self.env = env
        self.tools: list[dict] = []
        self.timeout_s = timeout_s
        self.max_obs_chars = max_obs_chars
        self.total = 0.0
        self.finished = False
        self.here = here

    @property
    def user_env(self) -> Any:
        """The wrapped environment: what a TRL-form reward function receives in `environments`."""
        return self.env

    def reset(self, fields: dict) -> str | None:
        """Reset the environment; its first observation as text (None if it gives none)."""
        self.total, self.finished = 0.0, False
        obs = _observation_of(_resolve(self.env.reset(**_accepted(self.env.reset, fields))))
        return None if obs is None else cut(to_text(obs), self.max_obs_chars)[0]

    def step(self, turn_text: str) -> Reply:
        """env.step(turn_text) on a daemon thread, with a timeout; the observation as a user message."""
        if self.finished:
            return Reply(done=True)
        out = call_with_timeout(lambda: self.env.step(turn_text), {}, self.timeout_s, convert=False, here=self.here)
        if out is None:
            self.finished = True
            return Reply(
                [{"role": "user", "content": f"Error: the environment timed out after {self.timeout_s:g} s."}],
                done=True,
                events=Counter(timeout=1),
            )
        try:
            if isinstance(out, Raised):
                raise out.error
            obs, reward, done = _unpack_step(out)
        except Exception as e:  # noqa: BLE001 - the environment's failure ends this trajectory only
            self.finished = True
            return Reply(
                [{"role": "user", "content": f"Error: the environment failed: {short_error(e)}"}],
                done=True,
                events=Counter(exception=1),
            )
        self.total += reward
        self.finished = done
        events: Counter = Counter()
        messages = []
        if obs is not None:
            text, removed = cut(to_text(obs), self.max_obs_chars)
            if removed:
                events["truncated"] += 1
            messages.append({"role": "user", "content": text})
        return Reply(messages, done=done, events=events)

    def reward(self) -> float | None:
        """The sum of the rewards of the steps taken since reset."""
        return self.total

    def close(self) -> None:
        """Close the wrapped environment if it has close() (gymnasium's do)."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
