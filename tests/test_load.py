"""The machine's load as threads=0 reads it (grpolab.util.load): which scheduling group a process is in
(cgroup v1 and v2, autogroup), the busy processes of the run's own group (worked examples on a fake
/proc), what a team competes with, what `auto` then picks for the wait and the count, and the same on the
real kernel beside busy processes started in the trainer's session and each in a new one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.util import load as machine_load
from grpolab.util import threads
from grpolab.util.procs import busy_processes


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_cgroup_reads_v1s_cpu_line():
    text = "9:name=systemd:/\n4:memory:/x\n1:cpu,cpuacct:/user.slice/app\n0::/\n"
    assert machine_load.cpu_cgroup(text) == "/user.slice/app"


def test_cpu_cgroup_v2_stops_where_a_parent_does_not_enable_cpu(tmp_path):
    """cgroup v2: /a/b/c is a scheduling group only where /, /a and /a/b enable the cpu controller for
    their children; here / and /a do, /a/b does not: the group is /a/b."""
    write(tmp_path / "cgroup.subtree_control", "cpuset cpu io memory pids\n")
    write(tmp_path / "a" / "cgroup.subtree_control", "cpu memory\n")
    write(tmp_path / "a" / "b" / "cgroup.subtree_control", "memory\n")
    assert machine_load.cpu_cgroup("0::/a/b/c\n", str(tmp_path)) == "/a/b"
    write(tmp_path / "cgroup.subtree_control", "memory\n")  # no cpu controller at all: the root group
    assert machine_load.cpu_cgroup("0::/a/b/c\n", str(tmp_path)) == "/"
    assert machine_load.cpu_cgroup("garbage") is None


class FakeMachine:
    """A /proc with processes: each has a stat (its CPU ticks), a cgroup and an autogroup."""

    def __init__(self, root: Path, autogroup: bool = True):
        self.root = root
        write(root / "sys" / "kernel" / "sched_autogroup_enabled", "1\n" if autogroup else "0\n")
        self.add("self", ticks=0, group=1)

    def add(self, pid, ticks: int, group: int, cgroup: str = "/"):
        d = self.root / str(pid)
        write(d / "stat", f"{pid} (python -c x) R 1 2 3 4 5 6 7 8 9 10 {ticks} 0 0 0 20 0 1 0 99")
        write(d / "cgroup", f"1:cpu,cpuacct:{cgroup}\n0::/\n")
        write(d / "autogroup", f"/autogroup-{group} nice 0\n")


def test_sched_group_is_the_autogroup_in_the_root_cgroup_and_the_cgroup_elsewhere(tmp_path):
    m = FakeMachine(tmp_path)
    m.add(11, 0, group=1)
    m.add(12, 0, group=7)
    m.add(13, 0, group=7, cgroup="/app.slice")
    proc = str(tmp_path)
    assert machine_load.sched_group("self", proc) == machine_load.sched_group(11, proc) == "/ /autogroup-1"
    assert machine_load.sched_group(12, proc) == "/ /autogroup-7"
    assert machine_load.sched_group(13, proc) == "/app.slice"
    assert machine_load.sched_group(99, proc) is None  # gone
    off = FakeMachine(tmp_path / "off", autogroup=False)
    off.add(12, 0, group=7)
    assert machine_load.sched_group(12, str(tmp_path / "off")) == machine_load.sched_group(
        "self", str(tmp_path / "off")
    )


def test_busy_in_own_group_worked_example(tmp_path):
    """Over an interval of 100 jiffies: process 11 (this run's group) used 90, process 12 (another
    session) 100, process 13 (this group) started during the interval and 14 (this group) used nothing:
    B_own = 90 / 100 = 0.9 (a process not seen at both readings is not counted)."""
    m = FakeMachine(tmp_path)
    proc = str(tmp_path)
    for pid, group in ((11, 1), (12, 7), (14, 1)):
        m.add(pid, 1000, group)
    before = machine_load.process_ticks(proc)
    assert before == {11: 1000, 12: 1000, 14: 1000}  # not "self"
    m.add(11, 1090, 1)
    m.add(12, 1100, 7)
    m.add(13, 50, 1)
    after = machine_load.process_ticks(proc)
    assert machine_load.busy_in_own_group(before, after, 100, proc) == pytest.approx(0.9)
    assert machine_load.busy_in_own_group(before, after, 0, proc) == 0.0


@pytest.mark.parametrize(
    ("busy", "own_group", "per_thread", "competing"),
    [
        (2.0, 2.0, True, 0.0),  # two busy jobs of the run's own session: shared thread by thread
        (2.0, 2.0, False, 2.0),  # a team that spins while it waits competes with all of it
        (2.0, 0.1, True, 1.9),  # two programs of their own
        (1.0, 1.2, True, 0.0),  # never below 0
    ],
)
def test_load_competing(busy, own_group, per_thread, competing):
    assert machine_load.Load(busy, own_group, 2).competing(per_thread) == pytest.approx(competing)


def test_auto_waits_briefly_where_the_machine_was_busy_at_start():
    busy = machine_load.Load(1.9, 0.0, 2)
    plan = threads.plan_wait("auto", {}, busy)
    assert (plan.policy, plan.env["GOMP_SPINCOUNT"], plan.sleeps_soon) == ("brief", str(threads.BRIEF_SPIN), True)
    assert (
        plan.describe()
        == f"threads wait: spin {threads.BRIEF_SPIN} rounds, then sleep (thread_wait=auto; busy at start)"
    )
    assert threads.plan_wait("auto", {}, machine_load.Load(0.3, 0.0, 2)).policy == "short"  # a flicker
    assert threads.plan_wait("auto", {}, None).policy == "short"  # not measured
    assert threads.plan_wait("auto", {"OMP_WAIT_POLICY": "ACTIVE"}, busy).policy == "user"  # the user's own
    assert not threads.plan_wait("short", {}).sleeps_soon and threads.plan_wait("passive", {}).sleeps_soon


def test_choose_threads_leaves_out_the_own_groups_load_only_for_threads_that_sleep_soon(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 2)
    shared = machine_load.Load(2.0, 1.9, 2)  # two jobs started with & from the trainer's shell
    n, why = threads.choose_threads(0, environ={}, measured=shared, per_thread=True)
    assert n == 2 and why == (
        "threads=0: other processes kept 2.0 of 2 cores busy, 1.9 of it in this run's scheduling group "
        "(shared per thread) at start"
    )
    assert threads.choose_threads(0, environ={}, measured=shared, per_thread=False)[0] == 1
    apart = machine_load.Load(2.0, 0.0, 2)  # two programs of their own
    assert threads.choose_threads(0, environ={}, measured=apart, per_thread=True)[0] == 1


def test_load_follower_per_thread_keeps_the_cores_beside_its_own_groups_jobs(tmp_path, monkeypatch):
    """2 cores, two threads that sleep soon: two busy processes of the run's own group leave the count at
    2 (they share per thread); the same two each in a group of its own move it to 1 after two steps."""
    monkeypatch.setattr(machine_load, "clock_ticks", lambda: 100)
    m = FakeMachine(tmp_path)
    total = busy = 0
    t = {11: 0, 12: 0}

    def tick(group: int):
        nonlocal total, busy
        total += 200
        busy += 200  # both cores busy: the spinners' 2 x 50 and this run's 100
        for pid in t:
            t[pid] += 50
            m.add(pid, t[pid], group)
        cpu = [f"cpu  {busy} 0 0 {total - busy} 0 0 0 0 0 0", "cpu0 0", "cpu1 0"]
        write(tmp_path / "stat", "\n".join(cpu) + "\n")
        write(tmp_path / "self" / "stat", f"1 (x) R 1 2 3 4 5 6 7 8 9 10 {busy // 2} 0 0 0 20 0 4 0 99")

    tick(1)
    f = threads.LoadFollower(threads=2, n_cores=2, per_thread=True, proc=str(tmp_path))
    f.start()
    for _ in range(3):
        tick(1)
        assert f.after_step() is None and f.threads == 2
    tick(7)  # the same processes, now in another group (a fresh reading of each)
    f.after_step()
    tick(7)
    n, note = f.after_step()
    assert n == 1 and "1.0 of 2 cores busy" in note and "scheduling group" not in note


REAL = not Path("/proc/stat").exists() or threads.cores() < 2


def kernel_groups() -> str:
    """What this kernel shows of the test process's scheduling group, for a failure's message."""
    shown = []
    for name in ("self/cgroup", "self/autogroup", "sys/kernel/sched_autogroup_enabled", "version"):
        try:
            shown.append(f"/proc/{name}: " + Path("/proc", name).read_text().strip().replace("\n", " | "))
        except OSError as e:
            shown.append(f"/proc/{name}: {e}")
    return " ;; ".join(shown)


@pytest.mark.skipif(REAL, reason="needs Linux and 2 cores")
def test_busy_processes_started_beside_the_trainer_share_its_group():
    """On the real kernel: two spinners started in the session (and cgroup) of this process are in its
    scheduling group, and the load measured beside them is counted as the group's: at least 0.4 of a core
    (the spinners share the group's time: beside another busy group, such as another worker of the test
    suite, the two get about one core between them). Where this kernel does not show the group (no
    cpu cgroup line, no autogroup file), none of the load is counted as the group's."""
    mine = machine_load.sched_group()
    with busy_processes(2, own_sessions=False) as pids:
        time.sleep(0.3)
        shared = machine_load.busy_cores(0.5)
        groups = {machine_load.sched_group(p) for p in pids}
    assert groups == {mine}, kernel_groups()
    if mine is None:  # the group cannot be read here: every load counts as another group's (cautious)
        assert shared.busy >= 1.2 and shared.own_group == 0.0, kernel_groups()
    else:
        assert shared.busy >= 1.2 and shared.own_group >= 0.4, kernel_groups()


