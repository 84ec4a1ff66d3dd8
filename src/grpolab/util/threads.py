"""How the CPU's compute threads wait for each other: a fair share on a busy machine, nothing lost alone.

PyTorch's CPU kernels run on an OpenMP thread team (libgomp in the Linux wheels, LLVM's libomp on
macOS). Between two parallel regions a team thread waits for the next one, and at the end of a region
the threads wait for the slowest. How they wait is the runtime's wait policy, read once from the
environment when the runtime starts (when torch is imported) and never again:

    libgomp, nothing set      spin GOMP_SPINCOUNT = 300,000 rounds, then sleep (futex)
    OMP_WAIT_POLICY=ACTIVE    spin for minutes
    OMP_WAIT_POLICY=PASSIVE   sleep at once (GOMP_SPINCOUNT = 0)
    libomp / Intel            spin for KMP_BLOCKTIME = 200 (milliseconds, its unit), then sleep

Alone, spinning wins: the next region starts within microseconds, so it catches the back-to-back
regions of a decode step. On a machine that runs something else the kernel takes a team thread away
for a time slice, and each of the others then burns its own slices spinning for it: the step slows
by far more than its fair share (docs/performance.md, "A machine doing something else").
`thread_wait=auto` spins briefly, then sleeps: on a machine idle at start SHORT_SPIN rounds of libgomp
(`short`; SHORT_BLOCKTIME_MS of libomp), long enough for the next region of a step and short enough that
a preempted peer costs a fraction of a slice; where other processes were busy at start (measured before
torch starts, grpolab.util.load) BRIEF_SPIN rounds (`brief`), so that a waiting thread soon gives its
time back and a team can share its scheduling group with busy processes thread by thread (the count
then leaves out the load of the run's own group: grpolab.util.load says why).

Precedence: an explicit `thread_wait` (short, brief, passive, active) sets the variables it names; `auto`
takes the user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT / KMP_BLOCKTIME where any is set, else measures;
`openmp` leaves the runtime's own default. The choice must be made before torch is
imported: the command line does it first thing; where torch was imported already (grpolab used from a
program that imported it), the runtime keeps what it started with and the first line says so.

No torch import here: this module runs before it.
"""

from __future__ import annotations

import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Literal

from grpolab.util import load as machine_load

ThreadWait = Literal["auto", "short", "brief", "passive", "active", "openmp"]
"""The `thread_wait` setting: how OpenMP's threads wait (the module docstring says what each does)."""
WAIT_SETTINGS: tuple[str, ...] = typing.get_args(ThreadWait)
USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
MARKER = "GRPOLAB_THREAD_WAIT"  # setting:policy, written beside the variables for the processes started after
SHORT_SPIN = 10_000  # libgomp spin rounds before sleeping: a thirtieth of its default 300,000
BRIEF_SPIN = 1_000  # the same, where other processes were busy at start: a tenth of SHORT_SPIN
SHORT_BLOCKTIME_MS = 1  # libomp/Intel: milliseconds of spinning before sleeping (its unit; 0 = passive)
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""The environment of a helper process beside the trainer (a verifier, a sandboxed candidate): one
compute thread, so that it takes at most one core's share from the trainer's team."""

_SETS = {
    "short": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(SHORT_SPIN), "KMP_BLOCKTIME": str(SHORT_BLOCKTIME_MS)},
    "brief": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(BRIEF_SPIN), "KMP_BLOCKTIME": str(SHORT_BLOCKTIME_MS)},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None},
    "openmp": {},
}
_WORDS = {
    "short": f"spin {SHORT_SPIN} rounds, then sleep",
    "brief": f"spin {BRIEF_SPIN} rounds, then sleep",
    "passive": "sleep at once (OMP_WAIT_POLICY=PASSIVE)",
    "active": "spin (OMP_WAIT_POLICY=ACTIVE)",
    "openmp": "the OpenMP runtime's default (libgomp: spin 300,000 rounds, then sleep)",
}


@dataclass(frozen=True)
class WaitPlan:
    """What the compute threads do while they wait, and the environment that says it to OpenMP.

    env: variable -> value to set, or None to unset. applied: False when the runtime had started before
    the plan could be applied (then `env` was not written and the runtime keeps its start-up policy)."""

    setting: str
    policy: str  # short, brief, passive, active, openmp or user (the user's own variables)
    env: dict = field(default_factory=dict)
    applied: bool = True
    user: dict = field(default_factory=dict)  # the user's own variables, where `auto` took them
    why: str = ""  # what `auto` measured, where it measured

    @property
    def sleeps_soon(self) -> bool:
        """Whether a waiting thread gives its time back within microseconds (brief, passive): then a team
        shares its scheduling group with busy processes thread by thread (grpolab.util.load)."""
        return self.applied and self.policy in ("brief", "passive")

    def describe(self) -> str:
        """The wait part of the run's first line."""
        if self.policy == "user":
            how = "as set in the environment: " + " ".join(f"{k}={v}" for k, v in self.user.items())
        else:
            how = _WORDS[self.policy]
        text = f"threads wait: {how} (thread_wait={self.setting}{'; ' + self.why if self.why else ''})"
        if not self.applied:
            text += (
                "; not applied: torch was imported before grpolab could set it, so OpenMP keeps the policy "
                "it started with (set thread_wait or OMP_WAIT_POLICY before importing torch)"
            )
        return text


