"""The sandbox: plain-data encoding, type-strict grading, limits, isolation, the bounded pool."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from grpolab import sandbox as sb
from grpolab.sandbox import SandboxConfig, TestCase, channel, grading, isolation, literal_test, run_many, run_tests
from grpolab.util.fields import ConfigError
from grpolab.util.values import plain_equal

ADD = [literal_test("add(1, 2)", "3"), literal_test("add(-4, 4)", "0"), literal_test("add(10, 5)", "15")]
GOOD = "def add(a, b):\n    return a + b\n"
FAST = SandboxConfig(timeout_s=3.0)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -7,
        2**80,
        -(2**200),
        1.5,
        float("inf"),
        "h\u00e9",
        b"\x00\xff",
        1 + 2j,
        [1, [2, (3,)]],
        (1, "a"),
        {1, 2},
        frozenset({"x"}),
        {"a": [1], 2: (None,)},
    ],
)
def test_plain_roundtrip(value):
    enc = json.loads(json.dumps(channel._plain(value)))
    assert plain_equal(value, channel._unplain(enc))  # in the child
    assert plain_equal(value, channel.decode(enc, channel.Budget()))  # in the parent (sets, dicts unhashed)


def test_plain_rejects_non_plain_types():
    class Eq:
        def __eq__(self, other):
            return True

    class MyInt(int):
        def __eq__(self, other):
            return True

    for v in (Eq(), MyInt(3), [Eq()], {"k": MyInt(1)}, iter([1]), object()):
        with pytest.raises(TypeError):
            channel._plain(v)
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError):
        channel._plain(deep)
    with pytest.raises(ValueError):
        channel._plain("x" * (channel.MAX_VALUE_CHARS + 1))


def test_plain_equal_is_type_strict():
    assert plain_equal(3, 3.0) and plain_equal(0.1 + 0.2, 0.3)
    assert not plain_equal(True, 1) and not plain_equal(1, True)
    assert not plain_equal([1, 2], (1, 2))
    assert not plain_equal("1", 1)
    assert plain_equal({1, 2}, frozenset({2, 1}))
    assert not plain_equal({"a": 1}, {"a": 1, "b": 2})
    assert not plain_equal(None, 0)


def test_literal_test_parses_without_evaluating():
    t = literal_test("f([1, 2], 'x', (3,))", "{'a': 1}")
    assert t.fn == "f" and t.args == ([1, 2], "x", (3,)) and t.expected == {"a": 1}
    for bad in ("f(g(1))", "f(__import__('os'))", "x.f(1)", "f(a=1)"):
        with pytest.raises(ValueError):
            literal_test(bad, "1")


def test_expected_values_never_reach_the_child():
    tests = [literal_test("add(1, 2)", "'SECRET-EXPECTED-VALUE'")]
    job = grading.encode_job("def add(a, b): pass", tests)
    assert b"SECRET-EXPECTED-VALUE" not in job


def test_correct_wrong_and_partial():
    assert run_tests(GOOD, ADD, FAST).passed == [True, True, True]
    r = run_tests("def add(a, b):\n    return 3\n", ADD, FAST)
    assert r.passed == [True, False, False] and r.fraction == pytest.approx(1 / 3)
    assert "expected 0, got 3" in r.details[1]


def test_load_error_and_missing_function():
    r = run_tests("def add(a, b) return a", ADD, FAST)
    assert r.fraction == 0 and r.load_error and "SyntaxError" in r.load_error
    r = run_tests("def plus(a, b):\n    return a + b\n", ADD, FAST)
    assert r.fraction == 0 and "KeyError" in r.details[0]


def test_exceptions_and_type_strictness_in_the_loop():
    code = "def add(a, b):\n    if a == 1: raise ValueError('no')\n    return float(a + b) if a == 10 else a + b\n"
    r = run_tests(code, ADD, FAST)
    assert r.passed == [False, True, True]  # 15.0 == 15 numerically; bool would not pass
    r = run_tests("def add(a, b):\n    return True\n", [literal_test("add(0, 1)", "1")], FAST)
    assert r.passed == [False]


def test_tolerance_tests():
    t = TestCase("call", fn="f", args=(), expected=0.3, tol=1e-6)
    assert run_tests("def f():\n    return 0.3000001\n", [t], FAST).passed == [True]
    assert run_tests("def f():\n    return 0.31\n", [t], FAST).passed == [False]
    assert run_tests("def f():\n    return '0.3'\n", [t], FAST).passed == [False]


def test_timeout_keeps_results_reported_before_it():
    code = "def add(a, b):\n    if a == 10:\n        while True: pass\n    return a + b\n"
    t = time.monotonic()
    r = run_tests(code, ADD, SandboxConfig(timeout_s=1.5))
    assert time.monotonic() - t < 4
    assert r.timed_out and r.passed == [True, True, False]


def test_output_is_captured_and_capped():
    code = "import sys\nprint('hello')\nsys.stderr.write('x' * 10**6)\ndef add(a, b):\n    return a + b\n"
    r = run_tests(code, ADD, SandboxConfig(timeout_s=3.0, max_output_bytes=1000))
    assert r.stdout.startswith("hello") and len(r.stderr) <= 1000


def test_duplicate_results_are_tampering():
    records, _, tampered = grading.parse_results(b'{"i": 0, "v": 3}\n{"i": 0, "v": 3}\n', 1)
    assert tampered
    records, _, tampered = grading.parse_results(b'{"i": 5, "v": 3}\n', 1)
    assert tampered and records == {}
    records, _, tampered = grading.parse_results(b'{"i": 0, "v": NaN}\n', 1)
    assert tampered
    records, _, tampered = grading.parse_results(b'{"tampered": "reply out of protocol"}\n', 1)
    assert tampered


def test_no_tests_is_zero():
    assert run_tests(GOOD, [], FAST).fraction == 0.0


def test_config_validation():
    with pytest.raises(ConfigError, match="isolation"):
        SandboxConfig(isolation="maybe").validate()
    with pytest.raises(ConfigError, match="memory_mb"):
        SandboxConfig(memory_mb=0).validate()
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxConfig(timeout_s=-1).validate()


def test_isolation_probe_reports_namespaces_here():
    iso = sb.probe_isolation()
    assert iso.describe()
    if os.geteuid() == 0 and iso.namespaces:
        assert iso.full and iso.drop_uid


def test_require_refuses_reduced_isolation(monkeypatch, capsys):
    reduced = sb.Isolation(namespaces=False, user_ns=False, drop_uid=False, uid_base=None, reason="test")
    monkeypatch.setattr(sb, "_probe_result", reduced)
    monkeypatch.setattr(sb, "_warned", False)
    with pytest.raises(sb.SandboxUnavailable, match="REDUCED ISOLATION"):
        sb.check_isolation("require")
    assert sb.check_isolation("best_effort") is reduced
    sb.check_isolation("best_effort")
    err = capsys.readouterr().err
    assert err.count("REDUCED ISOLATION") == 1  # warned once, prominently


def test_run_many_is_bounded_and_ordered():
    jobs = [(GOOD if i % 2 == 0 else "def add(a, b):\n    return 0\n", ADD) for i in range(6)]
    res = run_many(jobs, FAST, workers=8)
    assert [r.fraction for r in res] == [1.0, pytest.approx(1 / 3)] * 3


# ----------------------------------------------------------------------------- numeric edge cases (finding 6)


def test_plain_equal_never_raises_on_huge_or_overflowing_numbers():
    big = 10**5000
    assert plain_equal(big, big) and not plain_equal(big, big + 1)
    assert not plain_equal(1.0, big) and not plain_equal(big, 1e308)  # int too large for a float
    assert not plain_equal(float("inf"), big) and not plain_equal(big, float("nan"))
    assert plain_equal(float("inf"), float("inf")) and not plain_equal(float("inf"), float("-inf"))
    assert not plain_equal([1e308], [10**400]) and not plain_equal({"a": big}, {"a": 1.5})


def test_numeric_edge_cases_fail_only_their_own_test():
    tests = [
        literal_test("f(1)", "1"),
        literal_test("f(2)", "2.5"),
        literal_test("f(3)", "3"),
        TestCase("call", fn="f", args=(4,), expected=1.5, tol=1e-6),
        TestCase("call", fn="f", args=(5,), expected=10**5000),
    ]
    code = "def f(x):\n    return {1: 1, 2: 10**5000, 3: 3, 4: 10**400, 5: 10**5000}[x]\n"
    r = run_tests(code, tests, FAST)
    assert r.passed == [True, False, True, False, True], r.details
    assert "bits" in r.details[1]  # a short description, not a 5000-digit (or failing) repr
    r = run_tests("def f(x):\n    return float('1e308') * 10 if x == 2 else x\n", tests[:3], FAST)
    assert r.passed == [True, False, True]


# ----------------------------------------------------------------------------- argument fidelity (finding 7)


def test_dict_argument_order_and_sets_reach_the_candidate_as_given():
    d = {"b": 1, "a": 2, "c": 3}
    tests = [
        TestCase("call", fn="keys", args=(d,), expected=["b", "a", "c"]),
        TestCase("call", fn="grow", args=({2, 3},), expected=["set", 3]),
        TestCase("call", fn="grow", args=(frozenset({2}),), expected=["frozenset", 1]),
    ]
    code = (
        "def keys(d):\n    return list(d)\n"
        "def grow(s):\n"
        "    if type(s) is set:\n        s.add(1)\n"
        "    return [type(s).__name__, len(s)]\n"
    )
    assert run_tests(code, tests, FAST).passed == [True, True, True]


# ----------------------------------------------------------------------------- decoding budget (finding 2)


def test_decoding_builds_no_hash_table_and_is_budgeted():
    p = (1 << 61) - 1
    crafted = {"$": "set", "v": [{"$": "int", "v": hex(1 + k * p)} for k in range(80_000)]}
    t = time.monotonic()
    value = channel.decode(crafted, channel.Budget())
    assert not plain_equal({1, 2, 3}, value) and plain_equal(value, value)
    assert time.monotonic() - t < 3.0  # a frozenset of these takes tens of seconds
    with pytest.raises(channel.Tampered):
        channel.decode({"$": "list", "v": list(range(300_000))}, channel.Budget())
    deep: object = 1
    for _ in range(60):
        deep = {"$": "list", "v": [deep]}
    with pytest.raises(channel.Tampered):
        channel.decode(deep, channel.Budget())
    budget = channel.Budget(seconds=0.0)
    with pytest.raises(channel.Tampered):
        channel.decode({"$": "list", "v": list(range(5000))}, budget)
    passed, details, tampered = grading.grade(
        [literal_test("f()", "[1]")], {0: {"i": 0, "v": {"$": "list", "v": list(range(300_000))}}}
    )
    assert tampered and passed == [False]


# ----------------------------------------------------------------------------- what the candidate sees (finding 1)


def test_the_candidate_sees_only_the_planned_root():
    iso = sb.probe_isolation()
    if not iso.namespaces:
        pytest.skip(f"no mount namespace on this machine: {iso.describe()}")
    plan = isolation.root_plan(isolation.interpreter())
    code = (
        "import os\n"
        "def walk(skip):\n"
        "    out = []\n"
        "    for d, dirs, files in os.walk('/'):\n"
        "        dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip]\n"
        "        out += [os.path.join(d, x) for x in dirs + files]\n"
        "    return sorted(out)\n"
    )
    r, values = sb._run(
        code, [TestCase("call", fn="walk", args=(plan["trees"] + plan["masks"],))], FAST, iso, want_values=True
    )
    seen = set(values[0])
    allowed = (
        set(plan["dirs"])
        | set(plan["files"])
        | {k for k, _ in plan["links"]}
        | set(plan["trees"])
        | set(plan["masks"])
        | {"/tmp", "/tmp/work"}
    )
    assert seen and seen <= allowed, sorted(seen - allowed)[:20]
    assert not any(p.startswith(("/work", "/proc/", "/home", "/etc", "/sys/")) for p in seen)
    assert any(p.endswith("site-packages") for p in plan["masks"]) or not plan["masks"]


# ----------------------------------------------------------------------------- uid leases (finding 4)


def test_uid_leases_are_machine_wide_whatever_the_tmpdir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("uid leases are only taken when running as root")
    # Before: leases lived under $TMPDIR, so a trainer with another TMPDIR took the same uids (and
    # its sweeps killed our candidates).
    mine = sb.slots.Slots(1)
    ours = {sb.slots.SLOTS.uid(0), mine.uid(0)}
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "from grpolab.sandbox import slots\n"
        "s = slots.Slots(1)\nprint(s.uid(0), flush=True)\nsys.stdin.read()\n"
    ) % (str(sb.__file__).rsplit("/grpolab/", 1)[0],)
    other = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        theirs = int(other.stdout.readline())
    finally:
        other.communicate("")
    assert theirs not in ours
    assert all(os.path.exists(os.path.join(sb.slots.LEASE_DIR, f"{u}.lock")) for u in ours)


def test_uids_of_real_accounts_are_never_leased_or_swept(monkeypatch):
    assert not sb.slots.uid_is_unused(0) and not sb.slots.uid_is_unused(65534)  # root, nobody
    if os.geteuid() != 0:
        pytest.skip("sweeping needs root")
    victim = subprocess.Popen(["sleep", "30"], user=65533, group=65533)
    try:
        s = sb.slots.Slots(1)
        with pytest.raises(ValueError, match="not leased"):
            s.sweep(65533)
        time.sleep(0.1)
        assert victim.poll() is None  # left alone
        lease = sb.slots.Slots(1, base=65533, span=2)  # 65533 runs a process, 65534 is nobody: none free
        with pytest.raises(OSError, match="no free sandbox uid"):
            lease.uid(0)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


# ----------------------------------------------------------------------------- cgroups and seccomp (finding 5)

HYBRID_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
"""


