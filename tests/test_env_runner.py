"""Running a turn's tool calls: each failure is an error message for the model AND a counted event."""

import json
import threading
import time

import pytest

from grpolab.env import FunctionTools, Reply, ToolRunner, parse_tool_calls, run_turns, stuck_calls
from grpolab.env.adapters import cached_schema

LOG: list = []
RELEASE = threading.Event()


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    LOG.append(("add", a, b))
    return a + b


def scale(x: float) -> float:
    """Double a number.

    Args:
        x: The number.
    """
    LOG.append(("scale", x))
    return 2 * x


def fail(message: str) -> str:
    """Raise an error.

    Args:
        message: What to say.
    """
    raise ValueError(message)


def leave(code: int) -> str:
    """Call sys.exit.

    Args:
        code: Exit status.
    """
    raise SystemExit(code)


def hang(seconds: float) -> str:
    """Wait a while (until the test releases it).

    Args:
        seconds: How long at most.
    """
    RELEASE.wait(seconds)
    return "woke"


def flood(n: int) -> str:
    """A long text.

    Args:
        n: Its length.
    """
    return "x" * n


def structured(kind: str):
    """A result that is not a string.

    Args:
        kind: Which one.
    """
    return {"dict": {"a": [1, 2], "ok": True}, "none": None, "set": {3}, "bool": False}[kind]


