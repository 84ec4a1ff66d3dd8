"""The tool_call reward, strict JSON and the built-in tools."""

from __future__ import annotations

import json

import pytest

from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.tool_call import StrictJSONError, strict_json_loads, tool_call_score
from grpolab.rewards.tools import (
    TOOL_SPECS,
    ToolError,
    calculator,
    convert_units,
    date_add,
    date_diff,
    run_tool,
    weekday,
)
from grpolab.util.fields import ConfigError

EX = Example(
    prompt="",
    answer="",
    meta={
        "tools": [TOOL_SPECS["calculator"], TOOL_SPECS["date_add"]],
        "expected_tool": "calculator",
        "expected_result": 409.5,
    },
)


def call(name, args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_calculator_is_exact_and_safe():
    assert calculator("0.175 * 2340") == 409.5
    assert calculator("17.5 / 100 * 2340") == 409.5
    assert calculator("(1 + 2) * -3") == -9
    assert calculator("2 ** 10") == 1024 and calculator("2^-1") == 0.5
    assert calculator("1/3 + 1/3 + 1/3") == 1
    for bad in ("9**9**9", "2 ** 0.5", "1/0", "__import__('os')", "a + 1", "", "(1", "1 +", "1e5", "1" * 40):
        with pytest.raises(ToolError):
            calculator(bad)


def test_other_tools():
    assert convert_units(1, "mi", "km") == 1.609344
    assert convert_units(100, "C", "F") == 212.0 and convert_units(0, "C", "K") == 273.15
    with pytest.raises(ToolError):
        convert_units(1, "kg", "m")
    assert date_add("2024-02-27", 3) == "2024-03-01" and date_add("2024-03-01", -1) == "2024-02-29"
    assert date_diff("2024-01-01", "2024-03-01") == 60
    assert weekday("2024-03-01") == "Friday"
    with pytest.raises(ToolError):
        date_add("9999-12-31", 10)
    with pytest.raises(ToolError):
        run_tool("weekday", {"date": "2024-13-01"})


def test_strict_json():
    assert strict_json_loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    for bad in (
        '{"a": NaN}',
        '{"a": -Infinity}',
        '{"a": 1e400}',
        '{"a": 1, "a": 2}',
        '{"a": 1234567890123456789}',
        "[" * 20 + "]" * 20,
        "{'a': 1}",
        '{"a": 1,}',
        "x" * 5000,
    ):
        with pytest.raises(StrictJSONError):
            strict_json_loads(bad)


@pytest.mark.parametrize(
    "completion,expected",
    [
        (call("calculator", {"expression": "0.175 * 2340"}), 1.0),
        (call("calculator", {"expression": "2340 * 17.5 / 100"}), 1.0),
        (call("calculator", {"expression": "2340 * 17 / 100"}), 0.0),
        (call("calculator", {"expression": "1/0"}), 0.0),
        (call("date_add", {"date": "2024-01-01", "days": 1}), 0.0),  # valid but not the expected tool
        (call("calculator", {"expr": "1"}), 0.0),
        (call("weather", {"city": "Paris"}), 0.0),
        ("I think it's 409.5", 0.0),
        (call("calculator", {"expression": "1"}) + call("calculator", {"expression": "0.175 * 2340"}), 1.0),
        (call("calculator", {"expression": "0.175 * 2340"}) + call("calculator", {"expression": "1"}), 0.0),
    ],
)
def test_tool_call_score(completion, expected):
    assert tool_call_score(completion, EX) == expected


def test_partial_credit_stages():
    kw = {"partial_parse": 0.1, "partial_tool": 0.2, "partial_args": 0.5}
    assert tool_call_score(call("weather", {}), EX, **kw) == 0.1
    assert tool_call_score(call("calculator", {"expr": "1"}), EX, **kw) == 0.2
    assert tool_call_score(call("calculator", {"expression": "1"}), EX, **kw) == 0.5
    assert tool_call_score("<tool_call>{bad</tool_call>", EX, **kw) == 0.0


def test_expected_arguments_mode():
    spec = {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"],
            "additionalProperties": False,
        },
    }
    ex = Example(prompt="", answer="", meta={"tools": [spec], "expected_arguments": {"id": 7}})
    assert tool_call_score(call("lookup", {"id": 7}), ex) == 1.0
    assert tool_call_score(call("lookup", {"id": 8}), ex) == 0.0
    assert tool_call_score(call("lookup", {"id": True}), ex) == 0.0


def test_build_tool_call():
    (rf,) = build_rewards([{"name": "tool_call", "partial_parse": 0.1}])
    assert rf.fn(call("calculator", {"expression": "0.175*2340"}), EX) == 1.0
    with pytest.raises(ConfigError, match="partial_tool"):
        build_rewards([{"name": "tool_call", "partial_parse": 0.5, "partial_tool": 0.2, "partial_args": 0.2}])
    with pytest.raises(ConfigError, match="max_depth"):
        build_rewards([{"name": "tool_call", "max_depth": 0}])


ROW = {"expression": "0.175 * 2340"}


@pytest.mark.parametrize(
    "completion,runs,expected",
    [
        (call("calculator", ROW), True, 1.0),  # Hermes/Qwen
        (json.dumps({"name": "calculator", "parameters": ROW}), True, 1.0),  # Llama 3.x: the whole turn
        ("\n " + json.dumps({"name": "calculator", "parameters": ROW}) + "\n", True, 1.0),
        (json.dumps({"name": "calculator", "arguments": ROW}), True, 1.0),  # bare, "arguments" as the key
        (json.dumps({"name": "calculator", "parameters": {"expression": "1"}}), True, 0.0),  # wrong result
        (json.dumps({"name": "calculator", "parameters": ROW}) + " so it is 409.5", False, 0.0),  # text after
        ('{"name": "calculator", "parameters": {"expression": "0.175 * 2340"}', False, 0.0),  # unclosed
        ("The answer: " + json.dumps({"name": "calculator", "parameters": ROW}), False, 0.0),  # not the whole turn
    ],
)
def test_both_call_formats_score_as_the_environment_reads_them(completion, runs, expected):
    """The reward reads a completion's calls with the environments' parser (grpolab.util.tool_calls): a Llama
    3.x bare call scores as its Hermes block does, and what the environment would not run as a call scores 0."""
    from grpolab.env.calls import ToolCall, parse_tool_calls

    calls = parse_tool_calls(completion)
    assert (bool(calls) and isinstance(calls[-1], ToolCall)) == runs  # what the environment reads
    assert tool_call_score(completion, EX) == expected


def test_the_reward_reads_what_the_environment_runs():
    """Keys besides name and arguments are ignored and a missing "arguments" is {} (the environment runs such a
    call); the last call is scored, an unclosed last block is no call, as the environment reads the turn."""
    from grpolab.env.calls import ToolCall, parse_tool_calls

    extra = '<tool_call>{"name": "calculator", "arguments": {"expression": "0.175*2340"}, "id": 1}</tool_call>'
    assert isinstance(parse_tool_calls(extra)[0], ToolCall) and tool_call_score(extra, EX) == 1.0
    no_args = '<tool_call>{"name": "calculator"}</tool_call>'
    assert parse_tool_calls(no_args)[0].arguments == {}
    assert tool_call_score(no_args, EX, partial_parse=0.1, partial_tool=0.2) == 0.2  # parsed; {} lacks "expression"
    unclosed = call("calculator", ROW) + '<tool_call>{"name": "calculator"'
    assert tool_call_score(unclosed, EX) == 0.0
    assert tool_call_score(call("calculator", ROW), EX, max_chars=10) == 0.0  # the reward's own bound
