"""The `tool_call` reward: the completion's last tool call, read as the environments read it, checked strictly.

The calls are read by the one tool-call parser, grpolab.util.tool_calls (the environments' too): Hermes/Qwen
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, or Llama 3.x's bare call, the whole
completion one `{"name": ..., "parameters": {...}}` object. The last call read is scored in stages; each
stage must pass before the next is tried, and the score is that of the last stage reached:

    1. the last call parses (strict JSON, see strict_json_loads: a string "name", "arguments" (Llama:
       "parameters") an object, or absent for {}; other keys ignored, as the environments ignore
       them)                                                           -> partial_parse
    2. the name is one of the tools offered in example.meta["tools"]  -> partial_tool
    3. the arguments are valid against that tool's JSON schema        -> partial_args
    4. the call is right                                               -> 1.0
       - meta["expected_arguments"] given: arguments equal them (type-strict), or
       - meta["expected_result"] given: executing the built-in tool returns it
       and, if meta["expected_tool"] is given, the name matches it.

partial_parse defaults to 0 and each later stage to the one before (so by default the reward is
binary); they must be non-decreasing.
"""

from __future__ import annotations

import json
from functools import lru_cache

import jsonschema

from grpolab.batch import Example
from grpolab.rewards.tools import TOOL_FUNCTIONS, ToolError, run_tool
from grpolab.util.fields import ConfigError
from grpolab.util.strict_json import StrictJSONError, strict_json_loads
from grpolab.util.tool_calls import ToolCall, parse_tool_calls
from grpolab.util.values import plain_equal

__all__ = ["StrictJSONError", "last_call", "make_tool_call", "strict_json_loads", "tool_call_score", "validate_args"]


def last_call(completion: str, *, max_chars: int = 4096, max_depth: int = 8) -> ToolCall | None:
    """The completion's last tool call as grpolab.util.tool_calls reads it (a block longer than `max_chars`
    or nested deeper than `max_depth` does not parse), or None when there is none or it does not parse."""
    calls = parse_tool_calls(completion, max_chars=max_chars, max_depth=max_depth)
    return calls[-1] if calls and isinstance(calls[-1], ToolCall) else None


@lru_cache(maxsize=256)
def _validator(schema_json: str):
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate_args(schema: dict, args: dict) -> bool:
    """True if args are valid against the JSON schema (draft from $schema, default 2020-12)."""
    v = _validator(json.dumps(schema, sort_keys=True))
    return v.is_valid(args)


def tool_call_score(
    completion: str,
    example: Example,
    *,
    partial_parse: float = 0.0,
    partial_tool: float = 0.0,
    partial_args: float = 0.0,
    max_chars: int = 4096,
    max_depth: int = 8,
) -> float:
    """Score one completion (see the module docstring)."""
    meta = example.meta
    tools = {t["name"]: t for t in meta.get("tools", [])}
    if not tools:
        raise ValueError("tool_call reward needs example.meta['tools']")
    call = last_call(completion, max_chars=max_chars, max_depth=max_depth)
    if call is None:
        return 0.0
    name, args = call.name, call.arguments
    if name not in tools:
        return partial_parse
    if not validate_args(tools[name].get("parameters", {"type": "object"}), args):
        return partial_tool
    if meta.get("expected_tool") is not None and name != meta["expected_tool"]:
        return partial_args
    if "expected_arguments" in meta:
        return 1.0 if plain_equal(meta["expected_arguments"], args, rel_tol=1e-9) else partial_args
    if "expected_result" in meta:
        if name not in TOOL_FUNCTIONS:
            raise ValueError(f"cannot execute tool {name!r}: not a built-in tool")
        try:
            result = run_tool(name, args)
        except ToolError:
            return partial_args
        return 1.0 if plain_equal(meta["expected_result"], result, rel_tol=1e-9) else partial_args
    raise ValueError("tool_call reward needs meta['expected_arguments'] or meta['expected_result']")


def make_tool_call(
    partial_parse: float = 0.0,
    partial_tool: float | None = None,
    partial_args: float | None = None,
    max_chars: int = 4096,
    max_depth: int = 8,
):
    """Build the `tool_call` reward (see the module docstring).

    partial_parse / partial_tool / partial_args: credit for reaching stage 1 / 2 / 3 only
    (non-decreasing, in [0, 1]; an unset stage takes the previous stage's value).
    max_chars: longest accepted payload.  max_depth: deepest nesting.
    """
    partial_tool = partial_parse if partial_tool is None else partial_tool
    partial_args = partial_tool if partial_args is None else partial_args
    vals = {"partial_parse": partial_parse, "partial_tool": partial_tool, "partial_args": partial_args}
    for key, v in vals.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ConfigError(f"tool_call: {key} must be a number in [0, 1], got {v!r}")
    if not partial_parse <= partial_tool <= partial_args:
        raise ConfigError("tool_call: need partial_parse <= partial_tool <= partial_args")
    for key, v in (("max_chars", max_chars), ("max_depth", max_depth)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"tool_call: {key} must be a positive integer, got {v!r}")

    def tool_call_reward(completion: str, example: Example) -> float:
        return tool_call_score(
            completion,
            example,
            partial_parse=float(partial_parse),
            partial_tool=float(partial_tool),
            partial_args=float(partial_args),
            max_chars=max_chars,
            max_depth=max_depth,
        )

    return tool_call_reward