def test_cgroup_detection(tmp_path):
    # v2 offering memory and pids: chosen
    base = tmp_path / "v2" / "user.slice"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.subtree_control").write_text("memory pids\n")
    mi = f"30 25 0:26 / {tmp_path / 'v2'} rw - cgroup2 cgroup2 rw\n"
    cg = sb.limits.detect_cgroups(mi, "0::/user.slice\n")
    assert cg.kind == "v2" and cg.dirs == {"unified": str(base)}
    # v2 without them, v1 memory+pids present: v1 (this machine's layout), with paths joined right
    cg = sb.limits.detect_cgroups(HYBRID_MOUNTINFO, "4:memory:/a/b\n8:pids:/\n0::/\n", probe_write=False)
    assert cg.kind == "v1" and cg.dirs == {"memory": "/sys/fs/cgroup/memory/a/b", "pids": "/sys/fs/cgroup/pids/"}
    # nothing usable: none, and the reason says so
    cg = sb.limits.detect_cgroups(HYBRID_MOUNTINFO.splitlines()[0] + "\n", "0::/\n", probe_write=False)
    assert cg.kind == "" and "NO cgroup" in cg.describe() and cg.reason


def test_missing_layers_are_said_loudly(monkeypatch, capsys):
    weak = sb.Isolation(
        True, False, True, 61000, cgroup=sb.limits.CgroupSupport("", reason="v2 not delegated"), seccomp=False
    )
    monkeypatch.setattr(sb, "_probe_result", weak)
    monkeypatch.setattr(sb, "_warned", False)
    assert sb.check_isolation("require") is weak  # full isolation: accepted, but said
    err = capsys.readouterr().err
    assert "WITHOUT NO cgroup (v2 not delegated) and NO seccomp filter" in err


