"""Tool time: a budget per trajectory and per step, and what a running tool may ask of its call.

    per trajectory  env.tool_budget_s       seconds all the tool calls of one trajectory may take, over all
                                            its turns (a call's time is its wall time: waiting for a
                                            sandbox slot counts)
    per step        env.step_tool_budget_s  wall-clock seconds one step's rollout may spend waiting for its
                                            environments (the batch's trajectories step concurrently within it)

One call may wait  min(its own timeout, what is left of its trajectory's budget, what is left of the
step's). When either budget is spent, a call is not started: the model reads an error message that says
so and a `budget` event is counted; a call stopped by the budget before its own timeout is counted as
`budget` too (a call past its own timeout stays a `timeout`). `ToolBudget.metrics()` gives the time
spent: env/tool_s_mean and env/tool_s_max (seconds per trajectory), env/tool_wait_s (the step's wait).

The deadline of the call in progress is visible to the tool (`call_deadline()`), so a tool that queues
for a shared resource can give up its place then: the `python` tool of grpolab.env.builtin waits for a
sandbox slot only until that deadline and its program is killed at it, so a call the runner has
abandoned no longer holds a slot, nor waits for one, nor starts later. `note_event(kind)` lets a tool
count an event of its own (the python tool: its program's own timeout, its output cut) into the Reply
of the call. Both read context variables that grpolab.env.timeouts sets for each call; outside a call
they are no-ops (None, nothing counted).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import Counter
from dataclasses import dataclass, field

DEFAULT_TRAJECTORY_S = 60.0
DEFAULT_STEP_S = 300.0


@dataclass
class StepClock:
    """Wall-clock seconds a step's rollout spends waiting for environments, against its limit."""

    limit_s: float
    used_s: float = 0.0
    _since: float | None = None  # monotonic start of the wait in progress, None between waits

    def left(self) -> float:
        """Seconds of the step's budget left now (negative when overrun)."""
        running = time.monotonic() - self._since if self._since is not None else 0.0
        return self.limit_s - self.used_s - running

    @contextlib.contextmanager
    def waiting(self):
        """Counts the time inside the block (one batch of environment steps) as used."""
        self._since = time.monotonic()
        try:
            yield self
        finally:
            self.used_s += time.monotonic() - self._since
            self._since = None


@dataclass
class TrajectoryClock:
    """One trajectory's tool seconds against its limit, within its step's budget."""

    limit_s: float
    step: StepClock
    used_s: float = 0.0

    def left(self) -> float:
        """Seconds a call may still take: the smaller of the trajectory's and the step's budget left."""
        return min(self.limit_s - self.used_s, self.step.left())

    def charge(self, seconds: float) -> None:
        self.used_s += seconds

    def spent(self) -> str:
        """Which budget is spent, in words for the model."""
        if self.limit_s - self.used_s <= 0:
            return f"this conversation's tool-time budget ({self.limit_s:g} s) is spent"
        return f"this step's tool-time budget ({self.step.limit_s:g} s) is spent"


@dataclass
class ToolBudget:
    """The clocks of one step's N trajectories (one StepClock shared by them)."""

    n: int
    per_trajectory_s: float = DEFAULT_TRAJECTORY_S
    per_step_s: float = DEFAULT_STEP_S
    step: StepClock = field(init=False)
    clocks: list[TrajectoryClock] = field(init=False)

    def __post_init__(self) -> None:
        for key, v in (("per_trajectory_s", self.per_trajectory_s), ("per_step_s", self.per_step_s)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"ToolBudget: {key} must be a positive number of seconds, got {v!r}")
        self.step = StepClock(float(self.per_step_s))
        self.clocks = [TrajectoryClock(float(self.per_trajectory_s), self.step) for _ in range(self.n)]

    def metrics(self) -> dict[str, float]:
        """env/tool_s_mean, env/tool_s_max (seconds of tool calls per trajectory), env/tool_wait_s."""
        used = [c.used_s for c in self.clocks] or [0.0]
        return {
            "env/tool_s_mean": sum(used) / len(used),
            "env/tool_s_max": max(used),
            "env/tool_wait_s": self.step.used_s,
        }


# ----------------------------------------------------------------------------- what a running call sees

_CLOCK: contextvars.ContextVar[TrajectoryClock | None] = contextvars.ContextVar("grpolab_tool_clock", default=None)
_CALL: contextvars.ContextVar[tuple[float | None, Counter] | None] = contextvars.ContextVar(
    "grpolab_tool_call", default=None
)


def current_clock() -> TrajectoryClock | None:
    """The budget of the trajectory whose environment step is running here (None: no budget)."""
    return _CLOCK.get()


@contextlib.contextmanager
def trajectory_clock(clock: TrajectoryClock | None):
    """Makes `clock` the current trajectory's budget inside the block (on this thread)."""
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


@contextlib.contextmanager
def in_call(deadline: float | None, events: Counter):
    """Inside the block, the tool call in progress has this deadline (time.monotonic(); None: none) and
    counts its own events into `events` (the runner wraps each call in it, on whichever thread runs it)."""
    token = _CALL.set((deadline, events))
    try:
        yield
    finally:
        _CALL.reset(token)


def call_deadline() -> float | None:
    """time.monotonic() at which the runner stops waiting for the call in progress (None outside a call)."""
    call = _CALL.get()
    return None if call is None else call[0]


def note_event(kind: str, k: int = 1) -> None:
    """Count an event of the call in progress (it appears as env/errors_<kind>); nothing outside a call."""
    call = _CALL.get()
    if call is not None:
        call[1][kind] += k
