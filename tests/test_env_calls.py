"""Parsing Hermes/Qwen tool calls out of a model turn: every block, in order, hostile input bounded."""

import json
import time

from grpolab.env.calls import MAX_BLOCK_CHARS, MAX_CALLS, ParseError, ToolCall, has_tool_call, parse_tool_calls


def block(payload) -> str:
    return f"<tool_call>\n{payload if isinstance(payload, str) else json.dumps(payload)}\n</tool_call>"


def test_no_call_is_an_empty_list():
    assert parse_tool_calls("The answer is 42.") == []
    assert not has_tool_call("The answer is 42.")


def test_one_qwen_style_call():
    text = "Let me compute.\n" + block({"name": "calculator", "arguments": {"expression": "2+3"}})
    (call,) = parse_tool_calls(text)
    assert call == ToolCall("calculator", {"expression": "2+3"}, raw=call.raw)
    assert json.loads(call.raw)["name"] == "calculator"


def test_several_calls_in_one_turn_keep_their_order():
    text = "".join(block({"name": f"t{i}", "arguments": {"i": i}}) + " text " for i in range(5))
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["t0", "t1", "t2", "t3", "t4"]
    assert [c.arguments["i"] for c in calls] == list(range(5))


def test_missing_arguments_means_no_arguments():
    (call,) = parse_tool_calls(block({"name": "now"}))
    assert call == ToolCall("now", {}, raw=call.raw)


def reason_of(text: str) -> str:
    (item,) = parse_tool_calls(text)
    assert isinstance(item, ParseError), item
    return item.reason


def test_every_malformed_block_is_a_parse_error_with_a_reason():
    assert "malformed JSON" in reason_of(block('{"name": "f", "arguments": {"x": 1}'))
    assert 'missing "name"' in reason_of(block({"arguments": {}}))
    assert "non-empty string" in reason_of(block({"name": 3, "arguments": {}}))
    assert "non-empty string" in reason_of(block({"name": "  ", "arguments": {}}))
    assert "must be a JSON object, got a string" in reason_of(block({"name": "f", "arguments": '{"x": 1}'}))
    assert "must be a JSON object, got list" in reason_of(block({"name": "f", "arguments": [1]}))
    assert "expected a JSON object" in reason_of(block("[1, 2]"))
    assert "empty" in reason_of("<tool_call>  </tool_call>")
    assert "NaN is not valid JSON" in reason_of(block('{"name": "f", "arguments": {"x": NaN}}'))
    assert "duplicate key 'x'" in reason_of(block('{"name": "f", "arguments": {"x": 1, "x": 2}}'))
    assert "nested deeper" in reason_of(block('{"name": "f", "arguments": {"x": ' + "[" * 40 + "]" * 40 + "}}"))