def test_seccomp_program_shape():
    prog = sb.limits.seccomp_program("x86_64")
    assert prog is not None and len(prog) % 8 == 0 and len(prog) // 8 < 4096
    assert sb.limits.seccomp_program("riscv64") is None  # unsupported: no filter, said by Isolation
    assert sb.probe_isolation().seccomp == (sb.limits.seccomp_program() is not None)


def test_non_root_trainer_gets_a_user_namespace_without_capabilities():
    """The non-root path: run a trainer as an unprivileged uid (setpriv, the system python3)."""
    py, setpriv = "/usr/bin/python3", shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv or not os.path.exists(py):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to start an unprivileged trainer")
    # the checkout may sit under a directory uid 65533 cannot read (a 0700 home or mktemp -d): the
    # trainer imports a world-readable copy of the package instead
    src = tempfile.mkdtemp(prefix="grpolab-nonroot-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        os.chmod(src, 0o755)
        shutil.copytree(
            os.path.dirname(os.path.dirname(os.path.abspath(sb.__file__))),
            os.path.join(src, "grpolab"),
            ignore=shutil.ignore_patterns("__pycache__", "data"),
        )
        for root, dirs, files in os.walk(src):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        _non_root_trainer(src, setpriv, py)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _non_root_trainer(src: str, setpriv: str, py: str) -> None:
    script = (
        f"import json, sys\nsys.path.insert(0, {src!r})\n"
        "from grpolab import sandbox as sb\n"
        "iso = sb.probe_isolation()\n"
        "add = [sb.literal_test('add(1, 2)', '3')]\n"
        "good = sb.run_tests('def add(a, b):\\n    return a + b\\n', add).fraction\n"
        "caps = sb.run_tests('import socket\\ndef add(a, b):\\n    socket.sethostname(\"x\")\\n    return 3\\n', add).fraction\n"
        "r, v = sb._run('import os\\ndef f():\\n    return [sorted(os.listdir(\"/\")), os.getppid()]\\n',\n"
        "               [sb.TestCase('call', fn='f')], sb.SandboxConfig(), iso, want_values=True)\n"
        "noexec = sb._run('import os\\ndef f():\\n    return bool(os.statvfs(\"/tmp\").f_flag & os.ST_NOEXEC)\\n',\n"
        "                 [sb.TestCase('call', fn='f')], sb.SandboxConfig(), iso, want_values=True)[1][0]\n"
        "print(json.dumps([iso.namespaces, iso.user_ns, good, caps, v[0], noexec]))\n"
    )
    out = subprocess.run(
        [setpriv, "--reuid=65533", "--regid=65533", "--clear-groups", py, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/tmp",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    namespaces, user_ns, good, caps, seen, noexec = json.loads(out.stdout.strip().splitlines()[-1])
    if not (namespaces and user_ns):
        pytest.skip(f"unprivileged user namespaces are not available here: {out.stderr[-300:]}")
    assert good == 1.0
    assert caps == 0.0  # no CAP_SYS_ADMIN left in its user namespace (sethostname fails)
    assert seen[1] == 1 and "work" not in seen[0] and "root" not in seen[0] and "proc" not in seen[0]
    assert noexec is True  # the writable /tmp is noexec in a user namespace too


def test_python_subprocesses_run_sandboxed_alike():
    iso = sb.probe_isolation()
    if not iso.namespaces:
        pytest.skip(f"no mount namespace on this machine: {iso.describe()}")
    code = (
        "import os, subprocess, sys\n"
        "def f():\n"
        "    out = subprocess.run([sys.executable, '-c', 'import os; print(os.getuid(), os.path.exists(\"/work\"))'],\n"
        "                         capture_output=True, text=True)\n"
        "    return [out.returncode, out.stdout.split(), os.getuid()]\n"
    )
    _, values = sb._run(code, [TestCase("call", fn="f")], FAST, iso, want_values=True)
    rc, (child_uid, child_sees_work), uid = values[0]
    assert rc == 0 and int(child_uid) == uid and child_sees_work == "False"


def test_slot_cgroups_of_dead_trainers_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getpid(), 1):
        (tmp_path / f"grpolab-{pid}-slot0").mkdir()
    (tmp_path / "other").mkdir()
    sb.limits._remove_stale(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"grpolab-{os.getpid()}-slot0", "grpolab-1-slot0", "other"]
    )
