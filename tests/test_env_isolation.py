"""Bounds on what an environment's code may do to the trainer.

- A tool call that is one long C operation holding the GIL (`a ** b`, the catastrophic regex `(a+)+$`,
  `sum(range(n))`) cannot be interrupted in a thread: there its bound is the end of that operation. With
  env.tool_process=true the call runs in a forked child, killed at its limit: the model reads a timeout
  error within the limit plus a second, and the trainer's own thread keeps running meanwhile.
- Calls abandoned at their limit keep running in their threads; at most env.max_stuck_calls may, after
  which calls on threads are refused at once (env/errors_stuck) until some return.
- An environment whose factory or reset raises, or whose reset runs past env.reset_timeout_s, is a counted
  error: its example's trajectories score 0 and the run goes on.

Tools that hang do so until released (threading.Event), and times are checked against bounds far wider
than a loaded machine's scheduling noise.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter

import pytest
from scripted_envs import chatty_copy

from grpolab.env import FunctionTools, run_turns, stuck_calls
from grpolab.env.budget import ToolBudget
from grpolab.env.rollout import start_environment
from grpolab.env.settings import EnvConfig
from grpolab.env.timeouts import DEFAULT_MAX_STUCK, limit_stuck_calls
from grpolab.util.fields import ConfigError

SLACK_S = 1.0
"""What a killed call may take past its limit: the fork, the kill and the reaping (milliseconds), with room
for a loaded machine."""


def loaded_slack(env) -> float:
    """SLACK_S, or four times what a quick call through the same child process takes now (the fork of this
    process, the call and the reaping), where the machine is loaded enough for that to be more: the bound
    follows the machine, and a call that holds the GIL unkilled (seconds to hours) still fails it."""
    t0 = time.monotonic()
    (reply,) = run_turns([env], [call("total", n=3)], clocks=ToolBudget(1, per_trajectory_s=30.0).clocks)
    assert reply.events == Counter() and reply.messages[0]["content"] == "3", reply
    return max(SLACK_S, 4 * (time.monotonic() - t0))


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def power(a: int, b: int) -> int:
    """Raise a number to a power.

    Args:
        a: The base.
        b: The exponent.
    """
    return a**b


def matches(pattern: str, text: str) -> bool:
    """Whether a regular expression matches a text.

    Args:
        pattern: The regular expression.
        text: The text.
    """
    return re.match(pattern, text) is not None


def total(n: int) -> int:
    """The sum of the integers below n.

    Args:
        n: The bound.
    """
    return sum(range(n))


GIL_HOLDERS = {
    "power": call("power", a=3, b=10**9),
    "regex": call("matches", pattern="(a+)+$", text="a" * 40 + "!"),
    "sum": call("total", n=10**12),
}


@pytest.mark.parametrize("case", sorted(GIL_HOLDERS))
def test_a_gil_holding_call_in_a_child_process_is_killed_at_its_limit(case):
    """A 1 s timeout and a 3 s step budget: the model reads "timed out after 1 s and was stopped" within
    1 s + SLACK_S, while the trainer's thread (here: a loop that sleeps 10 ms per tick) kept ticking."""
    env = FunctionTools([power, matches, total], timeout_s=1.0, process=True)
    budget = ToolBudget(1, per_trajectory_s=3.0, per_step_s=3.0)
    slack = loaded_slack(env)
    replies: list = []
    t0 = time.monotonic()
    stepper = threading.Thread(
        target=lambda: replies.extend(run_turns([env], [GIL_HOLDERS[case]], clocks=budget.clocks))
    )
    stepper.start()
    ticks = 0
    while stepper.is_alive():
        ticks += 1
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    (reply,) = replies
    assert elapsed < 1.0 + slack, f"took {elapsed:.2f} s (a quick call through the same child: {slack / 4:.2f} s)"
    assert reply.events == Counter(timeout=1)
    assert "timed out after 1 s and was stopped" in reply.messages[0]["content"]
    assert ticks >= 20  # ~100 at 10 ms a tick; a GIL held for the whole second would allow about 1