def check_setting(setting: str) -> str:
    """The setting, or ValueError naming the known ones."""
    if setting not in WAIT_SETTINGS:
        raise ValueError(f"thread_wait: {setting!r} is not one of {', '.join(WAIT_SETTINGS)}")
    return setting


def plan_wait(
    setting: str = "auto", environ: dict | None = None, start_load: machine_load.Load | None = None
) -> WaitPlan:
    """The wait policy for `setting` in the environment `environ` (default os.environ) and, for `auto`, the
    other processes' load measured at start (None: not measured, taken as idle); pure."""
    check_setting(setting)
    environ = os.environ if environ is None else environ
    if setting == "auto":
        user = {k: environ[k] for k in USER_VARS if environ.get(k)}
        if user:
            return WaitPlan(setting, "user", {}, user=user)
        if start_load is not None and round(start_load.busy) >= 1:
            return WaitPlan(setting, "brief", dict(_SETS["brief"]), why="busy at start")
        return WaitPlan(setting, "short", dict(_SETS["short"]))
    return WaitPlan(setting, setting, dict(_SETS[setting]))


def runtime_started() -> bool:
    """True when torch (and with it the OpenMP runtime, which reads its variables once) is loaded."""
    return "torch" in sys.modules


_current: WaitPlan | None = None
_start_load: machine_load.Load | None = None  # what prepare(measure=True) measured, before torch started
_saved: dict = {}  # the user's values of the variables a plan changed, restored before a new plan


def prepare(setting: str = "auto", environ=None, measure: bool = False) -> WaitPlan:
    """Decide the wait policy and write it into the environment, if the OpenMP runtime has not started.
    Called again before the start (a command that read its config), it replaces the earlier plan.
    measure: `auto` measures the other processes' load first (machine_load.busy_cores, a quarter of a
    second; kept for `choose_threads`, see `start_load`), except where OMP_NUM_THREADS=1 leaves no team."""
    global _current, _start_load
    environ = os.environ if environ is None else environ
    if runtime_started() and _current is not None and _current.setting == setting:
        return _current  # decided (and applied) before the runtime started
    if not runtime_started():
        for k, v in _saved.items():  # undo an earlier plan before deciding anew
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
        _saved.clear()
    plan = inherited(setting, environ)
    if plan is not None:  # a parent grpolab process set it before this one started
        _current = plan
        return plan
    one_thread = omp_num_threads(environ) == 1  # no team: how it waits is moot
    if (
        measure
        and setting == "auto"
        and not one_thread
        and not runtime_started()
        and not any(environ.get(k) for k in USER_VARS)
    ):
        _start_load = machine_load.busy_cores()
    else:
        _start_load = None  # this plan's: not measured
    plan = plan_wait(setting, environ, _start_load)
    if runtime_started():
        plan = WaitPlan(plan.setting, plan.policy, plan.env, applied=False, user=plan.user, why=plan.why)
    else:
        _saved.update({k: environ.get(k) for k in (*plan.env, MARKER)})
        for k, v in plan.env.items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
        environ[MARKER] = f"{setting}:{plan.policy}"  # the processes this one starts inherit it from their start
    _current = plan
    return plan


