"""Tool time has a budget per trajectory and per step (grpolab.env.budget), counted in the env
metrics, and a call the runner abandons no longer holds, nor waits for, a sandbox slot.

Without budgets, one turn of 16 sleeping python calls holds a trajectory for minutes. The tools here
either hang until released (threading.Event), so that what is cut and refused does not depend on the
machine's speed, or sleep far longer than any budget; time is only checked against bounds many times
wider than the scheduling noise of a loaded machine.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest
from scripted_envs import chatty_copy

from grpolab.app.cli import main
from grpolab.env import FunctionTools, load_environment, run_turns, stuck_calls
from grpolab.env.budget import ToolBudget, call_deadline, note_event
from grpolab.sandbox import SLOTS


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Hanging:
    """A tool that blocks until released, counting its calls and the deadline each one saw."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self.deadlines: list[float | None] = []

    def make(self):
        def hang() -> str:
            """Block until released."""
            self.started += 1
            self.deadlines.append(call_deadline())
            self.release.wait(30)
            return "done"

        hang.timeout_s = 20.0  # its own limit is far above every budget below
        return hang


def test_a_trajectory_budget_cuts_the_running_call_and_refuses_the_rest():
    tool = Hanging()
    env = FunctionTools([tool.make()], timeout_s=20.0)
    budget = ToolBudget(1, per_trajectory_s=0.3, per_step_s=100.0)
    t0 = time.monotonic()
    [reply] = run_turns([env], [call("hang") * 4], clocks=budget.clocks)
    tool.release.set()
    assert tool.started == 1  # calls 2-4 were never started
    assert reply.events == Counter(budget=4)  # one cut (before its own 20 s timeout), three refused
    contents = [m["content"] for m in reply.messages]
    assert "was stopped after" in contents[0] and "tool-time budget (0.3 s) is spent" in contents[0]
    assert all("was not run" in c and "budget (0.3 s)" in c for c in contents[1:])
    # the tool saw the deadline it was cut at: 0.3 s after it started, not 20 s
    assert tool.deadlines[0] is not None and tool.deadlines[0] - t0 < 5.0
    m = budget.metrics()
    assert 0.3 <= m["env/tool_s_mean"] == m["env/tool_s_max"] < 20.0
    # the next turn of this trajectory: still spent, nothing runs
    [again] = run_turns([env], [call("hang")], clocks=budget.clocks)
    assert tool.started == 1 and again.events == Counter(budget=1)


def test_a_step_budget_bounds_the_whole_batch_over_its_turns():
    tools = [Hanging() for _ in range(3)]
    envs = [FunctionTools([t.make()], timeout_s=20.0) for t in tools]
    budget = ToolBudget(3, per_trajectory_s=100.0, per_step_s=0.4)
    replies = run_turns(envs, [call("hang") * 2] * 3, clocks=budget.clocks)
    for t in tools:
        t.release.set()
    assert [t.started for t in tools] == [1, 1, 1]  # concurrent, each cut at the step's deadline
    assert all(r.events == Counter(budget=2) for r in replies)
    assert all("this step's tool-time budget (0.4 s) is spent" in r.messages[1]["content"] for r in replies)
    assert budget.step.used_s >= 0.4 and budget.metrics()["env/tool_wait_s"] == budget.step.used_s
    # a later turn of the same step: the step's budget is spent, no call starts
    replies = run_turns(envs, [call("hang")] * 3, clocks=budget.clocks)
    assert [t.started for t in tools] == [1, 1, 1] and all(r.events == Counter(budget=1) for r in replies)


class _SlowEnv:
    """A user's environment whose step itself hangs (no ToolRunner to cut its calls)."""

    tools: ClassVar[list] = []

    def __init__(self) -> None:
        self.release = threading.Event()

    def reset(self, fields):
        return None

    def step(self, turn_text):
        self.release.wait(30)

    def reward(self):
        return None


def test_a_step_that_hangs_past_the_step_budget_ends_its_trajectory_with_a_budget_event():
    env = _SlowEnv()
    budget = ToolBudget(1, per_trajectory_s=100.0, per_step_s=0.2)
    [reply] = run_turns([env], ["turn"], clocks=budget.clocks)
    env.release.set()
    assert reply.done and reply.events == Counter(budget=1)