def test_a_gil_holding_call_in_a_thread_is_bounded_only_by_its_own_end():
    """What holds for a tool in a thread (the default), stated in docs/agents.md: its waiter cannot wake while
    one C operation holds the GIL, so a 0.05 s timeout is only noticed when the operation ends, and a call
    that then has its result counts as a success."""
    n = 1
    while True:  # an n for which sum(range(n)) takes at least 0.3 s here
        t0 = time.monotonic()
        sum(range(n))
        if time.monotonic() - t0 >= 0.3:
            break
        n *= 2
    env = FunctionTools([total], timeout_s=0.05)
    t0 = time.monotonic()
    reply = env.step(call("total", n=n))
    assert time.monotonic() - t0 >= 0.25  # far past the 0.05 s timeout
    assert reply.events == Counter() and reply.messages[0]["content"] == str(sum(range(n)))


class Counting:
    """A TRL-style class whose tool changes its state."""

    def __init__(self):
        self.calls = 0

    def reset(self, **kwargs):
        self.calls = 0

    def bump(self) -> int:
        """Count one call.

        Returns:
            The number of calls so far.
        """
        self.calls += 1
        return self.calls


def test_a_child_processs_result_errors_and_lost_state_come_back():
    """In a child process a tool's result and its exception reach the model as in a thread; a call that
    changes its object's state is counted (process_state_lost): the change stays in the child."""
    from grpolab.env import load_environment

    env = FunctionTools([power, matches, total], timeout_s=5.0, process=True)
    reply = env.step(call("power", a=2, b=10) + call("matches", pattern="(", text="x"))
    assert reply.messages[0]["content"] == "1024"
    assert reply.messages[1]["content"].startswith("Error: tool 'matches' raised error: missing ), unterminated")
    assert reply.events == Counter(exception=1)
    counting = load_environment(Counting, timeout_s=5.0, process=True)()
    counting.reset({})
    reply = counting.step(call("bump") + call("bump"))
    assert [m["content"] for m in reply.messages] == ["1", "1"]  # each call starts from the parent's state
    assert reply.events == Counter(process_state_lost=2)
    assert counting.user_env.calls == 0


def spin_until(release: threading.Event):
    def spin() -> str:
        """Spin in Python until released.

        Returns:
            done
        """
        while not release.is_set():
            pass
        return "done"

    return spin


def test_abandoned_calls_are_capped_and_further_ones_refused_at_once():
    """Four trajectories call a CPU-bound tool (a Python loop: abandoned at its 0.2 s timeout, it keeps
    spinning) in each of six steps, the cap 2 above what is already stuck. The four calls of the first step
    start together (none is stuck yet) and all four run on: the cap bounds the pile-up at the cap plus the
    calls in flight when it is reached. Every later call is refused at once with an error naming the cap
    (env/errors_stuck): nothing more piles up, and a process-run call still runs. Once released, calls run
    again."""
    release = threading.Event()
    base = stuck_calls()
    limit_stuck_calls(base + 2)
    try:
        envs = [FunctionTools([spin_until(release)], timeout_s=0.2) for _ in range(4)]
        events = Counter()
        for _ in range(6):
            t0 = time.monotonic()
            for reply in run_turns(envs, [call("spin")] * 4, clocks=ToolBudget(4, 60.0, 60.0).clocks):
                events.update(reply.events)
            assert stuck_calls() - base == 4
            assert time.monotonic() - t0 < 0.2 + 2.0
        assert events == Counter(timeout=4, stuck=20)
        refused = envs[0].step(call("spin")).messages[0]["content"]
        assert "was not run" in refused and f"at most {base + 2} may be" in refused
        assert (
            FunctionTools([total], timeout_s=5.0, process=True).step(call("total", n=10)).messages[0]["content"] == "45"
        )
        release.set()
        deadline = time.monotonic() + 10
        while stuck_calls() > base and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stuck_calls() == base
        assert envs[0].step(call("spin")).messages[0]["content"] == "done"
    finally:
        release.set()
        limit_stuck_calls(DEFAULT_MAX_STUCK)


# ----------------------------------------------------------------------------- starting an environment


class Fails:
    def __init__(self, where: str, release: threading.Event | None = None):
        self.where, self.release = where, release
        self.tools: list = []

    def reset(self, fields):
        if self.where == "reset":
            raise RuntimeError("the database is down")
        if self.where == "hang":
            self.release.wait(30)
        return "go"

    def step(self, text):
        raise AssertionError("not reached")

    def reward(self):
        return 1.0


