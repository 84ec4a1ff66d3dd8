"""Built-in environments: retry_arithmetic, guess_number, calculator_python (its python tool runs in the sandbox)."""

import json
from fractions import Fraction

import pytest

from grpolab.env import EnvConfigError, Environment, load_environment, run_turns
from grpolab.env.builtin import ENVIRONMENTS, final_answer


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def play(env, fields: dict, turns: list[str]):
    """Reset, then step through the turns until the environment says done; the replies."""
    env.reset(fields)
    replies = []
    for turn in turns:
        replies.append(env.step(turn))
        if replies[-1].done:
            break
    return replies


def test_registry_and_contract():
    assert set(ENVIRONMENTS) == {"retry_arithmetic", "guess_number", "calculator_python"}
    for name in ENVIRONMENTS:
        assert isinstance(load_environment(name)(), Environment)


def test_final_answer_prefers_the_answer_tag_then_the_last_number():
    assert final_answer("3 + 4 = 7, so 7") == 7
    assert final_answer("I think <answer>12</answer> but maybe 13") == 12
    assert final_answer("<answer>x = -2.5</answer>") == Fraction(-5, 2)
    assert final_answer("It is 1,234.") == 1234
    assert final_answer("no idea") is None


def test_retry_arithmetic_right_first_time():
    env = load_environment("retry_arithmetic")()
    (reply,) = play(env, {"prompt": "What is 6 * 7?", "answer": 42}, ["6 * 7 = 42"])
    assert reply.done and reply.messages == [] and env.reward() == 1.0


def test_retry_arithmetic_uses_feedback_and_the_reward_falls_per_turn():
    env = load_environment("retry_arithmetic")()
    replies = play(env, {"answer": "42"}, ["It is 41.", "Hmm, no number", "<answer>42</answer>"])
    assert [r.done for r in replies] == [False, False, True]
    assert replies[0].messages == [{"role": "user", "content": "That is not right. Try again."}]
    assert env.reward() == 0.5
    assert env.step("42").done  # nothing after the end
    play(env, {"answer": 2.5}, ["2.5"])
    assert env.reward() == 1.0  # reset starts over


def test_retry_arithmetic_never_right_and_floor():
    env = load_environment("retry_arithmetic")()
    play(env, {"answer": 3}, ["4"] * 6)
    assert env.reward() == 0.0
    play(env, {"answer": 3}, ["4"] * 5 + ["3"])
    assert env.reward() == 0.0  # right on turn 6: 1 - 0.25 * 5 floors at 0


def test_retry_arithmetic_field_errors():
    env = load_environment("retry_arithmetic")()
    with pytest.raises(EnvConfigError, match="no field 'answer' \\(it has: prompt\\)"):
        env.reset({"prompt": "x"})
    with pytest.raises(EnvConfigError, match="must be a number"):
        env.reset({"answer": "forty-two"})


def test_guess_number_hints_and_reward():
    env = load_environment("guess_number")()
    replies = play(env, {"secret": 37, "lo": 1, "hi": 100}, ["50", "I guess 25", "zero?", "200", "<answer>37</answer>"])
    assert [r.messages[0]["content"] for r in replies] == [
        "Lower.",
        "Higher.",
        "Answer with one whole number between 1 and 100.",
        "The number is between 1 and 100.",
        "Correct!",
    ]
    assert [r.done for r in replies] == [False] * 4 + [True]
    assert env.reward() == pytest.approx(0.6)
    play(env, {"secret": 5, "lo": 1, "hi": 9}, ["maybe five"])
    assert not env.found_at and env.reward() == 0.0
    with pytest.raises(EnvConfigError, match="lo <= secret <= hi"):
        env.reset({"secret": 0, "lo": 1, "hi": 9})


def test_calculator_python_tools():
    env = load_environment("calculator_python")()
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "python"]
    env.reset({"prompt": "What is 2**10 + 1/4?", "answer": "1024.25"})
    reply = env.step(
        "Let me compute. "
        + call("calculator", expression="2**10 + 1/4")
        + call("python", code="import math\nprint(math.comb(10, 3))\nprint(sum(range(5)))")
    )
    assert [m["content"] for m in reply.messages] == ["1024.25", "120\n10"]
    assert reply.calls == {"calculator": 1, "python": 1} and not reply.events
    assert env.reward() is None  # the task's verifier scores the final answer


def test_calculator_python_errors_reach_the_model():
    env = load_environment("calculator_python")()
    env.reset({})
    reply = env.step(
        call("calculator", expression="__import__('os')")
        + call("python", code="print(1)\n1/0")
        + call("python", code="x = 1")
        + call("python", code=123)
    )
    contents = [m["content"] for m in reply.messages]
    assert contents[0].startswith("Error: tool 'calculator' raised ToolError")
    assert contents[1] == "1\nError: ZeroDivisionError: division by zero"
    assert contents[2].startswith("(the program printed nothing")
    assert "'code' must be a string" in contents[3]
    assert reply.events == {"exception": 1, "bad_arguments": 1}


def test_python_tool_is_stopped_by_the_sandbox():
    env = load_environment("calculator_python", options={"timeout_s": 1.0})()
    env.reset({})
    reply = env.step(call("python", code="print('start', flush=True)\nwhile True:\n    pass"))
    assert "ran longer than 1 s and was stopped" in reply.messages[0]["content"]


def test_a_mixed_batch_steps_together():
    makers = [load_environment(n) for n in ("retry_arithmetic", "guess_number", "calculator_python")]
    envs = [m() for m in makers]
    for env, fields in zip(envs, [{"answer": 5}, {"secret": 3, "lo": 1, "hi": 5}, {}]):
        env.reset(fields)
    replies = run_turns(envs, ["5", "4", call("calculator", expression="6*7")])
    assert replies[0].done and envs[0].reward() == 1.0
    assert replies[1].messages[0]["content"] == "Lower."
    assert replies[2].messages[0]["content"] == "42"
