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
by far more than its fair share (docs/performance.md, "A machine doing something else"). `thread_wait=auto` spins briefly (SHORT_SPIN rounds of libgomp,
SHORT_BLOCKTIME_MS of libomp), long enough for the next region of a step and short enough that a
preempted peer costs a fraction of a slice, then sleeps.

Precedence: an explicit `thread_wait` (passive, active, short) sets the variables it names; `auto` takes
the user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT / KMP_BLOCKTIME where any is set and the short spin
otherwise; `openmp` leaves the runtime's own default. The choice must be made before torch is
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

ThreadWait = Literal["auto", "short", "passive", "active", "openmp"]
"""The `thread_wait` setting: how OpenMP's threads wait (the module docstring says what each does)."""
WAIT_SETTINGS: tuple[str, ...] = typing.get_args(ThreadWait)
USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
MARKER = "GRPOLAB_THREAD_WAIT"  # setting:policy, written beside the variables for the processes started after
SHORT_SPIN = 10_000  # libgomp spin rounds before sleeping: a thirtieth of its default 300,000
SHORT_BLOCKTIME_MS = 1  # libomp/Intel: milliseconds of spinning before sleeping (its unit; 0 = passive)
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""The environment of a helper process beside the trainer (a verifier, a sandboxed candidate): one
compute thread, so that it takes at most one core's share from the trainer's team."""

_SETS = {
    "short": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(SHORT_SPIN), "KMP_BLOCKTIME": str(SHORT_BLOCKTIME_MS)},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None},
    "openmp": {},
}
_WORDS = {
    "short": f"spin {SHORT_SPIN} rounds, then sleep",
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
    policy: str  # short, passive, active, openmp or user (the user's own variables)
    env: dict = field(default_factory=dict)
    applied: bool = True
    user: dict = field(default_factory=dict)  # the user's own variables, where `auto` took them

    def describe(self) -> str:
        """The wait part of the run's first line."""
        if self.policy == "user":
            how = "as set in the environment: " + " ".join(f"{k}={v}" for k, v in self.user.items())
        else:
            how = _WORDS[self.policy]
        text = f"threads wait: {how} (thread_wait={self.setting})"
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


def plan_wait(setting: str = "auto", environ: dict | None = None) -> WaitPlan:
    """The wait policy for `setting` in the environment `environ` (default os.environ); pure."""
    check_setting(setting)
    environ = os.environ if environ is None else environ
    if setting == "auto":
        user = {k: environ[k] for k in USER_VARS if environ.get(k)}
        if user:
            return WaitPlan(setting, "user", {}, user=user)
        return WaitPlan(setting, "short", dict(_SETS["short"]))
    return WaitPlan(setting, setting, dict(_SETS[setting]))


def runtime_started() -> bool:
    """True when torch (and with it the OpenMP runtime, which reads its variables once) is loaded."""
    return "torch" in sys.modules


_current: WaitPlan | None = None
_saved: dict = {}  # the user's values of the variables a plan changed, restored before a new plan


def prepare(setting: str = "auto", environ=None) -> WaitPlan:
    """Decide the wait policy and write it into the environment, if the OpenMP runtime has not started.
    Called again before the start (a command that read its config), it replaces the earlier plan."""
    global _current
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
    plan = plan_wait(setting, environ)
    if runtime_started():
        plan = WaitPlan(plan.setting, plan.policy, plan.env, applied=False, user=plan.user)
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

BUSY_PROBE_S = 0.25
"""Seconds over which `busy_cores` watches the machine at start (a sleep: the trainer computes nothing then)."""
FILE = "threads.json"
"""The thread count a run chose (threads=0), in its directory: a resumed run reuses it (the sums of a
parallel reduction depend on how many threads share them, so the same count gives the same numbers)."""