def inherited(setting: str, environ) -> WaitPlan | None:
    """The plan a parent grpolab process wrote into this process's environment before starting it (MARKER
    names its setting and policy), when it is `setting`'s; else None."""
    marked = environ.get(MARKER, "")
    got, _, policy = marked.partition(":")
    if got != setting or policy not in (*_SETS, "user"):
        return None
    user = {k: environ[k] for k in USER_VARS if environ.get(k)} if policy == "user" else {}
    return WaitPlan(setting, policy, dict(_SETS.get(policy, {})), applied=True, user=user)


def environ_without_plan(environ=None) -> dict:
    """A copy of the environment with this process's plan undone: for a process that should wait as
    OpenMP does by default (the other side of a comparison)."""
    env = dict(os.environ if environ is None else environ)
    for k, v in _saved.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    env.pop(MARKER, None)
    return env


def start_load() -> machine_load.Load | None:
    """The load `prepare(measure=True)` measured before torch started, None where it measured nothing."""
    return _start_load


def current(setting: str = "auto") -> WaitPlan:
    """The plan this process runs under: the one `prepare` applied, or (grpolab used from a program that
    had imported torch) what `setting` would have been, marked not applied."""
    if _current is not None and _current.setting == setting:
        return _current
    return prepare(setting)


def cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def describe_threads(threads: int, plan: WaitPlan, n_cores: int | None = None, why: str = "") -> str:
    """The run's first line: compute threads (and why that many) and how they wait."""
    n = cores() if n_cores is None else n_cores
    reason = f" ({why})" if why else ""
    return (
        f"threads: {threads} compute thread{'s' if threads != 1 else ''} on {n} core{'s' if n != 1 else ''}"
        f"{reason}; {plan.describe()}"
    )


# --- how many threads: the cores other processes leave idle -------------------------------------------

FILE = "threads.json"
"""The thread count a run chose (threads=0), in its directory: a resumed run reuses it (the sums of a
parallel reduction depend on how many threads share them, so the same count gives the same numbers)."""


def fair_threads(n_cores: int, busy: float | None, cpus: int | None = None) -> int:
    """The compute threads that take the cores other processes leave idle:

        T = max(1, min(C, M - round(B)))

    C the cores this process may use, M the machine's (default C), B the other processes' load a team
    competes with (grpolab.util.load.Load.competing; None: not measured, T = C).

    On an idle machine T = C. Beside k busy single-threaded processes T = C - k (at least 1): a thread of
    a team that waits at every barrier for its peers makes the whole step wait whenever the kernel gives
    its core to another process, so a team larger than the idle cores runs far below its share
    (docs/performance.md, "A machine doing something else")."""
    if busy is None:
        return n_cores
    return max(1, min(n_cores, (cpus or n_cores) - round(busy)))


