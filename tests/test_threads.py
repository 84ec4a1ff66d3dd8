"""The CPU threads' wait policy (grpolab.util.threads): what each thread_wait setting writes into the
environment, that the user's own variables win under auto, that a plan made after torch started says
it was not applied, that OpenMP really reads it when it is made first, that the run's first line names it,
and that the processes beside the trainer (busy load, verifiers, sandboxed candidates) are set up for one core;
and the thread count of threads=0: the load other processes put on the machine, measured from /proc/stat
(worked examples), the count that leaves them their cores, its record for a resumed run, and how it
follows the load between steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.training.config import ConfigError, build_config, thread_wait_of
from grpolab.util import load as machine_load
from grpolab.util import threads
from grpolab.util.procs import busy_processes

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture()
def fresh(monkeypatch):
    """No plan made yet in this process."""
    monkeypatch.setattr(threads, "_current", None)
    monkeypatch.setattr(threads, "_start_load", None)
    monkeypatch.setattr(threads, "_saved", {})


def test_auto_is_a_short_spin_when_the_user_set_nothing():
    plan = threads.plan_wait("auto", {})
    assert plan.policy == "short"
    assert plan.env == {
        "OMP_WAIT_POLICY": None,
        "GOMP_SPINCOUNT": str(threads.SHORT_SPIN),
        "KMP_BLOCKTIME": str(threads.SHORT_BLOCKTIME_MS),
    }
    assert threads.SHORT_SPIN < 300_000  # shorter than libgomp's own default spin


@pytest.mark.parametrize("var, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "5"), ("KMP_BLOCKTIME", "0")])
def test_auto_keeps_the_users_own_variable(var, value):
    plan = threads.plan_wait("auto", {var: value, "PATH": "/bin"})
    assert plan.policy == "user" and plan.env == {} and plan.user == {var: value}
    assert f"as set in the environment: {var}={value} (thread_wait=auto)" in plan.describe()


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("passive", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"}),
        ("active", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None}),
        ("short", {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(threads.SHORT_SPIN), "KMP_BLOCKTIME": "1"}),
        ("openmp", {}),
    ],
)
def test_an_explicit_setting_overrides_the_users_variables(setting, expected):
    plan = threads.plan_wait(setting, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "7"})
    assert plan.policy == setting and plan.env == expected


def test_an_unknown_setting_is_refused():
    with pytest.raises(
        ValueError, match="thread_wait: 'spin' is not one of auto, short, brief, passive, active, openmp"
    ):
        threads.plan_wait("spin", {})


def test_prepare_writes_replaces_and_restores(fresh, monkeypatch):
    monkeypatch.setattr(threads, "runtime_started", lambda: False)
    env = {"GOMP_SPINCOUNT": "99", "PATH": "/bin"}
    plan = threads.prepare("passive", env)
    assert plan.applied
    assert env == {
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": "0",
        "KMP_BLOCKTIME": "0",
        "PATH": "/bin",
        threads.MARKER: "passive:passive",
    }
    assert threads.environ_without_plan(env) == {"GOMP_SPINCOUNT": "99", "PATH": "/bin"}  # the user's value back
    plan = threads.prepare("auto", env)  # the command's config read later: the first plan is undone first
    assert plan.policy == "user" and plan.user == {"GOMP_SPINCOUNT": "99"}
    assert env == {"GOMP_SPINCOUNT": "99", "PATH": "/bin", threads.MARKER: "auto:user"}


def test_a_plan_made_after_torch_started_says_it_was_not_applied(fresh):
    import torch  # noqa: F401  (the runtime has started)

    env = {}
    plan = threads.prepare("passive", env)
    assert not plan.applied and env == {}  # nothing written: OpenMP would not read it again
    assert "not applied: torch was imported before grpolab could set it" in plan.describe()


def test_a_child_inherits_its_parents_plan(fresh):
    import torch  # noqa: F401

    env = {"GOMP_SPINCOUNT": str(threads.SHORT_SPIN), "KMP_BLOCKTIME": "1", threads.MARKER: "auto:short"}
    plan = threads.prepare("auto", env)  # set by the parent before this process started: applied
    assert plan.applied and plan.policy == "short"
    assert threads.inherited("passive", env) is None  # another setting was asked for: not the parent's


def test_first_line_names_threads_cores_and_the_policy():
    plan = threads.plan_wait("auto", {})
    assert threads.describe_threads(2, plan, 2) == (
        f"threads: 2 compute threads on 2 cores; threads wait: spin {threads.SHORT_SPIN} rounds, then sleep "
        f"(thread_wait=auto)"
    )
    assert threads.describe_threads(1, threads.plan_wait("openmp", {}), 1).startswith(
        "threads: 1 compute thread on 1 core; threads wait: the OpenMP runtime's default"
    )


def test_config_field_default_override_and_refusal():
    assert build_config({}, []).thread_wait == "auto"
    assert build_config({"thread_wait": "passive"}, ["thread_wait=active"]).thread_wait == "active"
    assert thread_wait_of({"thread_wait": "passive"}, []) == "passive"
    assert thread_wait_of({}, ["thread_wait=openmp"]) == "openmp"
    with pytest.raises(ConfigError, match="thread_wait"):
        build_config({}, ["thread_wait=spin"])
    with pytest.raises(ConfigError, match="thread_wait: must be one of"):
        thread_wait_of({"thread_wait": "spin"}, [])


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (*threads.USER_VARS, threads.MARKER)}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_openmp_reads_what_prepare_wrote_before_torch():
    """libgomp prints the values it started with (OMP_DISPLAY_ENV=VERBOSE): the spin count of the plan."""
    code = (
        "from grpolab.util.threads import prepare; import sys; p = prepare(sys.argv[1]); "
        "assert p.applied, p; import torch; torch.ones(4).sum()"
    )
    for setting, line in (
        ("auto", f"GOMP_SPINCOUNT = '{threads.SHORT_SPIN}'"),
        ("passive", "OMP_WAIT_POLICY = 'PASSIVE'"),
    ):
        res = subprocess.run(
            [sys.executable, "-c", code, setting],
            # a clean environment: nothing an earlier test left in os.environ reaches OpenMP
            env={
                "PATH": os.environ.get("PATH", ""),
                "HOME": os.environ.get("HOME", "/root"),
                "PYTHONPATH": str(SRC),
                "OMP_DISPLAY_ENV": "VERBOSE",
            },
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert line in res.stderr, res.stderr[-2000:]


def test_the_train_command_says_its_wait_policy_first(tmp_path, tiny_model_dir):
    """The real CLI, one step on a tiny model: the first line names the override, and OpenMP read it."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab.app.cli",
            "train",
            f"model={tiny_model_dir}",
            "steps=1",
            "G=2",
            "batch_size=2",
            "max_new_tokens=4",
            "eval_size=0",
            f"out={tmp_path / 'run'}",
            "progress=false",
            "report=false",
            "tensorboard=false",
            "thread_wait=passive",
            "precision=fp32",
        ],
        env={**_env(), "OMP_DISPLAY_ENV": "TRUE"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = " ".join(res.stdout.split())  # the console wraps long lines
    assert out.startswith("threads: ") and out.index("(thread_wait=passive)") < out.index("rollout engine:")
    assert "threads wait: sleep at once (OMP_WAIT_POLICY=PASSIVE) (thread_wait=passive)" in out
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in res.stderr


def test_busy_processes_run_for_the_block_and_are_gone_after():
    with busy_processes(2) as pids:
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # alive
            deadline = time.monotonic() + 10  # between fork and exec the command line is not yet the child's
            while (args := Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))[-2:-1] != [b"while True: pass"]:
                assert time.monotonic() < deadline, args
                time.sleep(0.05)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_helpers_beside_the_trainer_get_one_thread():
    from grpolab.sandbox import launcher

    cfg = launcher.launcher_config(
        exec_python=None,
        plan=None,
        uid=None,
        workdir="/tmp",
        limits={},
        res_fd=3,
        wall_s=1,
        cgroups=[],
        seccomp=None,
        tmpfs_mb=1,
        tmpfs_inodes=1,
    )
    assert cfg["thread_env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    assert 'os.environ.update(cfg["thread_env"])' in launcher.LAUNCHER_SRC  # the candidate's environment gets it


def test_bench_takes_a_busy_count():
    from grpolab.app.bench import spec as bench_spec

    s = bench_spec.parse_spec(["--setting", "a", "--busy", "2"])
    assert s.busy == 2 and s.describe().endswith("; beside 2 busy processes")
    assert bench_spec.parse_spec(["--setting", "a"]).busy == 0
    with pytest.raises(ConfigError, match="--busy"):
        bench_spec.parse_spec(["--busy", "-1"])


# --- how many threads: threads=0 takes the cores other processes leave idle --------------------------

STAT_BEFORE = "cpu  100 0 50 1000 10 0 0 0 0 0\ncpu0 50 0 25 500 5 0 0 0 0 0\ncpu1 50 0 25 500 5 0 0 0 0 0\nintr 1\n"
STAT_AFTER = "cpu  200 0 90 1080 10 5 5 0 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\ncpu1 1 0 0 0 0 0 0 0 0 0\n"


def test_cpu_times_and_others_busy_worked_example():
    """/proc/stat: busy = user + nice + system + irq + softirq + steal; over the interval the machine's two
    cores did 100 + 40 + 5 + 5 = 150 busy jiffies of 230 (d_total / cpus = 115 jiffies of wall time), and
    this process 35 of them: B = (150 - 35) / 115 = 1.0 core."""
    before, after = machine_load.cpu_times(STAT_BEFORE), machine_load.cpu_times(STAT_AFTER)
    assert before == (150, 1160, 2)
    assert after == (300, 1390, 2)
    assert machine_load.others_busy(before, after, own=35) == pytest.approx(115 / 115)
    assert machine_load.others_busy(before, after, own=200) == 0.0  # clamped: never below 0
    assert machine_load.others_busy(before, before, own=0) == 0.0  # no time passed


def test_own_ticks_reads_its_own_and_its_waited_childrens_time_past_a_name_with_spaces():
    line = "4242 (python -c x) S 1 2 3 4 5 6 7 8 9 10 17 3 5 2 20 0 4 0 99"
    assert machine_load.own_ticks(line) == 17 + 3 + 5 + 2  # utime stime cutime cstime


class FakeProc:
    """A /proc with a stat and a self/stat that the test advances: `tick(busy, own)` adds one interval of
    100 jiffies per core in which the machine's cores were busy `busy` cores' worth and this process
    used `own` of it."""

    def __init__(self, root: Path, cpus: int = 2):
        self.root, self.cpus, self.busy, self.total, self.own = root, cpus, 0, 0, 0
        (root / "self").mkdir(parents=True)
        self.write()

    def write(self):
        idle = self.total - self.busy
        lines = [f"cpu  {self.busy} 0 0 {idle} 0 0 0 0 0 0"] + [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(self.cpus)]
        (self.root / "stat").write_text("\n".join(lines) + "\n")
        (self.root / "self" / "stat").write_text(f"1 (x) S 1 2 3 4 5 6 7 8 9 10 {self.own} 0 0 0 20 0 4 0 99")

    def tick(self, busy: float, own: float):
        self.busy += round(100 * busy)
        self.own += round(100 * own)
        self.total += 100 * self.cpus
        self.write()


def test_load_follower_moves_after_two_steps_agree_and_ignores_a_burst(tmp_path, monkeypatch):
    """2 cores, started alone on 2 threads. Worked example of one step: the machine busy 1.9 cores' worth,
    this process 0.9 of it: the others used B = 1.0, so the count called for is 2 - round(1.0) = 1."""
    monkeypatch.setattr(machine_load, "clock_ticks", lambda: 100)  # each tick() is one second
    proc = FakeProc(tmp_path)
    f = threads.LoadFollower(threads=2, n_cores=2, proc=str(tmp_path))
    f.start()
    proc.tick(busy=1.9, own=1.6)  # this process alone (0.3 of noise)
    assert f.after_step() is None
    proc.tick(busy=1.9, own=0.9)  # a burst of one step: 1.0 core of others
    assert f.after_step() is None
    proc.tick(busy=1.8, own=1.7)
    assert f.after_step() is None  # the burst ended: nothing moved
    proc.tick(busy=2.0, own=1.0)  # load arrives and stays
    assert f.after_step() is None  # one step calls for 1: not yet
    proc.tick(busy=2.0, own=0.7)  # 1.3 cores of others: round -> 1 again
    n, note = f.after_step()
    assert (n, f.threads) == (1, 1)
    assert note.startswith("threads: 2 -> 1 compute thread (threads=0 follows the load") and "1.3 of 2" in note
    proc.tick(busy=2.0, own=0.67)
    assert f.after_step() is None  # stays at 1 while the load stays
    proc.tick(busy=0.9, own=0.9)  # the load left
    assert f.after_step() is None
    proc.tick(busy=0.9, own=0.85)
    assert f.after_step()[0] == 2


def test_load_follower_judges_short_steps_together(tmp_path, monkeypatch):
    """Steps shorter than FOLLOW_MIN_S are measured together: four steps of a quarter second under load
    make one interval of a second, and two such intervals move the count."""
    monkeypatch.setattr(machine_load, "clock_ticks", lambda: 100)
    proc = FakeProc(tmp_path)
    f = threads.LoadFollower(threads=2, n_cores=2, proc=str(tmp_path))
    f.start()
    results = []
    for _ in range(8):
        proc.busy += 50  # a quarter second on 2 cores: 50 jiffies busy, all of them another process's
        proc.total += 50
        proc.write()
        results.append(f.after_step())
    assert results[:7] == [None] * 7
    assert results[7][0] == 1  # intervals ending at steps 4 and 8 both called for one thread


def test_load_follower_without_proc_does_nothing(tmp_path):
    f = threads.LoadFollower(threads=2, n_cores=2, proc=str(tmp_path / "none"))
    f.start()
    assert f.after_step() is None and f.after_step() is None and f.threads == 2


def test_only_threads_0_without_omp_num_threads_follows_the_load():
    assert threads.follows_load(0, environ={})
    assert not threads.follows_load(2, environ={})
    assert not threads.follows_load(0, environ={"OMP_NUM_THREADS": "1"})  # torchrun's processes
    assert threads.follows_load(0, environ={"OMP_NUM_THREADS": "x"})  # not a count: ignored, as at start


@pytest.mark.parametrize(
    ("cores", "busy", "cpus", "expected"),
    [
        (2, 0.0, None, 2),  # idle: every core
        (2, 0.3, None, 2),  # an editor's flicker rounds to nothing
        (2, 1.0, None, 1),  # one busy process: the idle core
        (2, 2.0, None, 1),  # two: at least one thread
        (8, 1.6, None, 6),  # 8 - round(1.6)
        (2, 10.0, 64, 2),  # a 64-core machine with 10 busy: this process's 2 cores are its limit
        (4, None, None, 4),  # not measured: every core
    ],
)
def test_fair_threads(cores, busy, cpus, expected):
    assert threads.fair_threads(cores, busy, cpus) == expected


def test_choose_threads_precedence(monkeypatch):
    monkeypatch.setattr(machine_load, "busy_cores", lambda *a, **k: machine_load.Load(1.0, 0.0, 2))
    monkeypatch.setattr(threads, "cores", lambda: 2)
    assert threads.choose_threads(3, recorded=1, environ={"OMP_NUM_THREADS": "4"}) == (3, "threads=3")
    n, why = threads.choose_threads(0, recorded=2, environ={"OMP_NUM_THREADS": "4"})
    assert (n, threads.FILE in why) == (2, True)  # a resumed run keeps its count
    assert threads.choose_threads(0, environ={"OMP_NUM_THREADS": "4"})[0] == 4  # the user's (torchrun's) variable
    n, why = threads.choose_threads(0, environ={"OMP_NUM_THREADS": "zero"})
    assert (n, why) == (1, "threads=0: other processes kept 1.0 of 2 cores busy at start")


def test_recorded_threads(tmp_path):
    assert threads.recorded_threads(tmp_path) is None
    (tmp_path / threads.FILE).write_text('{"threads": 3}\n')
    assert threads.recorded_threads(tmp_path) == 3
    (tmp_path / threads.FILE).write_text('{"threads": "3"}\n')
    assert threads.recorded_threads(tmp_path) is None  # not a count grpolab wrote


def test_busy_cores_sees_two_spinning_processes():
    """Beside two processes spinning at 100% of a core, the other processes' load measured over half a
    second is at least 1.5 cores on a machine of 2 or more (the spinners can only add to whatever else
    runs; 0.5 core of slack for scheduling), and the count then leaves them their cores."""
    if not Path("/proc/stat").exists() or threads.cores() < 2:
        pytest.skip("needs Linux's /proc/stat and at least 2 cores")
    with busy_processes(2):
        time.sleep(0.3)  # let them start spinning
        load = machine_load.busy_cores(0.5)
    assert 1.5 <= load.busy <= load.cpus
    assert threads.fair_threads(threads.cores(), load.competing(False), load.cpus) <= max(1, load.cpus - 1)


def test_the_train_command_records_its_thread_count_and_resume_keeps_it(tmp_path, tiny_model_dir):
    """The real CLI on a tiny model with OMP_NUM_THREADS unset: threads=0 measures, says so on its first
    line and writes threads.json; --resume reuses the count recorded there."""
    out = tmp_path / "run"
    env = {k: v for k, v in _env().items() if k != "OMP_NUM_THREADS"}
    base = [sys.executable, "-m", "grpolab.app.cli", "train"]
    args = [f"model={tiny_model_dir}", "eval_size=0", "G=2", "batch_size=2", "max_new_tokens=4", "report=false"]
    res = subprocess.run(
        [*base, *args, "steps=1", f"out={out}", "progress=false"], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    first = next(ln for ln in res.stdout.splitlines() if ln.startswith("threads:"))
    assert "threads=0: other processes kept" in first, first
    recorded = json.loads((out / threads.FILE).read_text())["threads"]
    assert 1 <= recorded <= threads.cores()
    (out / threads.FILE).write_text(json.dumps({"threads": 1}) + "\n")  # as if it had started on a busy machine
    res = subprocess.run(
        [*base, "--resume", str(out), "steps=2", "progress=false"], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    first = next(ln for ln in res.stdout.splitlines() if ln.startswith("threads:"))
    assert first.startswith("threads: 1 compute thread on") and threads.FILE in first, first
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["threads"] == 1.0  # each step's count is logged