def cpu_times(stat_text: str) -> tuple[int, int, int]:
    """(busy, total, cpus) from the text of /proc/stat: the aggregate `cpu` line's jiffies, busy = user +
    nice + system + irq + softirq + steal (idle and iowait are not busy; guest time is inside user), and
    the number of `cpuN` lines."""
    lines = stat_text.splitlines()
    head = next(ln for ln in lines if ln.startswith("cpu "))
    v = [int(x) for x in head.split()[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(v)
    busy = total - v[3] - v[4]
    cpus = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    return busy, total, cpus


def own_ticks(self_stat_text: str) -> int:
    """utime + stime + cutime + cstime from the text of /proc/self/stat, in jiffies: this process (every
    thread) and the children it has waited for (sandboxed candidates, verifier workers), which are its own
    work, not another program's."""
    fields = self_stat_text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return sum(int(f) for f in fields[11:15])  # fields 14-17 of proc(5), counted from 1 before the name


def others_busy(before: tuple[int, int, int], after: tuple[int, int, int], own: int) -> float:
    """Cores' worth of CPU time the other processes used between two /proc/stat readings:

        B = (d_busy - d_own) / (d_total / cpus)

    d_total / cpus is the interval in jiffies; d_own this process's share of d_busy. Clamped to [0, cpus]."""
    d_busy, d_total, cpus = after[0] - before[0], after[1] - before[1], after[2] or 1
    if d_total <= 0:
        return 0.0
    return min(float(cpus), max(0.0, (d_busy - own) / (d_total / cpus)))


def fair_threads(n_cores: int, busy: float | None, cpus: int | None = None) -> int:
    """The compute threads that take the cores other processes leave idle:

        T = max(1, min(C, M - round(B)))

    C the cores this process may use, M the machine's (default C), B what `busy_cores` measured (None:
    not measured, T = C).

    On an idle machine T = C. Beside k busy single-threaded processes T = C - k (at least 1): a thread of
    a team that waits at every barrier for its peers makes the whole step wait whenever the kernel gives
    its core to another process, so a team larger than the idle cores runs far below its share
    (docs/performance.md, "A machine doing something else")."""
    if busy is None:
        return n_cores
    return max(1, min(n_cores, (cpus or n_cores) - round(busy)))


def busy_cores(interval_s: float = BUSY_PROBE_S, proc: str = "/proc") -> tuple[float, int] | None:
    """(B, M): cores' worth of CPU the other processes used over `interval_s` (`others_busy`) and the
    machine's cores; None where the platform has no /proc/stat."""
    import time

    before = read_load(proc)
    if before is None:
        return None
    time.sleep(interval_s)
    after = read_load(proc)
    if after is None:
        return None
    return others_busy(before[0], after[0], after[1] - before[1]), after[0][2]


def clock_ticks() -> int:
    """Jiffies per second of /proc/stat (USER_HZ, 100 on Linux)."""
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


def read_load(proc: str = "/proc") -> tuple[tuple[int, int, int], int] | None:
    """(cpu_times of /proc/stat, own_ticks of /proc/self/stat) now; None where they cannot be read."""
    try:
        with open(f"{proc}/stat") as f:
            machine = cpu_times(f.read())
        with open(f"{proc}/self/stat") as f:
            own = own_ticks(f.read())
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return machine, own


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


def choose_threads(setting: int, recorded: int | None = None, environ=None) -> tuple[int, str]:
    """(threads, why) for the config key `threads`: N > 0 as given; 0 the run's recorded choice when
    resuming, else OMP_NUM_THREADS where the environment sets it (torchrun does, for a job of several
    processes sharing a machine), else `fair_threads` of a `busy_cores` measurement."""
    n = cores()
    if setting > 0:
        return setting, "threads=" + str(setting)
    if recorded:
        return recorded, f"as recorded in {FILE} by the run"
    given = omp_num_threads(environ)
    if given:
        return given, f"OMP_NUM_THREADS={given} in the environment"
    measured = busy_cores()
    if measured is None:
        return n, "every core (no /proc/stat to measure the machine's load)"
    busy, cpus = measured
    t = fair_threads(n, busy, cpus)
    return t, f"threads=0: other processes kept {busy:.1f} of {cpus} cores busy at start"


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
    proc: str = "/proc"
    last: tuple | None = None
    wanted: int | None = None
    agreeing: int = 0

    def start(self) -> None:
        """The reading the first step's load is measured from."""
        self.last = read_load(self.proc)

    def after_step(self) -> tuple[int, str] | None:
        """(new count, why) when the count should change now, else None; measures since the last call."""
        now = read_load(self.proc)
        if now is None or self.last is None:
            self.last = now
            return None
        (before, own0), (after, own1) = self.last, now
        if (after[1] - before[1]) / (after[2] or 1) < FOLLOW_MIN_S * clock_ticks():
            return None  # too short to judge: the next step's reading counts from the same start
        self.last = now
        busy = others_busy(before, after, own1 - own0)
        want = fair_threads(self.n_cores, busy, after[2])
        self.agreeing = self.agreeing + 1 if want == self.wanted else 1
        self.wanted = want
        if want == self.threads or self.agreeing < FOLLOW_STEPS:
            return None
        old, self.threads = self.threads, want
        return want, (
            f"threads: {old} -> {want} compute thread{'s' if want != 1 else ''} (threads=0 follows the load: "
            f"other processes kept {busy:.1f} of {after[2]} cores busy since the last measurement; "
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
    "busy_cores",
    "read_load",
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
