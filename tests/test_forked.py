"""A tool call in a child process (env.tool_process; grpolab.util.forked, grpolab.env.process): what it starts
dies with it, `setsid` included, and its memory is bounded.

These cases leave a sleeping process behind or allocate gigabytes when the bound fails, so they run only
inside a PID namespace as an unprivileged uid (unshare + setpriv, the system python3 importing a copy of the
two stdlib-only modules), after a harmless probe has shown that containment: whatever survives there dies
with the namespace when its first process exits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "grpolab"
UID = 64123  # outside the sandbox's slot uids [61000, 61000 + span) and every account here
PY = "/usr/bin/python3"


@pytest.fixture(scope="module")
def contained_dir():
    """A world-readable copy of grpolab.util.forked and grpolab.env.process (stdlib only) in a package tree."""
    root = Path(tempfile.mkdtemp(prefix="grpolab-forked-"))
    for rel in ("util/forked.py", "env/process.py"):
        (root / "grpolab" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SRC / rel, root / "grpolab" / rel)
    for pkg in ("grpolab", "grpolab/util", "grpolab/env"):
        (root / pkg / "__init__.py").write_text("")
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def contained(script: str, root: Path, timeout_s: float = 60) -> dict:
    """Run `script` as PID 1 of a new PID (and network) namespace, as UID; returns the JSON it prints last."""
    setpriv = shutil.which("setpriv")
    cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net"]
    cmd += [setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", PY, "-I", "-c", script]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PYTHONPATH": "", "PATH": "/usr/bin:/bin"},
        cwd=root,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def root(contained_dir):
    """Prove the containment with a harmless probe before anything else runs there."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare") or not os.path.exists(PY):
        pytest.skip("needs root, unshare, setpriv and /usr/bin/python3 to contain the cases")
    probe = "import json, os; print(json.dumps({'pid': os.getpid(), 'uid': os.getuid(), 'procs': len([p for p in os.listdir('/proc') if p.isdigit()])}))"
    try:
        seen = contained(probe, contained_dir)
    except (AssertionError, subprocess.SubprocessError, ValueError) as e:
        pytest.fail(f"REFUSING: cannot contain the cases here ({e})")
    if not (seen["pid"] == 1 and seen["uid"] == UID and seen["procs"] == 1):
        pytest.fail(f"REFUSING: the probe was not contained: {seen}")
    return contained_dir


SETSID = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from grpolab.util import forked
from grpolab.env.process import run_in_process

def survivors():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{{p}}/cmdline", "rb") as f:
                    if f.read().startswith(b"sleep\\x0067.25"):
                        out.append(int(p))
            except OSError:
                pass
    return out

def tool():
    os.system("setsid sleep 67.25 &")  # a new session: out of the child's process group
    time.sleep(30)
    return ("ok", "never", {{}})

result = {{}}
t0 = time.monotonic()
result["out"] = run_in_process(tool, 1.0)
result["elapsed"] = time.monotonic() - t0
time.sleep(0.3)
result["after"] = len(survivors())
forked._prctl = lambda option, value: option != forked.PR_SET_CHILD_SUBREAPER  # the child as it was before
run_in_process(tool, 1.0)
time.sleep(0.3)
result["without_subreaper"] = len(survivors())
print(json.dumps(result))
"""


def test_what_a_tool_call_starts_with_setsid_dies_with_it(root):
    """`setsid sleep 67 &` from a tool outlived the call's kill at 1 s (it left the process group); the child is
    now the subreaper of what it starts, and the kill sweeps every process below it."""
    r = contained(SETSID.format(root=str(root)), root)
    assert r["out"] is None  # timed out and killed
    assert r["elapsed"] < 1.0 + 3.0
    assert r["after"] == 0
    assert r["without_subreaper"] == 1  # the case is real: killing the process group alone leaves it running


MEMORY = """
import json, sys
sys.path.insert(0, {root!r})
from grpolab.env.process import run_in_process

def hoard():
    block = bytearray(2000 * 1024 * 1024)
    return ("ok", str(len(block)), {{}})

print(json.dumps({{"limited": run_in_process(hoard, 20.0, memory_mb=256)}}))
"""


def test_a_tool_calls_child_process_has_a_memory_limit(root):
    """A child holding 2,000 MB until its time limit: with a 256 MiB limit beyond what it inherits, the
    allocation fails and the model reads the error."""
    r = contained(MEMORY.format(root=str(root)), root)
    kind, text, _ = r["limited"]
    assert (kind, text) == ("raised", "MemoryError")