def test_unclosed_block_is_reported_and_parsing_goes_on():
    good = block({"name": "g", "arguments": {}})
    items = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}\n' + good + '\n<tool_call>{"name": "h"')
    assert [type(i) for i in items] == [ParseError, ToolCall, ParseError]
    assert all("without a closing" in i.reason for i in (items[0], items[2]))
    assert items[1].name == "g"


def test_number_of_blocks_is_capped():
    text = block({"name": "f", "arguments": {}}) * (MAX_CALLS + 10)
    items = parse_tool_calls(text)
    assert len(items) == MAX_CALLS + 1
    assert all(isinstance(i, ToolCall) for i in items[:MAX_CALLS])
    assert isinstance(items[-1], ParseError) and f"more than {MAX_CALLS}" in items[-1].reason


def test_long_block_is_refused_without_decoding_and_raw_is_cut():
    payload = json.dumps({"name": "f", "arguments": {"x": "a" * (MAX_BLOCK_CHARS + 10)}})
    (item,) = parse_tool_calls(block(payload))
    assert isinstance(item, ParseError) and "longer than" in item.reason
    assert len(item.raw) < 300


def test_huge_hostile_input_is_quick():
    hostile = [
        "<tool_call>" * 200_000,
        "<tool_call>" + "[" * 1_000_000,
        block("{" * 8000),
        "x" * 2_000_000 + block({"name": "f"}),
        ("<tool_call>{}</tool_call>" * 100_000),
    ]
    t = time.monotonic()
    for text in hostile:
        items = parse_tool_calls(text)
        assert len(items) <= MAX_CALLS + 1
    assert time.monotonic() - t < 2.0


# ----------------------------------------------------------------------------- Llama 3.x bare calls


def test_a_llama_turn_is_one_bare_json_call():
    """Llama 3.1/3.2's templates write a call as the whole turn, `{"name": ..., "parameters": {...}}`, no tags:
    read as the call (the whitespace around it aside); "arguments" in its place is read too."""
    text = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    assert parse_tool_calls(text) == [ToolCall("add", {"a": 2, "b": 3}, raw=text)]
    assert parse_tool_calls("\n " + text + " \n") == [ToolCall("add", {"a": 2, "b": 3}, raw=text)]
    assert parse_tool_calls('{"name": "add", "arguments": {"a": 1}}')[0].arguments == {"a": 1}
    now = '{ "name" : "now", "parameters" : {} }'
    assert parse_tool_calls(now) == [ToolCall("now", {}, raw=now)]
    assert has_tool_call(text) and has_tool_call(" " + text)


def test_text_that_is_not_a_bare_call_is_a_final_answer():
    """Only a turn that opens with `{"name": "<tool>", "parameters":` is read as a call: prose, a call quoted
    inside prose, and JSON answers of other shapes (a record with a "name" field) are answers, as before."""
    answers = ['The answer is {"name": "add", "parameters": {}}.', '{"name": "Ada", "age": 36}', '{"answer": 5}']
    for text in [*answers, '{"name": "now"}', "[1, 2]", "{}", "5"]:
        assert parse_tool_calls(text) == [] and not has_tool_call(text), text


def bare_reason(text: str) -> str:
    (item,) = parse_tool_calls(text)
    assert isinstance(item, ParseError) and item.expected == '{"name": "<tool>", "parameters": {...}} as the whole turn'
    return item.reason


def test_a_malformed_bare_call_is_a_parse_error_in_llamas_format():
    """A turn that opens like a bare call but is not exactly one is a ParseError (never a final answer), its
    reason the strict reader's, and `expected` says how Llama writes a call."""
    assert "malformed JSON" in bare_reason('{"name": "add", "parameters": {"a": 2, "b": 3}')
    assert "malformed JSON" in bare_reason('{"name": "add", "parameters": {}} and then I will answer.')
    assert "malformed JSON" in bare_reason('{"name": "add", "parameters": {}}\n{"name": "add", "parameters": {}}')
    assert '"parameters" must be a JSON object, got a string' in bare_reason('{"name": "add", "parameters": "a=2"}')
    assert "non-empty string" in bare_reason('{"name": " ", "parameters": {}}')
    assert "duplicate key 'a'" in bare_reason('{"name": "add", "parameters": {"a": 1, "a": 2}}')
    assert "longer than" in bare_reason('{"name": "f", "parameters": {"x": "' + "a" * MAX_BLOCK_CHARS + '"}}')
    assert parse_tool_calls('{"name": "f"} ' + block({"name": "g"}))[0].name == "g"  # tags win: Hermes format
    deep = '{"name": "f", "parameters": ' + "[" * 1_000_000  # refused on its length alone, never decoded
    assert "longer than" in bare_reason(deep) and "longer than" in bare_reason(" " * 100_000 + deep)


def test_a_llama_call_runs_and_a_malformed_one_gets_the_error_message():
    """Worked example through a tool environment: the bare call runs the tool (2 + 3 -> "5"); a malformed one is
    one tool message saying what is wrong and how Llama writes a call, and counts one parse event."""
    from grpolab.env import FunctionTools

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    env = FunctionTools([add])
    ok = env.step('{"name": "add", "parameters": {"a": 2, "b": 3}}')
    assert [m["content"] for m in ok.messages] == ["5"] and not ok.done and ok.events["parse"] == 0
    bad = env.step('{"name": "add", "parameters": {"a": 2, "b": 3}')
    (message,) = bad.messages
    assert message["content"].startswith("Error: could not parse the tool call: malformed JSON")
    assert message["content"].endswith('Write {"name": "<tool>", "parameters": {...}} as the whole turn.')
    assert bad.events["parse"] == 1 and not bad.done
    assert env.step("It is 5.").done