async def async_add(a: int, b: int) -> int:
    """Add, asynchronously.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


TOOLS = [add, scale, fail, leave, hang, flood, structured, async_add]


def call(name: str, **arguments) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def make_env(**kw) -> FunctionTools:
    return FunctionTools(TOOLS, timeout_s=kw.pop("timeout_s", 0.5), max_result_chars=kw.pop("max_result_chars", 100))


@pytest.fixture(autouse=True)
def _release_hung_threads():
    LOG.clear()
    RELEASE.clear()
    yield
    RELEASE.set()  # let hung tool threads finish so the pool is not left stuck


def test_several_calls_in_one_turn_run_in_order():
    env = make_env()
    reply = env.step("First " + call("scale", x=1.5) + call("add", a=2, b=3) + " then " + call("scale", x=4))
    assert LOG == [("scale", 1.5), ("add", 2, 3), ("scale", 4.0)]
    assert [m["content"] for m in reply.messages] == ["3.0", "5", "8.0"]
    assert [m["name"] for m in reply.messages] == ["scale", "add", "scale"]
    assert all(m["role"] == "tool" for m in reply.messages)
    assert reply.done is False and not reply.events
    assert reply.calls == {"scale": 2, "add": 1}
    assert [c.name for c in reply.parsed] == ["scale", "add", "scale"]


def test_a_turn_without_a_call_ends_the_trajectory():
    reply = make_env().step("The answer is 5.")
    assert reply.done and reply.messages == [] and not reply.events


@pytest.mark.parametrize(
    "turn, kind, text",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', "parse", "could not parse the tool call"),
        ('<tool_call>{"name": "add", "arguments": {}}', "parse", "without a closing"),
        (call("multiply", a=1, b=2), "unknown_tool", "unknown tool 'multiply'. Available tools: add, async_add"),
        (call("add", a=1), "bad_arguments", "bad arguments for tool 'add': missing required argument 'b'"),
        (call("add", a=1, b=2, c=3), "bad_arguments", "unknown argument 'c'"),
        (call("add", a="1", b=2), "bad_arguments", "'a' must be an integer, got a string"),
        (call("fail", message="boom"), "exception", "tool 'fail' raised ValueError: boom"),
        (call("leave", code=3), "exception", "tool 'leave' raised SystemExit: 3"),
        (call("hang", seconds=30), "timeout", "tool 'hang' timed out after 0.5 s"),
    ],
)
def test_every_bad_input_gives_an_error_message_and_a_counted_event(turn, kind, text):
    reply = make_env().step(turn)
    (message,) = reply.messages
    assert message["role"] == "tool" and message["content"].startswith("Error: ")
    assert text in message["content"], message["content"]
    assert reply.events == {kind: 1}
    assert reply.done is False  # the model gets its error and another turn


def test_unknown_tool_names_are_not_counted_as_calls():
    reply = make_env().step(call("x" * 500) + call("add", a=1, b=1))
    assert reply.calls == {"add": 1} and reply.events == {"unknown_tool": 1}
    assert len(reply.messages[0]["content"]) < 400


def test_huge_result_is_cut_with_a_marker_and_counted():
    reply = make_env(max_result_chars=100).step(call("flood", n=10_000))
    content = reply.messages[0]["content"]
    assert content == "x" * 100 + "...[truncated 9900 chars]"
    assert reply.events == {"truncated": 1} and reply.calls == {"flood": 1}


def test_non_string_results_are_json_when_possible_else_str():
    env = make_env()
    out = [env.step(call("structured", kind=k)).messages[0]["content"] for k in ("dict", "none", "bool", "set")]
    assert out == ['{"a": [1, 2], "ok": true}', "null", "false", "{3}"]


def test_async_tool_runs():
    assert make_env().step(call("async_add", a=2, b=5)).messages[0]["content"] == "7"


def test_bad_call_does_not_stop_the_calls_after_it():
    reply = make_env().step(call("fail", message="x") + "<tool_call>nope</tool_call>" + call("add", a=1, b=1))
    assert [m["content"][:6] for m in reply.messages] == ["Error:", "Error:", "2"]
    assert reply.events == {"exception": 1, "parse": 1}


def test_hung_tool_times_out_while_another_trajectory_in_the_batch_returns():
    hung, other, third = make_env(), make_env(), make_env()
    t = time.monotonic()
    replies = run_turns([hung, other, third], [call("hang", seconds=30), call("add", a=2, b=3), "done: 5"])
    elapsed = time.monotonic() - t
    assert elapsed < 3.0, elapsed
    assert replies[0].events == {"timeout": 1} and "timed out" in replies[0].messages[0]["content"]
    assert replies[1].messages[0]["content"] == "5" and not replies[1].events
    assert replies[2].done and replies[2].messages == []
    assert stuck_calls() >= 1  # the hung thread cannot be killed; it is counted until it returns
    RELEASE.set()
    deadline = time.monotonic() + 5
    while stuck_calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stuck_calls() == 0


def test_calls_of_many_trajectories_run_concurrently():
    def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "ok"

    envs = [FunctionTools([nap], timeout_s=5) for _ in range(8)]
    t = time.monotonic()
    replies = run_turns(envs, [call("nap", seconds=0.3)] * 8)
    assert [r.messages[0]["content"] for r in replies] == ["ok"] * 8
    assert time.monotonic() - t < 1.5  # 8 x 0.3 s serially would be 2.4 s


class Broken:
    tools: tuple = ()

    def reset(self, fields):
        return None

    def step(self, turn_text):
        raise RuntimeError("bug in the environment")

    def reward(self):
        return None


class Slow(Broken):
    def step(self, turn_text):
        RELEASE.wait(30)
        return Reply()


class WrongType(Broken):
    def step(self, turn_text):
        return ["not", "a", "reply"]


def test_run_turns_survives_environments_that_raise_hang_or_misbehave():
    good = make_env()
    replies = run_turns([Broken(), good, WrongType()], ["x", call("add", a=1, b=2), "y"])
    assert replies[0].done and replies[0].events == {"exception": 1}
    assert "bug in the environment" in replies[0].messages[0]["content"]
    assert replies[1].messages[0]["content"] == "3"
    assert replies[2].done and "not a Reply" in replies[2].messages[0]["content"]
    t = time.monotonic()
    replies = run_turns([Slow(), good], ["x", call("add", a=1, b=1)], step_timeout_s=0.5)
    assert time.monotonic() - t < 2.0
    assert replies[0].done and replies[0].events == {"timeout": 1}
    assert replies[1].messages[0]["content"] == "2"


def test_run_turns_checks_lengths():
    with pytest.raises(ValueError, match="2 environments but 1 turns"):
        run_turns([make_env(), make_env()], ["x"])


def test_runner_options_are_checked_and_tools_may_set_their_own_timeout():
    with pytest.raises(ValueError, match="timeout_s"):
        ToolRunner({}, timeout_s=0)
    with pytest.raises(ValueError, match="max_result_chars"):
        ToolRunner({}, max_result_chars=0)

    def patient(seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "done"

    patient.timeout_s = 5.0
    runner = ToolRunner({"patient": patient}, {"patient": cached_schema(patient)}, timeout_s=0.1)
    reply = runner.run(parse_tool_calls(call("patient", seconds=0.3)))
    assert reply.messages[0]["content"] == "done" and not reply.events


def test_a_tool_that_never_returns_does_not_keep_the_process_alive():
    """A timed-out call's thread is a daemon: the interpreter exits at the end of a run instead of joining
    it forever (a thread pool's workers would be joined at exit)."""
    import subprocess
    import sys

    code = (
        "import threading, time\n"
        "from grpolab.env.timeouts import call_with_timeout, stuck_calls\n"
        "forever = threading.Event()\n"
        "assert call_with_timeout(lambda: forever.wait(), {}, 0.2) is None\n"
        "print('stuck', stuck_calls())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "stuck 1" in res.stdout, res.stderr[-2000:]
