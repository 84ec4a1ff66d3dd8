"""OpenEnv-style environments through an adapter: typed (pydantic) actions in, observation objects out.

The shape (the server-side `Environment` of meta-pytorch/OpenEnv):

    reset(seed=None, episode_id=None, **kwargs) -> Observation
    step(action: SomeAction, ...) -> Observation
    Observation: a pydantic model with `done`, `reward` (None allowed), `metadata` and fields of its own
    SomeAction: a pydantic model (OpenEnv's `Action`, with a `metadata` field) with fields of its own

What the adapter does with it (`OpenEnvAdapter(env)`):

- the action class is the annotation of step's first parameter (or `action_cls=`), a pydantic model.
- a text action (exactly one required field, annotated `str`, `metadata` aside): the model's whole
  turn is that field, and each turn is one step; the observation comes back as a `user` message.
- any other action class is one tool, named after the class, whose parameters are the class's JSON
  schema (`metadata` aside): each <tool_call> of a turn is one step, in order, and its observation
  the `tool` message; a turn without a call ends the trajectory. Arguments the class refuses
  (pydantic's ValidationError) get an error message (`bad_arguments`) and take no step.
- an observation as text: its only string field (`done`, `reward` and `metadata` aside), else the
  JSON of those fields; cut to max_obs_chars (`truncated`).
- reward: the sum of the observations' rewards since reset (None counts 0); `done` ends the
  trajectory (later calls of the turn are not run).
- reset gets `seed` = base.example_seed(fields) and `episode_id` = the example's id where its
  signature names them and the example has no field of that name, plus the example's fields
  that its signature accepts (all of them with **kwargs, as TRL passes a row); the first
  observation's text is appended to the user message.
- a step that raises or runs past timeout_s ends the trajectory with an error message (`exception`
  / `timeout`): the environment's state is unknown after it, as for GymAdapter.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections import Counter
from typing import Any

from grpolab.env.adapters import _accepted, _resolve
from grpolab.env.base import EnvironmentShapeError, Reply, example_seed
from grpolab.env.calls import ParseError, parse_tool_calls
from grpolab.env.runner import (
    DEFAULT_MAX_RESULT_CHARS,
    DEFAULT_TIMEOUT_S,
    Raised,
    call_with_timeout,
    cut,
    short_error,
)

OBSERVATION_BASE_FIELDS = ("done", "reward", "metadata")
"""Fields every OpenEnv observation has; the rest are the environment's own."""


def is_model_class(obj: Any) -> bool:
    """A pydantic model class (duck-typed: model_validate and model_json_schema)."""
    return inspect.isclass(obj) and callable(getattr(obj, "model_validate", None)) and \
        callable(getattr(obj, "model_json_schema", None))


def action_class(env_cls: type) -> type | None:
    """The annotation of step's first parameter after self, if it is a pydantic model class."""
    step = getattr(env_cls, "step", None)
    if not callable(step):
        return None
    try:
        params = [p for p in inspect.signature(step).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not params:
        return None
    try:
        hints = typing.get_type_hints(step)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: read it as written
        hints = {}
    ann = hints.get(params[0].name, params[0].annotation)
    return ann if is_model_class(ann) else None


def is_openenv_class(cls: type) -> bool:
    """An OpenEnv-style class: reset and step, with a pydantic action (or an OpenEnv base class)."""
    if not (callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None))):
        return False
    from_openenv = any(base.__module__.split(".")[0] == "openenv" for base in cls.__mro__[1:])
    return from_openenv or action_class(cls) is not None


def _fields(model_cls: type) -> dict:
    """name -> FieldInfo of a pydantic model class (pydantic 2's model_fields)."""
    return dict(getattr(model_cls, "model_fields", {}) or {})


def text_field(action_cls: type) -> str | None:
    """The one field a text action fills with the model's turn, or None for a structured action."""
    fields = {n: f for n, f in _fields(action_cls).items() if n != "metadata"}
    required = [n for n, f in fields.items() if f.is_required()]
    if len(required) == 1 and fields[required[0]].annotation is str:
        return required[0]
    return None


def action_tool(action_cls: type) -> dict:
    """The OpenAI function schema of a structured action: its JSON schema, `metadata` aside."""
    schema = dict(action_cls.model_json_schema())
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    params: dict = {"type": "object", "properties": props,
                    "required": [r for r in schema.get("required", []) if r != "metadata"]}
    if "$defs" in schema:
        params["$defs"] = schema["$defs"]
    doc = inspect.getdoc(action_cls) or f"Take the action {action_cls.__name__}."
    return {"type": "function", "function": {"name": action_cls.__name__, "description": doc.split("\n\n")[0],
                                             "parameters": params}}


