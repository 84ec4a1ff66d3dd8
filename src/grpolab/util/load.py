"""How busy the machine is: the CPU time other processes use, and how much of it shares this process's
scheduling group.

Linux shares CPU time fairly between scheduling groups first and between the tasks of a group second. A
group is a task's cpu cgroup (the cpu hierarchy of cgroup v1; in cgroup v2 the deepest cgroup on its path
reached through parents that enable the cpu controller); the tasks of the root one are grouped by session
where autogroup is on (/proc/sys/kernel/sched_autogroup_enabled; on desktop Linux every terminal, and
every program a desktop starts, is a session of its own).

For a team of compute threads that waits at every barrier for its slowest thread:
- a busy process in another group takes its group's share of the machine whatever the team's size, so a
  team larger than the idle cores gains no CPU time and waits at every barrier for the thread the kernel
  gave away;
- busy processes in the team's own group (jobs started with `&` from the trainer's shell) share the
  group's time per thread, so a team of one thread per core keeps a share per thread (two threads beside
  two busy processes: half of each core), where its threads sleep soon when they wait.

Where a group cannot be read (no /proc, a cgroup file that does not parse), a process counts as another
group's: the thread count then follows the whole load, the cautious choice.

No torch import here: this module runs before it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

BUSY_PROBE_S = 0.25
"""Seconds over which `busy_cores` watches the machine at start (a sleep: the trainer computes nothing then)."""


@dataclass(frozen=True)
class Reading:
    """The counters at one moment: machine = cpu_times of /proc/stat, own = own_ticks of /proc/self/stat,
    processes = process_ticks (None where not read)."""

    machine: tuple[int, int, int]
    own: int
    processes: dict | None = None


@dataclass(frozen=True)
class Load:
    """What the other processes used over an interval: `busy` cores' worth in all, `own_group` of it in
    this process's scheduling group (0 where not looked at), on a machine of `cpus` cores."""

    busy: float
    own_group: float
    cpus: int

    def competing(self, per_thread: bool) -> float:
        """The load a team of threads competes with for cores:

        B_c = B - B_own   where the team's threads share their group per thread (they sleep soon when
                          they wait, so a waiting thread gives its time back to the group)
        B_c = B           otherwise"""
        return max(0.0, self.busy - self.own_group) if per_thread else self.busy

    def describe(self, per_thread: bool) -> str:
        text = f"other processes kept {self.busy:.1f} of {self.cpus} cores busy"
        if per_thread and self.own_group >= 0.05:
            text += f", {self.own_group:.1f} of it in this run's scheduling group (shared per thread)"
        return text


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


def stat_fields(stat_text: str) -> list[str]:
    """The fields of a /proc/PID/stat text after the command name (which may hold spaces and parentheses):
    index 11 is field 14 of proc(5), utime; 12 stime; 13 cutime; 14 cstime."""
    return stat_text.rsplit(")", 1)[1].split()


def own_ticks(self_stat_text: str) -> int:
    """utime + stime + cutime + cstime from the text of /proc/self/stat, in jiffies: this process (every
    thread) and the children it has waited for (sandboxed candidates, verifier workers), which are its own
    work, not another program's."""
    return sum(int(f) for f in stat_fields(self_stat_text)[11:15])


def others_busy(before: tuple[int, int, int], after: tuple[int, int, int], own: int) -> float:
    """Cores' worth of CPU time the other processes used between two /proc/stat readings:

        B = (d_busy - d_own) / (d_total / cpus)

    d_total / cpus is the interval in jiffies; d_own this process's share of d_busy. Clamped to [0, cpus]."""
    d_busy, d_total, cpus = after[0] - before[0], after[1] - before[1], after[2] or 1
    if d_total <= 0:
        return 0.0
    return min(float(cpus), max(0.0, (d_busy - own) / (d_total / cpus)))


def clock_ticks() -> int:
    """Jiffies per second of /proc/stat (USER_HZ, 100 on Linux)."""
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


CGROUP_ROOT = "/sys/fs/cgroup"


def process_ticks(proc: str = "/proc") -> dict[int, int]:
    """pid -> utime + stime (jiffies, every thread of the process) of every process but this one, from
    /proc/PID/stat; processes that end while they are read are left out."""
    me = os.getpid()
    out: dict[int, int] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"{proc}/{name}/stat") as f:
                fields = stat_fields(f.read())
            out[int(name)] = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            continue
    return out


