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
  / `timeout`): the environment's state is unknown after it, as for GymAdapter, and the instance is
  not used again.
- instances are pooled (adapters.InstancePool), as TRL's GRPOTrainer pools environment_factory's:
  made when more are needed at once than exist, reset for each trajectory, so an environment that
  advances through its own data on reset() serves its next item each time.

An MCP environment (OpenEnv's `MCPEnvironment`, or one whose step takes `CallToolAction`, as
echo_env does) offers its MCP tools instead: `step(ListToolsAction())` lists them once per
instance (name, description, input_schema: the tools shown to the model, as TRL's OpenEnv harness
shows them), and each <tool_call> of a turn is `step(CallToolAction(tool_name=..., arguments=...))`,
run through grpolab.env.runner.ToolRunner (unknown tools, arguments checked against the tool's
schema, timeouts, cut results). The observation's `error` is the call's error message; its
`result` (a fastmcp CallToolResult's `.data`, else its text content, else the value as it is) the
tool message; a list reaches the reward functions as the list. An MCP environment that lists no
tool is refused with the reason (its listing's error, if it gave one).
"""

from __future__ import annotations

import inspect
import json
import threading
import typing
import weakref
from collections import Counter
from typing import Any

from grpolab.env.adapters import InstancePool, _accepted, _resolve
from grpolab.env.base import EnvironmentShapeError, Reply, example_seed
from grpolab.env.calls import ParseError, parse_tool_calls
from grpolab.env.runner import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TIMEOUT_S, ToolRunner, cut
from grpolab.env.timeouts import Raised, call_with_timeout, short_error

OBSERVATION_BASE_FIELDS = ("done", "reward", "metadata")
"""Fields every OpenEnv observation has; the rest are the environment's own."""


def is_model_class(obj: Any) -> bool:
    """A pydantic model class (duck-typed: model_validate and model_json_schema)."""
    return (
        inspect.isclass(obj)
        and callable(getattr(obj, "model_validate", None))
        and callable(getattr(obj, "model_json_schema", None))
    )


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
    params: dict = {
        "type": "object",
        "properties": props,
        "required": [r for r in schema.get("required", []) if r != "metadata"],
    }
    if "$defs" in schema:
        params["$defs"] = schema["$defs"]
    doc = inspect.getdoc(action_cls) or f"Take the action {action_cls.__name__}."
    return {
        "type": "function",
        "function": {"name": action_cls.__name__, "description": doc.split("\n\n")[0], "parameters": params},
    }


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


def mcp_actions(env_cls: type) -> tuple[type, type] | None:
    """(ListToolsAction, CallToolAction) for an MCP environment: an OpenEnv MCPEnvironment subclass, or a
    class whose step annotation names CallToolAction (openenv's own classes); None for any other."""
    names = {base.__name__ for base in env_cls.__mro__}
    step = getattr(env_cls, "step", None)
    try:
        hint = typing.get_type_hints(step).get(
            next(p.name for p in inspect.signature(step).parameters.values() if p.name != "self")
        )
    except Exception:  # noqa: BLE001 - no readable annotation
        hint = None
    named = {getattr(a, "__name__", "") for a in (typing.get_args(hint) or (hint,))}
    if "MCPEnvironment" not in names and "CallToolAction" not in named:
        return None
    from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction  # installed: it subclasses it

    return ListToolsAction, CallToolAction


class MCPToolError(RuntimeError):
    """A CallToolObservation's `error` (its error_type and message): the tool message says it."""


_listed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""MCP environment instance -> its tools' schemas (listed once per pooled instance)."""
_listed_lock = threading.Lock()


def mcp_tools(env: Any, list_action: type, timeout_s: float, here: bool) -> list[dict]:
    """The OpenAI function schemas of an MCP environment's tools, from step(ListToolsAction()); refused
    (EnvironmentShapeError, with the reason) when the listing fails or is empty."""
    with _listed_lock:
        hit = _listed.get(env)
    if hit is not None:
        return hit
    name = type(env).__name__
    out = call_with_timeout(lambda: env.step(list_action()), {}, timeout_s, convert=False, here=here)
    if out is None or isinstance(out, Raised):
        why = f"timed out after {timeout_s:g} s" if out is None else f"raised {short_error(out.error)}"
        raise EnvironmentShapeError(f"{name}: listing its MCP tools (step(ListToolsAction())) {why}")
    tools = list(getattr(out, "tools", None) or [])
    if not tools:
        error = (getattr(out, "metadata", None) or {}).get("error")
        raise EnvironmentShapeError(
            f"{name} is an MCP environment but listed no tools"
            + (f" ({error})" if error else "")
            + "; register tools on its FastMCP server "
            "(@mcp.tool) before super().__init__(mcp)"
        )
    schemas = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or f"The MCP tool {t.name}.",
                "parameters": dict(t.input_schema or {"type": "object", "properties": {}}),
            },
        }
        for t in tools
    ]
    try:
        with _listed_lock:
            _listed[env] = schemas
    except TypeError:  # an object without weak references: listed again next time
        pass
    return schemas