def observation_text(obs: Any) -> str:
    """An observation as text: its only string field besides done/reward/metadata, else their JSON."""
    if isinstance(obs, str):
        return obs
    names = [n for n in _fields(type(obs)) if n not in OBSERVATION_BASE_FIELDS]
    values = {n: getattr(obs, n, None) for n in names}
    strings = [v for v in values.values() if isinstance(v, str)]
    if len(values) == 1 and len(strings) == 1:
        return strings[0]
    dump = getattr(obs, "model_dump", None)
    data = dump(exclude=set(OBSERVATION_BASE_FIELDS)) if callable(dump) else values
    return json.dumps(data, ensure_ascii=False, default=str)


class OpenEnvAdapter:
    """One OpenEnv-style environment instance per trajectory (see the module docstring)."""

    def __init__(self, env: Any, *, action_cls: type | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_obs_chars: int = DEFAULT_MAX_RESULT_CHARS, here: bool = False) -> None:
        if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
            raise EnvironmentShapeError(f"OpenEnvAdapter: {type(env).__name__} needs reset() and step(action).")
        self.env = env
        self.action_cls = action_cls or action_class(type(env))
        if self.action_cls is None:
            raise EnvironmentShapeError(
                f"{type(env).__name__}: cannot tell its action class; annotate step's parameter with it "
                "(def step(self, action: MyAction)), a pydantic model")
        self.field = text_field(self.action_cls)
        self.tools = [] if self.field else [action_tool(self.action_cls)]
        self.timeout_s, self.max_obs_chars, self.here = timeout_s, max_obs_chars, here
        self.total, self.finished = 0.0, False

    @property
    def user_env(self) -> Any:
        """The wrapped environment: what a TRL-form reward function receives in `environments`."""
        return self.env

    def reset(self, fields: dict) -> str | None:
        """env.reset(seed=..., episode_id=..., fields it accepts); the first observation as text."""
        self.total, self.finished = 0.0, False
        kwargs = _accepted(self.env.reset, fields)
        params = inspect.signature(self.env.reset).parameters
        if "seed" in params and "seed" not in kwargs:
            kwargs["seed"] = example_seed(fields)
        if "episode_id" in params and "episode_id" not in kwargs and fields.get("id") is not None:
            kwargs["episode_id"] = str(fields["id"])
        obs = _resolve(self.env.reset(**kwargs))
        return None if obs is None else cut(observation_text(obs), self.max_obs_chars)[0]

    def _step(self, action: Any, role: str, name: str | None, events: Counter) -> dict:
        """One env.step(action), with its timeout: the message of its observation (or of its failure)."""
        out = call_with_timeout(lambda: self.env.step(action), {}, self.timeout_s, convert=False, here=self.here)
        head = {"role": role, **({"name": name} if name else {})}
        if out is None or isinstance(out, Raised):
            self.finished = True
            events["timeout" if out is None else "exception"] += 1
            why = (f"timed out after {self.timeout_s:g} s" if out is None else f"failed: {short_error(out.error)}")
            return {**head, "content": f"Error: the environment {why}"}
        reward = getattr(out, "reward", None)
        self.total += 0.0 if reward is None else float(reward)
        self.finished = bool(getattr(out, "done", False))
        text, removed = cut(observation_text(out), self.max_obs_chars)
        if removed:
            events["truncated"] += 1
        return {**head, "content": text}

    def step(self, turn_text: str) -> Reply:
        """A text action: the turn is the action. A structured one: each tool call of the turn is a step."""
        if self.finished:
            return Reply(done=True)
        events: Counter = Counter()
        if self.field is not None:
            message = self._step(self.action_cls.model_validate({self.field: turn_text}), "user", None, events)
            return Reply([message], done=self.finished, events=events)
        items = parse_tool_calls(turn_text)
        if not items:
            return Reply(done=True)
        name = self.action_cls.__name__
        reply = Reply(parsed=list(items), events=events)
        for item in items:
            if isinstance(item, ParseError):
                events["parse"] += 1
                reply.messages.append({"role": "tool", "content": f"Error: could not parse the tool call: {item.reason}."})
                continue
            if item.name != name:
                events["unknown_tool"] += 1
                reply.messages.append({"role": "tool", "name": item.name[:100],
                                       "content": f"Error: unknown tool {item.name[:100]!r}. Available tools: {name}."})
                continue
            reply.calls[name] += 1
            try:
                action = self.action_cls.model_validate(item.arguments)
            except Exception as e:  # noqa: BLE001 - pydantic's ValidationError: the model's arguments are wrong
                events["bad_arguments"] += 1
                reply.messages.append({"role": "tool", "name": name,
                                       "content": f"Error: bad arguments for tool {name!r}: {short_error(e)}."})
                continue
            reply.messages.append(self._step(action, "tool", name, events))
            if self.finished:
                break
        reply.done = self.finished
        return reply

    def reward(self) -> float | None:
        """The sum of the observations' rewards since reset."""
        return self.total

    def close(self) -> None:
        """The environment's own close(), if it has one (OpenEnv's do)."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