def cpu_cgroup(cgroup_text: str, cgroup_root: str = CGROUP_ROOT) -> str | None:
    """The cgroup that is the task's scheduling group, from the text of /proc/PID/cgroup: cgroup v1's cpu
    line (`N:cpu,cpuacct:/path`) where there is one, else the v2 line (`0::/path`) cut to its deepest part
    whose parents all enable the cpu controller (their cgroup.subtree_control under `cgroup_root`)."""
    v2 = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "cpu" in controllers.split(","):
            return path
        if controllers == "":
            v2 = path
    if v2 is None:
        return None
    group = "/"
    for part in [p for p in v2.split("/") if p]:
        try:
            enabled = (Path(cgroup_root) / group.lstrip("/") / "cgroup.subtree_control").read_text().split()
        except OSError:
            break
        if "cpu" not in enabled:
            break
        group = group.rstrip("/") + "/" + part
    return group


def sched_group(pid: int | str = "self", proc: str = "/proc", cgroup_root: str = CGROUP_ROOT) -> str | None:
    """The scheduling group of process `pid`: its cpu cgroup, and within the root cgroup its autogroup
    (`/autogroup-N` of /proc/PID/autogroup) where autogroup is on; None where it cannot be read."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            cgroup = cpu_cgroup(f.read(), cgroup_root)
    except OSError:
        return None
    if cgroup is None:
        return None
    if cgroup != "/" or not autogroup_enabled(proc):
        return cgroup
    try:
        with open(f"{proc}/{pid}/autogroup") as f:
            return "/ " + f.read().split()[0]
    except (OSError, IndexError):
        return None


def autogroup_enabled(proc: str = "/proc") -> bool:
    try:
        with open(f"{proc}/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def busy_in_own_group(
    before: dict[int, int],
    after: dict[int, int],
    interval_ticks: float,
    proc: str = "/proc",
    cgroup_root: str = CGROUP_ROOT,
) -> float:
    """Cores' worth of CPU time that processes in this process's scheduling group used between two
    `process_ticks` readings `interval_ticks` jiffies apart:

        B_own = sum over processes p of the group, alive at both readings, of (t_after(p) - t_before(p)) / interval

    Only the processes that used CPU time are looked up."""
    if interval_ticks <= 0:
        return 0.0
    mine = sched_group("self", proc, cgroup_root)
    if mine is None:
        return 0.0
    used = 0
    for pid, t in after.items():
        delta = t - before.get(pid, t)
        if delta > 0 and sched_group(pid, proc, cgroup_root) == mine:
            used += delta
    return used / interval_ticks


def read_load(proc: str = "/proc", processes: bool = False) -> Reading | None:
    """The counters now (every process's own where `processes`); None where /proc cannot be read."""
    try:
        with open(f"{proc}/stat") as f:
            machine = cpu_times(f.read())
        with open(f"{proc}/self/stat") as f:
            own = own_ticks(f.read())
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return Reading(machine, own, process_ticks(proc) if processes else None)


def load_between(before: Reading, after: Reading, proc: str = "/proc", cgroup_root: str = CGROUP_ROOT) -> Load:
    """The other processes' load between two readings (`others_busy`), and the part of it in this
    process's scheduling group where both readings hold every process's counters (`busy_in_own_group`)."""
    cpus = after.machine[2] or 1
    busy = others_busy(before.machine, after.machine, after.own - before.own)
    own_group = 0.0
    if before.processes is not None and after.processes is not None:
        interval = (after.machine[1] - before.machine[1]) / cpus
        own_group = min(busy, busy_in_own_group(before.processes, after.processes, interval, proc, cgroup_root))
    return Load(busy, own_group, cpus)


def busy_cores(interval_s: float = BUSY_PROBE_S, proc: str = "/proc") -> Load | None:
    """The other processes' load over `interval_s` from now (a sleep), with the part of it in this
    process's scheduling group; None where the platform has no /proc/stat."""
    before = read_load(proc, processes=True)
    if before is None:
        return None
    time.sleep(interval_s)
    after = read_load(proc, processes=True)
    if after is None:
        return None
    return load_between(before, after, proc)


__all__ = [
    "BUSY_PROBE_S",
    "CGROUP_ROOT",
    "Reading",
    "Load",
    "cpu_times",
    "stat_fields",
    "own_ticks",
    "others_busy",
    "clock_ticks",
    "process_ticks",
    "cpu_cgroup",
    "sched_group",
    "autogroup_enabled",
    "busy_in_own_group",
    "read_load",
    "load_between",
    "busy_cores",
]