def mcp_result(obs: Any) -> Any:
    """What a tool call returned, from its CallToolObservation: fastmcp's CallToolResult gives `.data`
    (the tool's value), else its text content; a plain result is taken as it is. An `error` raises."""
    error = getattr(obs, "error", None)
    if error is not None:
        kind = getattr(getattr(error, "error_type", None), "value", None) or "error"
        raise MCPToolError(f"{kind}: {getattr(error, 'message', error)}")
    result = getattr(obs, "result", obs)
    if getattr(result, "is_error", False):
        raise MCPToolError("; ".join(getattr(c, "text", str(c)) for c in getattr(result, "content", None) or []))
    if getattr(result, "data", None) is not None:
        return result.data
    content = getattr(result, "content", None)
    if isinstance(content, list) and hasattr(result, "structured_content"):
        texts = [getattr(c, "text", None) for c in content]
        return "\n".join(t for t in texts if t is not None)
    return result


class OpenEnvAdapter:
    """A pooled OpenEnv-style environment instance for one trajectory (see the module docstring)."""

    def __init__(
        self,
        env: Any,
        *,
        action_cls: type | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_obs_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
        pool: InstancePool | None = None,
    ) -> None:
        if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
            raise EnvironmentShapeError(f"OpenEnvAdapter: {type(env).__name__} needs reset() and step(action).")
        self.env, self._pool, self.broken, self._closed = env, pool, False, False
        self.timeout_s, self.max_obs_chars, self.here = timeout_s, max_obs_chars, here
        self.total, self.finished = 0.0, False
        self.mcp = mcp_actions(type(env)) if action_cls is None else None
        self.runner = None
        if self.mcp is not None:
            try:
                self.tools = mcp_tools(env, self.mcp[0], timeout_s, here)
            except EnvironmentShapeError:
                self.close()
                raise
            self.action_cls, self.field = self.mcp[1], None
            self.runner = ToolRunner(
                {t["function"]["name"]: self._mcp_call(t["function"]["name"]) for t in self.tools},
                {t["function"]["name"]: t for t in self.tools},
                timeout_s=timeout_s,
                max_result_chars=max_obs_chars,
                here=here,
            )
            return
        self.action_cls = action_cls or action_class(type(env))
        if self.action_cls is None:
            self.close()
            raise EnvironmentShapeError(
                f"{type(env).__name__}: cannot tell its action class; annotate step's parameter with it "
                "(def step(self, action: MyAction)), a pydantic model"
            )
        self.field = text_field(self.action_cls)
        self.tools = [] if self.field else [action_tool(self.action_cls)]

    def _mcp_call(self, name: str):
        """The tool function ToolRunner calls for MCP tool `name`: one step(CallToolAction(...))."""

        def call(**arguments):
            obs = self.env.step(self.mcp[1](tool_name=name, arguments=arguments))
            reward = getattr(obs, "reward", None)
            self.total += 0.0 if reward is None else float(reward)
            self.finished = self.finished or bool(getattr(obs, "done", False))
            return mcp_result(obs)

        call.__name__ = name
        return call

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
            self.finished = self.broken = True  # its state is unknown: not handed to another trajectory
            events["timeout" if out is None else "exception"] += 1
            why = f"timed out after {self.timeout_s:g} s" if out is None else f"failed: {short_error(out.error)}"
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
        if self.runner is not None:  # MCP: each call of the turn is a CallToolAction step, until one is done
            items = parse_tool_calls(turn_text)
            if not items:
                return Reply(done=True)
            reply = Reply(parsed=list(items))
            for item in items:
                self.runner.add(reply, self.runner.run_one(item, reply.events, reply.calls))
                if self.finished:
                    break
            self.broken = self.broken or bool(reply.events["timeout"])  # a call still running in it: not reused
            reply.done = self.finished
            return reply
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
                reply.messages.append(
                    {"role": "tool", "content": f"Error: could not parse the tool call: {item.reason}."}
                )
                continue
            if item.name != name:
                events["unknown_tool"] += 1
                reply.messages.append(
                    {
                        "role": "tool",
                        "name": item.name[:100],
                        "content": f"Error: unknown tool {item.name[:100]!r}. Available tools: {name}.",
                    }
                )
                continue
            reply.calls[name] += 1
            try:
                action = self.action_cls.model_validate(item.arguments)
            except Exception as e:  # noqa: BLE001 - pydantic's ValidationError: the model's arguments are wrong
                events["bad_arguments"] += 1
                reply.messages.append(
                    {
                        "role": "tool",
                        "name": name,
                        "content": f"Error: bad arguments for tool {name!r}: {short_error(e)}.",
                    }
                )
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
        """Back to the pool for the next trajectory (once); an instance left in an unknown state by a failed
        or timed-out step, or one without a pool, is closed instead (its own close(), as OpenEnv's have)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None and not self.broken:
            self._pool.release(self.env)
            return
        close = getattr(self.env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - a broken instance that cannot close either is dropped
                pass
