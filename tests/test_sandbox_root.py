"""The sandbox's minimal root builds wherever the interpreter and its libraries live, whatever the
trainer's environment holds, and a root that fails to build is refused, never a silent fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from grpolab import sandbox as sb
from grpolab.sandbox import SandboxConfig, SandboxUnavailable, isolation, literal_test
from grpolab.util.fields import ConfigError

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
FAST = SandboxConfig(timeout_s=5.0)


def _namespaces():
    iso = sb.probe_isolation()
    if not iso.namespaces:
        pytest.skip(f"no mount namespace on this machine: {iso.describe()}")
    return iso


@pytest.fixture
def lib_under_tmp():
    """A copy of a small shared library of the plan (libbz2, else the first non-libc one) in a
    world-readable directory under /tmp, as vLLM's LD_PRELOAD of the venv's libraries is in a
    checkout under /tmp."""
    plan = isolation.root_plan(isolation.interpreter())
    libs = [
        f
        for f in plan["files"]
        if "/lib" in f
        and ".so" in f
        and not any(k in os.path.basename(f) for k in ("libc.", "ld-linux", "libm.", "libpython"))
    ]
    src = next((f for f in libs if "libbz2" in f), libs[0] if libs else None)
    if src is None:
        pytest.skip("no small shared library in the root plan to copy")
    d = tempfile.mkdtemp(prefix="grpolab-preload-", dir="/tmp")
    os.chmod(d, 0o755)
    dst = os.path.join(d, os.path.basename(src))
    shutil.copy(src, dst)
    os.chmod(dst, 0o755)
    yield dst
    shutil.rmtree(d, ignore_errors=True)


def test_root_plan_ignores_the_trainers_ld_preload(lib_under_tmp, monkeypatch):
    """vLLM's CPU platform puts libraries of the venv into LD_PRELOAD when an engine starts: ldd
    then listed them, and a checkout under /tmp put /tmp paths into the plan. The plan is computed
    in the launcher's own environment."""
    monkeypatch.setenv("LD_PRELOAD", lib_under_tmp)
    monkeypatch.setenv("LD_LIBRARY_PATH", os.path.dirname(lib_under_tmp))
    plan = isolation.root_plan.__wrapped__(isolation.interpreter())
    everything = plan["dirs"] + plan["files"] + plan["trees"] + [k for k, _ in plan["links"]]
    assert not [p for p in everything if p.startswith("/tmp")], everything
    assert plan["mountpoint"] == "/tmp"


def test_a_trainer_with_a_tmp_ld_preload_gets_full_isolation(lib_under_tmp):
    """End to end, in a fresh trainer process whose environment preloads a library from /tmp (what
    a run that started a vLLM engine hands to its child processes): full isolation, right answer."""
    _namespaces()
    script = (
        f"import sys; sys.path.insert(0, {SRC!r})\n"
        "from grpolab.sandbox import SandboxConfig, literal_test, run_tests\n"
        "r = run_tests('def add(a, b):\\n    return a + b\\n', [literal_test('add(1, 2)', '3')],"
        " SandboxConfig(timeout_s=10.0))\n"
        "print('RESULT', r.fraction, r.isolation)\n"
    )
    env = {**os.environ, "LD_PRELOAD": lib_under_tmp}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), "")
    assert line.startswith("RESULT 1.0 pid+net+mount namespaces, minimal root"), (out.stdout, out.stderr[-2000:])


def test_the_root_builds_with_planned_files_under_tmp(monkeypatch):
    """An interpreter or library that lives under /tmp (where the root's tmpfs used to be
    mounted, hiding it): the root is mounted elsewhere, and the file is readable inside, under the
    candidate's own /tmp, read-only."""
    iso = _namespaces()
    d = tempfile.mkdtemp(prefix="grpolab-planned-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        data = os.path.join(d, "data.txt")
        with open(data, "w") as f:
            f.write("planned")
        os.chmod(data, 0o644)
        plan = dict(isolation.root_plan(isolation.interpreter()))
        plan["files"] = plan["files"] + [data]
        plan["dirs"] = sorted(plan["dirs"] + [d])
        plan["mountpoint"] = isolation.root_mountpoint(plan)
        assert plan["mountpoint"] != "/tmp"
        monkeypatch.setattr(sb, "root_plan", lambda exe: plan)
        code = (
            "import os\n"
            f"def read():\n    return open({data!r}).read()\n"
            "def writable():\n"
            f"    try:\n        open({data!r}, 'w').write('x')\n        return True\n"
            "    except OSError:\n        return False\n"
            "def scratch():\n    open('/tmp/work/s', 'w').write('ok')\n    return open('/tmp/work/s').read()\n"
        )
        r = sb._run(
            code,
            [
                literal_test("read()", "'planned'"),
                literal_test("writable()", "False"),
                literal_test("scratch()", "'ok'"),
            ],
            FAST,
            iso,
        )
        assert r.passed == [True, True, True], (r.details, r.stderr[-2000:])
        with open(data) as f:
            assert f.read() == "planned"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_root_that_fails_to_build_is_refused_not_a_silent_fallback(monkeypatch):
    """Namespaces work but the root cannot be built (here: a planned file that does not exist):
    the probe raises SandboxUnavailable naming the failure, under best_effort too, instead of
    running model-written code without namespaces."""
    _namespaces()
    plan = dict(isolation.root_plan(isolation.interpreter()))
    plan["files"] = plan["files"] + ["/nonexistent-grpolab-dir/lib.so"]
    plan["dirs"] = sorted(plan["dirs"] + ["/nonexistent-grpolab-dir"])
    monkeypatch.setattr(sb, "root_plan", lambda exe: plan)
    monkeypatch.setattr(sb, "_probe_result", None)
    monkeypatch.setattr(sb, "_probe_error", None)
    with pytest.raises(SandboxUnavailable, match="cannot build the minimal root.*nonexistent-grpolab-dir") as e:
        sb.check_isolation("best_effort")
    assert isinstance(e.value, ConfigError)  # exit code 2 through the CLI
    with pytest.raises(SandboxUnavailable):  # cached: every later run is refused the same way
        sb.run_tests("def add(a, b):\n    return a + b\n", [literal_test("add(1, 2)", "3")], FAST)


def test_root_mountpoint_skips_directories_holding_planned_files():
    plan = {"files": ["/tmp/x/python", "/usr/lib/libz.so"], "trees": ["/usr/lib/python3"]}
    assert isolation.root_mountpoint(plan, ("/tmp", "/usr", "/dev")) == "/dev"
    with pytest.raises(OSError, match="no directory to mount the sandbox's root on"):
        isolation.root_mountpoint(plan, ("/tmp", "/usr"))
    assert isolation.root_mountpoint({"files": ["/usr/bin/python"], "trees": []}, ("/tmp",)) == "/tmp"