def autogroups_apply() -> bool:
    group = machine_load.sched_group()
    return machine_load.autogroup_enabled() and bool(group) and group.startswith("/ ")


@pytest.mark.skipif(REAL or not autogroups_apply(), reason="needs Linux, 2 cores and autogroup in the root cgroup")
def test_busy_processes_each_in_a_new_session_are_other_groups():
    """Spinners each in a new session: each its own group, and their load is not the run's group's
    (the busy cores less the own group's part is at least 1.2 of their 2)."""
    with busy_processes(2) as pids:
        time.sleep(0.3)
        apart = machine_load.busy_cores(0.5)
        groups = [machine_load.sched_group(p) for p in pids]
    assert len(set(groups)) == 2 and machine_load.sched_group() not in groups
    assert apart.competing(per_thread=True) >= 1.2


@pytest.mark.skipif(REAL, reason="needs Linux and 2 cores")
def test_the_train_command_beside_jobs_of_its_own_shell_keeps_its_cores_and_spins_briefly(tmp_path, tiny_model_dir):
    """The real CLI on a tiny model, started beside two spinners of its own session (jobs of its shell):
    the quarter-second measurement before torch starts sees the machine busy, so `auto` spins 1,000
    rounds, and since the spinners share the run's group thread by thread their load does not cost it a
    core: every core on an otherwise idle machine, and fair_threads of the load outside the group beside
    other work (where the kernel shows the group; elsewhere the count follows the whole load)."""
    env = {k: v for k, v in os.environ.items() if k not in (*threads.USER_VARS, threads.MARKER, "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    args = [f"model={tiny_model_dir}", "eval_size=0", "G=2", "batch_size=2", "max_new_tokens=4", "report=false"]
    cmd = [
        sys.executable,
        "-m",
        "grpolab.app.cli",
        "train",
        *args,
        "steps=1",
        f"out={tmp_path / 'run'}",
        "progress=false",
    ]
    with busy_processes(2, own_sessions=False):
        time.sleep(0.3)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    text = " ".join(res.stdout.split())  # the console wraps the first line
    n = threads.cores()
    assert f"spin {threads.BRIEF_SPIN} rounds, then sleep (thread_wait=auto; busy at start)" in text, text[:600]
    if machine_load.sched_group() is None:  # no group to read: the count follows the whole load
        busy = float(re.search(r"other processes kept ([0-9.]+) of", text).group(1))
        t = threads.fair_threads(n, busy)
        assert f"threads: {t} compute thread{'s' if t > 1 else ''} on {n} cores" in text, text[:600]
        assert "scheduling group" not in text, text[:600] + kernel_groups()
    else:  # the spinners' load is shared thread by thread; only load outside the group (another test's) counts
        busy = float(re.search(r"other processes kept ([0-9.]+) of", text).group(1))
        own = float(re.search(r"([0-9.]+) of it in this run's scheduling group", text).group(1))
        assert own >= 0.5, text[:600] + kernel_groups()  # the two spinners were seen in the run's group
        # the line prints each load to 0.1: any rounding of B - B_own within that
        allowed = {threads.fair_threads(n, max(0.0, busy - own + d)) for d in (-0.1, 0.0, 0.1)}
        t = int(re.search(r"threads: ([0-9]+) compute thread", text).group(1))
        assert t in allowed, text[:600] + kernel_groups()
        assert "in this run's scheduling group (shared per thread) at start" in text, text[:600]


def test_prepare_measures_before_torch_only_where_the_wait_can_matter(monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "_current", None)
    monkeypatch.setattr(threads, "_start_load", None)
    monkeypatch.setattr(threads, "runtime_started", lambda: False)
    monkeypatch.setattr(machine_load, "busy_cores", lambda: calls.append(1) or machine_load.Load(2.0, 0.0, 2))
    monkeypatch.setattr(threads, "_saved", {})

    def prepare(setting: str, environ: dict) -> str:
        threads._saved.clear()  # each call in an environment of its own: nothing of the last plan to undo
        return threads.prepare(setting, environ, measure=True).policy

    assert prepare("auto", {}) == "brief" and threads.start_load().busy == 2.0
    assert prepare("auto", {"OMP_NUM_THREADS": "1"}) == "short" and threads.start_load() is None  # no team
    assert prepare("auto", {"GOMP_SPINCOUNT": "5"}) == "user"
    assert prepare("passive", {}) == "passive"
    assert len(calls) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "model=m", "steps=1"],
        ["train", "max_steps=3", "learning_rate=1e-6", "num_generations=2"],  # TRL's names and values
        ["train", "--trl", "max_steps=3"],
        ["eval", "model=m", "--n", "2"],
    ],
)
def test_the_commands_decide_the_wait_before_anything_imports_torch(argv):
    """OpenMP reads its wait policy once, when torch starts it: `train` and `eval` decide theirs (and
    measure the load) before any import of torch, TRL's names and values read through transformers
    included. A fresh interpreter records whether torch was loaded when `prepare` ran, then stops."""
    code = (
        "import sys\n"
        "import grpolab.util.threads as t\n"
        "def record(*a, **k):\n"
        "    print('TORCH_LOADED' if 'torch' in sys.modules else 'TORCH_NOT_LOADED')\n"
        "    raise SystemExit(0)\n"
        "t.prepare = record\n"
        "from grpolab.app.cli import main\n"
        f"main({argv!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "TORCH_NOT_LOADED" in res.stdout, res.stdout + res.stderr[-2000:]