def test_a_failing_start_is_counted_not_raised(caplog):
    """A factory or reset that raises, and a reset past env.reset_timeout_s, give (None, None), one counted
    event each and a warning naming the example; a reset that breaks the contract stays a usage error."""
    from grpolab.env.base import EnvConfigError

    s = EnvConfig(name="x", reset_timeout_s=0.2)
    events = Counter()
    release = threading.Event()

    def broken():
        raise OSError("no licence left")

    def bad_contract():
        env = Fails("ok")
        env.reset = lambda fields: (_ for _ in ()).throw(EnvConfigError("reset returned 3; return a string"))
        return env

    try:
        assert start_environment(broken, {}, s, events, "ex-1") == (None, None)
        assert start_environment(lambda: Fails("reset"), {}, s, events, "ex-2") == (None, None)
        t0 = time.monotonic()
        assert start_environment(lambda: Fails("hang", release), {}, s, events, "ex-3") == (None, None)
        assert time.monotonic() - t0 < 0.2 + SLACK_S
        env, text = start_environment(lambda: Fails("ok"), {}, s, events, "ex-4")
        assert isinstance(env, Fails) and text == "go"
        with pytest.raises(ConfigError, match="reset returned 3"):
            start_environment(bad_contract, {}, s, events, "ex-5")
    finally:
        release.set()
    assert events == Counter(reset=2, reset_timeout=1)
    said = caplog.text
    assert "OSError: no licence left" in said and "'ex-2'" in said and "env.reset_timeout_s=0.2" in said


FLAKY_ENV = '''
import time


class Flaky:
    """reset raises for the examples whose answer is divisible by 3, hangs for those that are 1 modulo 5;
    reward 1 otherwise."""

    made = 0

    def __init__(self):
        type(self).made += 1

    def reset(self, **kwargs):
        n = int(float(kwargs["answer"]))
        if n % 3 == 0:
            raise ValueError(f"no task for {n}")
        if n % 5 == 1:
            time.sleep(1.0)
        return "Answer with the number."

    def get_reward(self) -> float:
        return 1.0
'''


def test_environments_that_fail_to_start_score_zero_and_training_goes_on(tmp_path, tiny_model_dir):
    """`grpolab train` with an environment whose reset raises for some examples and runs past
    env.reset_timeout_s for others: both steps finish, the failures are counted, and every sample of a
    failing example has reward 0 while the others have the environment's 1."""
    from grpolab.app.cli import main

    envfile = tmp_path / "flaky_env.py"
    envfile.write_text(FLAKY_ENV)
    out = tmp_path / "run"
    model = chatty_copy(tiny_model_dir, tmp_path / "model")
    code = main(
        [
            "train",
            f"model={model}",
            f"out={out}",
            "steps=2",
            "batch_size=8",
            "G=2",
            "micro_batch=8",
            "eval_size=1",
            "progress=false",
            "report=false",
            "tensorboard=false",
            f"env.name={envfile}:Flaky",
            "env.max_turns=1",
            "env.max_turn_tokens=4",
            "env.max_model_tokens=4",
            "env.reset_timeout_s=0.5",
            "samples_per_step=8",
            "rewards=[]",
        ]
    )
    assert code == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert sum(m.get("env/errors_reset", 0) for m in rows) > 0
    assert sum(m.get("env/errors_reset_timeout", 0) for m in rows) > 0
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["reward"] for s in samples} == {0.0, 1.0}  # failing and working examples both drawn
    for s in samples:
        n = int(float(s["answer"]))
        assert s["reward"] == (0.0 if n % 3 == 0 or n % 5 == 1 else 1.0), s


def test_the_python_tool_with_isolation_require_is_refused_before_training(tiny_tokenizer, monkeypatch):
    """calculator_python's env.options.isolation: a typo, and `require` where the sandbox cannot isolate
    (its probe says so), are usage errors when the environment is loaded, naming the option."""
    import grpolab.sandbox as sandbox
    from grpolab.sandbox.isolation import SandboxUnavailable
    from grpolab.training.agents import load_environments

    with pytest.raises(ConfigError, match="env.options.isolation must be one of"):
        load_environments(EnvConfig(name="calculator_python", options={"isolation": "strict"}), tiny_tokenizer, None)

    def reduced(mode):
        raise SandboxUnavailable("grpolab sandbox: REDUCED ISOLATION (no namespaces here)")

    monkeypatch.setattr(sandbox, "check_isolation", reduced)
    with pytest.raises(ConfigError, match="env.options.isolation=require: .*REDUCED ISOLATION"):
        load_environments(EnvConfig(name="calculator_python", options={"isolation": "require"}), tiny_tokenizer, None)
    assert load_environments(EnvConfig(name="calculator_python"), tiny_tokenizer, None) is not None