def test_tools_count_their_own_events_and_the_budget_needs_positive_seconds():
    def noisy() -> str:
        """Counts two events of its own."""
        note_event("mine")
        note_event("truncated")
        return "ok"

    [reply] = run_turns([FunctionTools([noisy])], [call("noisy")])
    assert reply.events == Counter(mine=1, truncated=1)
    note_event("outside")  # outside a call: nothing to count into, no error
    assert call_deadline() is None
    with pytest.raises(ValueError, match="per_step_s"):
        ToolBudget(1, per_trajectory_s=1.0, per_step_s=0)


def test_the_python_tool_counts_its_own_timeout_and_cut():
    env = load_environment("calculator_python", options={"timeout_s": 1.0, "max_output_chars": 50})()
    env.reset({})
    [reply] = run_turns([env], [call("python", code="while True:\n    pass") + call("python", code="print('x' * 500)")])
    assert "ran longer than 1 s" in reply.messages[0]["content"]
    assert "[truncated 450 chars]" in reply.messages[1]["content"]
    assert reply.events == Counter(timeout=1, truncated=1)


def _free_slots() -> int:
    return SLOTS._q.qsize()


def _wait_for(cond, limit_s: float = 15.0) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_an_abandoned_python_call_releases_its_sandbox_slot_at_the_deadline():
    # the program would sleep 60 s under its own 60 s limit; the trajectory's budget stops it after 1 s
    env = load_environment("calculator_python", options={"timeout_s": 60.0})()
    env.reset({})
    base_stuck, n = stuck_calls(), SLOTS.n
    assert _wait_for(lambda: _free_slots() == n)
    budget = ToolBudget(1, per_trajectory_s=1.0, per_step_s=100.0)
    [reply] = run_turns([env], [call("python", code="import time\ntime.sleep(60)")], clocks=budget.clocks)
    assert reply.events == Counter(budget=1)
    # the sandbox killed the program at the same deadline: the slot is back long before the 60 s
    assert _wait_for(lambda: _free_slots() == n and stuck_calls() == base_stuck)


def test_an_abandoned_python_call_waiting_for_a_slot_never_takes_one():
    env = load_environment("calculator_python")()
    env.reset({})
    base_stuck = stuck_calls()
    held = [SLOTS.acquire() for _ in range(SLOTS.n)]  # every slot busy
    try:
        budget = ToolBudget(1, per_trajectory_s=0.5, per_step_s=100.0)
        [reply] = run_turns([env], [call("python", code="import time\ntime.sleep(60)")], clocks=budget.clocks)
        assert reply.events == Counter(budget=1)
        assert _wait_for(lambda: stuck_calls() == base_stuck)  # the call gave up its wait at the deadline
    finally:
        for k in held:
            SLOTS.release(k)
    time.sleep(0.5)
    assert _free_slots() == SLOTS.n  # nobody took a slot once they were free: the call did not run later


def test_sixteen_sleeping_python_calls_per_turn_through_the_cli_are_bounded_and_counted(tiny_model_dir, tmp_path):
    """The hanging-tools case in a real `grpolab train`: every trajectory's first turn makes 16 python calls
    that each sleep 10 s (up to 16 x the python tool's own 5 s limit per call without budgets). With
    env.tool_budget_s=1.5 the first call is cut at the budget and the other 15 are refused, each counted."""
    model = chatty_copy(tiny_model_dir, tmp_path / "model")
    out, steps, n = tmp_path / "run", 2, 4
    code = main(
        [
            "train",
            f"model={model}",
            f"out={out}",
            f"steps={steps}",
            f"batch_size={n}",
            "G=2",
            f"micro_batch={n}",
            "eval_size=0",
            "progress=false",
            "report=false",
            "tensorboard=false",
            f"env.name={Path(__file__).resolve().parent / 'scripted_envs.py'}:SleepyPython",
            "env.max_turns=2",
            "env.max_turn_tokens=4",
            "env.max_model_tokens=8",
            "env.max_env_tokens=4096",
            "env.tool_budget_s=1.5",
            "env.step_tool_budget_s=6",
            "rewards=[{name: format, weight: 0.5}]",
        ]
    )
    assert code == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == steps
    for m in metrics:
        assert m["env/errors_budget"] == 16 * n  # per trajectory: 1 cut + 15 refused
        assert m["env/calls/python"] == 16 * n
        assert "env/errors_timeout" not in m  # cut by the budget (1.5 s), before the tool's own 5 s limit
        # each trajectory's tool time is its budget, not 16 calls' worth (bounds wide for a loaded machine)
        assert 1.5 <= m["env/tool_s_max"] < 1.5 + 5.0
        assert m["env/tool_wait_s"] < 6.0 + 5.0