def recorded_threads(out) -> int | None:
    """The thread count recorded in a run directory's threads.json, None where there is none (a run from
    before it was recorded) or it cannot be read."""
    import json
    from pathlib import Path

    try:
        n = json.loads((Path(out) / FILE).read_text())["threads"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def choose_threads(
    setting: int,
    recorded: int | None = None,
    environ=None,
    measured: machine_load.Load | None = None,
    per_thread: bool = False,
) -> tuple[int, str]:
    """(threads, why) for the config key `threads`: N > 0 as given; 0 the run's recorded choice when
    resuming, else OMP_NUM_THREADS where the environment sets it (torchrun does, for a job of several
    processes sharing a machine), else `fair_threads` of the load `measured` at start (measured now where
    None), less the load of the run's own scheduling group where `per_thread` (its threads sleep soon when
    they wait: WaitPlan.sleeps_soon)."""
    n = cores()
    if setting > 0:
        return setting, "threads=" + str(setting)
    if recorded:
        if recorded > n:
            return n, f"{n}, the cores here ({FILE} recorded {recorded}, more than the machine has)"
        return recorded, f"as recorded in {FILE} by the run"
    given = omp_num_threads(environ)
    if given:
        if given > OVERSUBSCRIBED * n:  # 5000 threads spinning on 2 cores only slow the run down
            return n, (
                f"{n}, the cores here (OMP_NUM_THREADS={given} in the environment asks for more than "
                f"{OVERSUBSCRIBED} threads per core)"
            )
        return given, f"OMP_NUM_THREADS={given} in the environment"
    measured = measured or machine_load.busy_cores()
    if measured is None:
        return n, "every core (no /proc/stat to measure the machine's load)"
    t = fair_threads(n, measured.competing(per_thread), measured.cpus)
    return t, f"threads=0: {measured.describe(per_thread)} at start"


OVERSUBSCRIBED = 4
"""Threads per core past which OMP_NUM_THREADS is not obeyed: the count is then the cores, and the run's first
line says so (a mistyped or hostile 5000 or 99999999999999999999 would spin that many threads)."""


def omp_num_threads(environ=None) -> int | None:
    """The count OMP_NUM_THREADS gives (torchrun sets it), None where it is unset or not a positive count."""
    given = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    return int(given) if given.isdigit() and int(given) > 0 else None


def follows_load(setting: int, environ=None) -> bool:
    """Whether a run's thread count follows the load between steps (LoadFollower): threads=0 where the
    environment sets no OMP_NUM_THREADS (torchrun's processes keep the count it gives them)."""
    return setting == 0 and omp_num_threads(environ) is None


FOLLOW_MIN_S = 1.0
"""The shortest interval LoadFollower judges the load over: shorter steps (a tiny model's) are measured
together until this much time has passed, since /proc/stat counts in clock ticks (clock_ticks per second)."""
FOLLOW_STEPS = 2
"""Consecutive steps whose load must call for the same new count before LoadFollower changes it: a burst
(a compile in another window, an indexer's minute) does not move a run that would then move back."""


@dataclass
class LoadFollower:
    """threads=0 after the start: between two steps, the count `fair_threads` gives for what the other
    processes used during the last step (the step itself is the measuring interval, so it costs nothing:
    two small reads of /proc; steps shorter than FOLLOW_MIN_S are measured together), changed once
    FOLLOW_STEPS intervals in a row call for the same new count.

    A run that started alone and meets load later drops to the idle cores instead of waiting at every
    barrier for a thread the kernel gave away; one that started beside load takes the cores back when
    the load ends. The sums of a parallel reduction depend on the thread count, so a run whose count
    moves samples other tokens than one whose count stays; threads=N fixes the count."""

    threads: int
    n_cores: int
    per_thread: bool = False  # the threads sleep soon when they wait: the own group's load is left out
    proc: str = "/proc"
    last: machine_load.Reading | None = None
    wanted: int | None = None
    agreeing: int = 0

    def read(self) -> machine_load.Reading | None:
        return machine_load.read_load(self.proc, processes=self.per_thread)

    def start(self) -> None:
        """The reading the first step's load is measured from."""
        self.last = self.read()

    def after_step(self) -> tuple[int, str] | None:
        """(new count, why) when the count should change now, else None; measures since the last call."""
        now = self.read()
        if now is None or self.last is None:
            self.last = now
            return None
        before, after = self.last.machine, now.machine
        if (after[1] - before[1]) / (after[2] or 1) < FOLLOW_MIN_S * machine_load.clock_ticks():
            return None  # too short to judge: the next step's reading counts from the same start
        load = machine_load.load_between(self.last, now, self.proc)
        self.last = now
        want = fair_threads(self.n_cores, load.competing(self.per_thread), load.cpus)
        self.agreeing = self.agreeing + 1 if want == self.wanted else 1
        self.wanted = want
        if want == self.threads or self.agreeing < FOLLOW_STEPS:
            return None
        old, self.threads = self.threads, want
        return want, (
            f"threads: {old} -> {want} compute thread{'s' if want != 1 else ''} (threads=0 follows the load: "
            f"{load.describe(self.per_thread)} since the last measurement; "
            f"{FOLLOW_STEPS} measurements in a row called for {want})"
        )


__all__ = [
    "ThreadWait",
    "WAIT_SETTINGS",
    "MARKER",
    "inherited",
    "environ_without_plan",
    "cores",
    "SHORT_SPIN",
    "SINGLE_THREAD_ENV",
    "WaitPlan",
    "plan_wait",
    "prepare",
    "current",
    "describe_threads",
    "start_load",
    "BRIEF_SPIN",
    "choose_threads",
    "follows_load",
    "omp_num_threads",
    "LoadFollower",
    "FOLLOW_STEPS",
    "recorded_threads",
    "fair_threads",
    "check_setting",
    "runtime_started",
]
