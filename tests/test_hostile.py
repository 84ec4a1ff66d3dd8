"""The hostile-input suite: adversarial completions against every verifier.

Each sandbox case asserts: the reward (0 unless genuinely right), a bounded wall time, the trainer
process unharmed (alive, same cwd/env/signal handlers, bounded memory), nothing left running (no
process of a sandbox uid, none carrying the case's marker), nothing written outside the sandbox's
temporary directory (marker files searched for), and that the next verification still works.

SAFETY: these cases include fork bombs and attempts to kill the parent. They only run after a
harmless probe proves containment (the candidate's parent is PID 1 of its own PID namespace, and
it runs as an unprivileged uid with RLIMIT_NPROC);
otherwise the module fails loudly (as root) or is skipped with the reason (non-root without
namespaces, where the OS cannot contain them). Never run these bare.
"""

from __future__ import annotations

import glob
import os
import resource
import secrets
import signal
import subprocess
import sys
import time

import pytest

from grpolab import sandbox as sb
from grpolab.batch import Example
from grpolab.rewards import build_rewards, score_completions
from grpolab.rewards.code import code_score
from grpolab.rewards.math_answer import math_score
from grpolab.rewards.tool_call import tool_call_score
from grpolab.rewards.tools import TOOL_SPECS
from grpolab.sandbox import SandboxConfig, literal_test, run_tests
from grpolab.util.values import PlainDict

pytestmark = pytest.mark.hostile

TOKEN = secrets.token_hex(6)
MARK = f"grpolab_pwned_{TOKEN}"
CFG = SandboxConfig(timeout_s=2.0, cpu_s=3, memory_mb=256, max_output_bytes=16 * 1024)
ADD = [literal_test("add(1, 2)", "3"), literal_test("add(-4, 4)", "0"), literal_test("add(10, 5)", "15")]
GOOD = "def add(a, b):\n    return a + b\n"
WATCH_DIRS = [
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/run/lock",
    os.getcwd(),
    os.path.expanduser("~"),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    sys.prefix,
    *[p for p in sys.path if p.endswith("site-packages")],
]


def _slot_uid_pids() -> list[int]:
    return [p for u in sb.sandbox_uids() for p in sb.pids_of_uid(u)]


def _marked_pids() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if TOKEN.encode() in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return out


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def contained():
    """Prove containment with a harmless probe before any hostile code runs."""
    iso = sb.probe_isolation()
    probe = (
        "import os, resource\n"
        "def probe():\n"
        "    return [os.getppid(), os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0]]\n"
    )
    res, values = sb._run(probe, [sb.TestCase("call", fn="probe")], CFG, iso, want_values=True)
    ppid, uid, nproc = values[0] if values and isinstance(values[0], list) else (None, None, None)
    # the candidate's parent is PID 1 of its own namespace (the sandbox's init), its uid is not root
    ok = ppid == 1 and uid not in (None, 0) and nproc not in (None, resource.RLIM_INFINITY) and nproc <= 64
    pid = ppid
    if not ok:
        why = f"isolation: {iso.describe()}; probe saw pid={pid} uid={uid} nproc={nproc}"
        if os.geteuid() == 0:
            pytest.fail(f"REFUSING hostile suite: cannot contain fork bombs here ({why})")
        pytest.skip(f"this OS cannot contain hostile code for a non-root user ({why})")
    return iso


def hostile(code: str, tests=ADD, cfg: SandboxConfig = CFG, expect: float = 0.0, max_s: float | None = None):
    """Run one hostile candidate and check every invariant of the suite."""
    code = code.replace("MARK", MARK)
    cwd, env = os.getcwd(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD)}
    rss = _rss_mb()
    t = time.monotonic()
    r = run_tests(code, tests, cfg)
    elapsed = time.monotonic() - t
    assert r.fraction == pytest.approx(expect), r.details
    assert elapsed < (max_s or cfg.timeout_s + 3.0), f"took {elapsed:.1f}s"
    # the trainer is unharmed
    assert os.getcwd() == cwd and dict(os.environ) == env
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert _rss_mb() - rss < 200
    # nothing left running, nothing written outside the sandbox
    assert _slot_uid_pids() == [], "sandbox processes survived"
    time.sleep(0.05)
    assert _marked_pids() == [], "a process carrying the marker survived"
    leaked = [p for d in WATCH_DIRS for p in glob.glob(os.path.join(d, f"*{MARK}*"))]
    assert leaked == [], f"written outside the sandbox: {leaked}"
    # the next verification still works
    assert run_tests(GOOD, ADD, cfg).fraction == 1.0
    return r


# ----------------------------------------------------------------------------- exits and fake success


def test_sys_exit_zero_at_import(contained):
    hostile("import sys\nsys.exit(0)\n")


def test_os_exit_zero_at_import(contained):
    r = hostile("import os\nos._exit(0)\n")
    assert r.passed == [False] * 3


def test_exit_zero_inside_the_function(contained):
    hostile("import os\ndef add(a, b):\n    os._exit(0)\n")


def test_system_exit_inside_the_function(contained):
    hostile("def add(a, b):\n    raise SystemExit(0)\n")


def test_atexit_forges_results_with_the_nonce(contained):
    # The attacker finds the nonce and the result fd, then forges a verdict for every test.
    hostile(
        "import atexit, gc, json, os\n"
        "def forge():\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'nonce' in o and 'fd' in o:\n"
        "            for i in range(3):\n"
        "                os.write(o['fd'], (json.dumps({'n': o['nonce'], 'i': i, 'pass': True}) + '\\n').encode())\n"
        "atexit.register(forge)\n"
        "def add(a, b):\n    forge()\n    os._exit(0)\n"
    )


def test_forged_duplicate_results_zero_everything(contained):
    # The candidate writes its own reply frames on its channel (fd 4), ahead of the harness:
    # replies then arrive out of protocol, the run is marked tampered and every test fails.
    r = hostile(
        "import json, os\n"
        "def add(a, b):\n"
        "    for q in (1, 1, 2, 3):\n"
        "        data = json.dumps({'q': q, 'v': a + b}).encode()\n"
        "        try:\n"
        "            os.write(4, len(data).to_bytes(4, 'big') + data)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return a + b\n"
    )
    assert r.tampered


ASSERTS = [
    sb.TestCase("assert", fn="add", source="assert add(1, 2) == 3"),
    sb.TestCase("assert", fn="add", source="assert add(-4, 4) == 0"),
    sb.TestCase("assert", fn="add", source="assert add(10, 5) == 15"),
]


def test_forging_verdicts_of_assert_tests(contained):
    # Finding 2: with the verdicts of assert tests written by the candidate's own interpreter, a
    # candidate that found the nonce (gc) forged "pass" for every test. Verdicts now come from the
    # checker process, which the candidate cannot reach; forged frames only break the protocol.
    hostile(
        "import gc, json, os\n"
        "def forge():\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'nonce' in o and 'fd' in o:\n"
        "            for i in range(3):\n"
        "                os.write(o['fd'], (json.dumps({'n': o['nonce'], 'i': i, 'pass': True}) + '\\n').encode())\n"
        "    for q in range(1, 4):\n"
        "        data = json.dumps({'q': q, 'pass': True, 'v': True}).encode()\n"
        "        try:\n"
        "            os.write(4, len(data).to_bytes(4, 'big') + data)\n"
        "        except OSError:\n"
        "            pass\n"
        "def add(a, b):\n    forge()\n    os._exit(0)\n",
        tests=ASSERTS,
    )


def test_patching_json_to_rewrite_the_harness_results(contained):
    # Finding 2: patching json's encoder rewrote the harness's own result lines (a failed assert
    # became a pass). The candidate can only rewrite its own replies now, which is returning values.
    hostile(
        "import json\n"
        "class Forger(json.JSONEncoder):\n"
        "    def encode(self, o):\n"
        "        if isinstance(o, dict) and 'err' in o:\n"
        "            o = {k: v for k, v in o.items() if k != 'err'}\n"
        "            o['pass'] = True\n"
        "        return super().encode(o)\n"
        "json._default_encoder = Forger()\n"
        "json.dumps = lambda o, *a, **k: Forger().encode(o)\n"
        "def add(a, b):\n    return -1\n",
        tests=ASSERTS,
    )


def test_hash_collisions_cannot_stall_grading(contained):
    # Finding 2: a set of integers that all hash alike, smuggled past the harness's encoder, made
    # the parent rebuild it for 37 s. The parent never hashes decoded values now.
    tests = [sb.TestCase("call", fn="add", args=(1, 2), expected={1, 2, 3})]
    t = time.monotonic()
    r = hostile(
        "import __main__\n"
        "P = (1 << 61) - 1\n"
        "crafted = {'$': 'set', 'v': [{'$': 'int', 'v': hex(1 + k * P)} for k in range(40000)]}\n"
        "__main__._plain = lambda *a, **k: crafted\n"
        "def add(a, b):\n    return {1, 2, 3}\n",
        tests=tests,
    )
    assert time.monotonic() - t < CFG.timeout_s + 3
    assert "got set(" in r.details[0]


def test_eq_always_true_object(contained):
    hostile(
        "class Any:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
        "def add(a, b):\n    return Any()\n"
    )


def test_int_subclass_with_lying_eq(contained):
    hostile(
        "class Liar(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Liar(0)\n"
    )


def test_patching_unittest_and_builtins(contained):
    hostile(
        "import builtins, unittest\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestResult.wasSuccessful = lambda self: True\n"
        "builtins.type = lambda *a: int\n"
        "builtins.isinstance = lambda *a: True\n"
        "def add(a, b):\n    return 'PASSED'\n"
    )


def test_printing_passed(contained):
    r = hostile(
        "print('PASSED'); print('All 3 tests passed'); print('{\"i\": 0, \"v\": 3}')\n"
        "def add(a, b):\n    print('ok')\n    return None\n"
    )
    assert "PASSED" in r.stdout


def test_partial_output_gets_partial_credit_only(contained):
    hostile("def add(a, b):\n    return 3\n", expect=1 / 3)


def test_reading_test_files_and_parent_memory(contained):
    hostile(
        "import glob, os\n"
        "def add(a, b):\n"
        "    found = []\n"
        "    for pat in ['*', '/tmp/**', '/proc/*/cmdline', '/proc/*/environ', '/work/**/test_*.py']:\n"
        "        for p in glob.glob(pat, recursive=True)[:200]:\n"
        "            try:\n"
        "                found.append(open(p, 'rb').read(10**6))\n"
        "            except OSError:\n"
        "                pass\n"
        "    blob = b''.join(found)\n"
        "    return 'LEAK' if b'add(10, 5)' in blob or b'expected' in blob else -1\n"
    )


# ----------------------------------------------------------------------------- resource attacks


def test_fork_bomb(contained):
    hostile("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")


def test_fork_bomb_inside_the_function(contained):
    hostile(
        "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"
    )


def test_thread_bomb(contained):
    hostile(
        "import threading, time\n"
        "def add(a, b):\n    while True:\n        threading.Thread(target=time.sleep, args=(100,)).start()\n"
    )


def test_setsid_double_fork_outliving_the_run(contained):
    hostile(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv('/bin/sh', ['sh', '-c', 'sleep 30; echo MARK > /tmp/MARK'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "def add(a, b):\n    return None\n"
    )
    time.sleep(0.2)
    assert _marked_pids() == []


def test_stdout_flood(contained):
    r = hostile("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert len(r.stdout) <= CFG.max_output_bytes


def test_stderr_flood_that_ignores_broken_pipes(contained):
    r = hostile(
        "import sys\nwhile True:\n    try:\n        sys.stderr.write('y' * 65536)\n    except OSError:\n        pass\n"
    )
    assert len(r.stderr) <= CFG.max_output_bytes


def test_memory_bomb(contained):
    hostile("x = bytearray(8 * 1024**3)\ndef add(a, b):\n    return a + b\n")


def test_incremental_memory_bomb(contained):
    hostile("def add(a, b):\n    xs = []\n    while True:\n        xs.append(' ' * 10**7)\n")


def test_disk_bomb(contained):
    hostile(
        "import os\n"
        "def add(a, b):\n"
        "    for d in ['.', '/tmp', '/var/tmp', '/dev/shm']:\n"
        "        for i in range(100):\n"
        "            try:\n"
        "                with open(os.path.join(d, f'MARK_{i}'), 'wb') as f:\n"
        "                    while True:\n"
        "                        f.write(b'z' * 2**20)\n"
        "            except (OSError, MemoryError):\n"
        "                break\n"
        "    return None\n"
    )


def test_ignoring_sigalrm_and_sigterm(contained):
    hostile(
        "import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"
    )


def test_network_is_cut(contained):
    # add() is right only if it can reach the network: a 0 proves it cannot.
    hostile(
        "import socket\n"
        "def add(a, b):\n"
        "    for host, port in [('1.1.1.1', 53), ('8.8.8.8', 443), ('127.0.0.1', 2024), ('127.0.0.1', 22)]:\n"
        "        try:\n"
        "            socket.create_connection((host, port), timeout=0.3).close()\n"
        "            return a + b\n"
        "        except OSError:\n"
        "            pass\n"
        "    return -1\n"
    )


def test_killing_the_parent_and_the_process_group(contained):
    hostile(
        "import os, signal\n"
        "for target in (os.getppid(), 1, -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "os.killpg(0, signal.SIGKILL)\n"
    )


def test_killing_the_trainer_by_pid(contained):
    hostile(
        f"import os, signal\n"
        f"for sig in (signal.SIGKILL, signal.SIGTERM):\n"
        f"    try:\n"
        f"        os.kill({os.getpid()}, sig)\n"
        f"    except OSError:\n"
        f"        pass\n"
        f"def add(a, b):\n    return None\n"
    )
    assert os.getpid() > 0  # still here


def test_segfault(contained):
    hostile("import ctypes\ndef add(a, b):\n    return ctypes.string_at(0)\n")


def test_unbounded_recursion(contained):
    hostile("def add(a, b):\n    return add(a, b)\n")


def test_deep_recursion_past_the_c_stack(contained):
    hostile("import sys\nsys.setrecursionlimit(10**8)\ndef add(a, b):\n    return add(a, b) + 1\n")


def test_reading_secrets_from_the_environment(contained, monkeypatch):
    monkeypatch.setenv("GRPOLAB_TEST_SECRET", f"hunter2-{TOKEN}")
    hostile(
        "import glob, os\n"
        "def add(a, b):\n"
        "    blobs = [repr(dict(os.environ)).encode()]\n"
        "    for p in glob.glob('/proc/*/environ'):\n"
        "        try:\n"
        "            blobs.append(open(p, 'rb').read())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return a + b if any(b'hunter2' in x for x in blobs) else -1\n"
    )


def test_persisting_sitecustomize_into_the_next_run(contained):
    hostile(
        "import os, sys, site\n"
        'payload = \'import builtins\\nbuiltins.MARK = 1\\nopen("/tmp/MARK", "w")\\n\'\n'
        "dirs = set(sys.path) | {'.', '/tmp', os.path.expanduser('~')}\n"
        "for d in dirs:\n"
        "    for name in ('sitecustomize.py', 'usercustomize.py', 'MARK.pth'):\n"
        "        try:\n"
        "            with open(os.path.join(d or '.', name), 'w') as f:\n"
        "                f.write(payload)\n"
        "        except OSError:\n"
        "            pass\n"
        "def add(a, b):\n    return None\n"
    )
    # the next run sees no trace of it
    probe = "import builtins\ndef add(a, b):\n    return a + b if not hasattr(builtins, 'MARK') else -1\n"
    assert run_tests(probe.replace("MARK", MARK), ADD, CFG).fraction == 1.0


def test_writing_outside_the_temp_dir(contained):
    hostile(
        "import os\n"
        "targets = ['/tmp/MARK', '/var/tmp/MARK', '/dev/shm/MARK', '/work/MARK', os.path.expanduser('~/MARK'),\n"
        "           '/etc/MARK', '/root/MARK', '/MARK']\n"
        "for t in targets:\n"
        "    try:\n"
        "        open(t, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return None\n"
    )
    for t in ("/tmp", "/var/tmp", "/dev/shm", "/work", "/etc", "/root", "/"):
        assert not os.path.exists(os.path.join(t, MARK))


def test_syntax_error(contained):
    r = hostile("def add(a, b)\n    return a + b\n")
    assert r.load_error and "SyntaxError" in r.load_error


def test_infinite_loop_at_import(contained):
    hostile("while True:\n    pass\n")


def test_closing_the_result_channel(contained):
    hostile(
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b\n"
    )


def test_huge_and_deep_return_values(contained):
    hostile(
        "def add(a, b):\n    x = []\n    for _ in range(10**5):\n        x = [x]\n    return x if a != 10 else 'z' * 10**8\n"
    )


def test_sandbox_escape_via_setuid_binaries(contained):
    # no_new_privs: su/sudo/mount cannot raise privileges; add() is right only if we became root.
    hostile(
        "import subprocess\n"
        "def add(a, b):\n"
        "    for cmd in (['su', '-c', 'id -u'], ['sudo', '-n', 'id', '-u'], ['id', '-u']):\n"
        "        try:\n"
        "            out = subprocess.run(cmd, capture_output=True, timeout=1).stdout.strip()\n"
        "            if out == b'0':\n"
        "                return a + b\n"
        "        except Exception:\n"
        "            pass\n"
        "    return -1\n"
    )


# ----------------------------------------------------------------------------- the host file system (finding 1)


def test_candidate_cannot_find_its_own_test_file(contained):
    # The candidate searches the whole visible tree for the file holding this very test (the needle
    # is split so that its own code does not contain it) and scores only if it finds it: with the
    # host's file system visible, even read-only, it would (and could read stored tests and data).
    hostile(
        "import os\n"
        "NEEDLE = 'def test_candidate_cannot_' + 'find_its_own_test_file'\n"
        "def found():\n"
        "    tops = sorted(os.listdir('/'), key=lambda d: d in ('proc', 'sys', 'usr', 'lib', 'var', 'dev'))\n"
        "    for top in tops:\n"
        "        for d, dirs, files in os.walk(os.path.join('/', top)):\n"
        "            dirs[:] = sorted((x for x in dirs if x not in ('site-packages', '.venv', '.git')),\n"
        "                             key=lambda x: x != 'tests')\n"
        "            for f in files:\n"
        "                if f.startswith('test_') and f.endswith('.py'):\n"
        "                    try:\n"
        "                        if NEEDLE in open(os.path.join(d, f), errors='ignore').read():\n"
        "                            return True\n"
        "                    except OSError:\n"
        "                        pass\n"
        "    return False\n"
        "def add(a, b):\n    return a + b if found() else -1\n",
        cfg=SandboxConfig(timeout_s=10.0, cpu_s=10, memory_mb=256),
        max_s=14.0,
    )


# ----------------------------------------------------------------------------- outliving the trainer (finding 3)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_no_candidate_survives_a_sigkilled_trainer(contained):
    # Finding 3: SIGKILL the trainer mid-call; a candidate that sleeps forever (no CPU, so RLIMIT_CPU
    # never fires) must be gone a few seconds later, with nobody left to kill it from outside.
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    script = (
        f"import sys; sys.path.insert(0, {src!r})\n"
        "from grpolab.sandbox import SandboxConfig, literal_test, run_tests\n"
        "code = 'import time\\ndef add(a, b):\\n    while True:\\n        time.sleep(0.05)\\n'\n"
        "run_tests(code, [literal_test('add(1, 2)', '3')], SandboxConfig(timeout_s=60.0, cpu_s=60))\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", script])
    try:
        lo, hi = sb.slots.UID_BASE, sb.slots.UID_BASE + sb.slots.UID_SPAN
        end = time.monotonic() + 60  # the sandbox starts in a second or two; a loaded machine is slower
        while time.monotonic() < end:
            procs = _descendants(trainer.pid)
            if any(lo <= (_uid_of(p) or 0) < hi for p in procs) and len(procs) >= 4:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the candidate never started")
        time.sleep(0.3)
        procs = _descendants(trainer.pid)
    finally:
        trainer.kill()
        trainer.wait()
    end = time.monotonic() + 15.0  # a few seconds on an idle machine; a loaded one may need more
    while time.monotonic() < end and any(_alive(p) for p in procs):
        time.sleep(0.1)
    assert [p for p in procs if _alive(p)] == [], "sandbox processes outlived the trainer"


def test_init_watchdog_bounds_the_run_without_the_parent(contained, monkeypatch):
    # The namespace's init kills the run at timeout + grace by itself: here the parent waits 30 s
    # longer than the timeout, and the run still ends on time.
    monkeypatch.setattr(sb, "PARENT_EXTRA_S", 30.0)
    cfg = SandboxConfig(timeout_s=1.0, cpu_s=30)
    t = time.monotonic()
    r = run_tests("import time\ndef add(a, b):\n    while True:\n        time.sleep(0.05)\n", ADD, cfg)
    elapsed = time.monotonic() - t
    assert r.fraction == 0.0
    assert cfg.timeout_s <= elapsed < cfg.timeout_s + sb.launcher.WATCHDOG_GRACE_S + 1.5, elapsed
    assert _slot_uid_pids() == []


# ----------------------------------------------------------------------------- resources (finding 5)


def test_memfd_memory_outside_rlimit_as(contained):
    # memfd pages are not address space: 40 memfds of 8 MiB (RLIMIT_FSIZE) hold 320 MiB with
    # RLIMIT_AS = 256 MiB. seccomp refuses memfd_create (and the slot's cgroup charges the pages).
    hostile(
        "import os\n"
        "def add(a, b):\n"
        "    fds = []\n"
        "    try:\n"
        "        for _ in range(40):\n"
        "            fd = os.memfd_create('x')\n"
        "            for _ in range(8):\n"
        "                os.write(fd, b'm' * (2**20 - 1))\n"
        "            fds.append(fd)\n"
        "    except OSError:\n"
        "        return -1\n"
        "    return a + b\n"
    )


def test_inode_exhaustion_of_the_tmpfs(contained):
    hostile(
        "import os\n"
        "def add(a, b):\n"
        "    n = 0\n"
        "    try:\n"
        "        while n < 20000:\n"
        "            open(f'/tmp/f{n}', 'w').close()\n"
        "            n += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "    return a + b if n >= 20000 else -1\n"
    )


def test_nested_user_namespaces(contained):
    hostile(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def add(a, b):\n"
        "    return a + b if libc.unshare(0x10000000) == 0 else -1\n"  # CLONE_NEWUSER
    )


def test_kernel_keyring_does_not_persist(contained):
    # add_key to the uid's user keyring, then look for a key left by an earlier run of this uid.
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "def add(a, b):\n"
        "    made = libc.syscall(248, b'user', b'MARK', b'x', 1, -4) >= 0\n"  # add_key(..., USER_KEYRING)
        "    seen = libc.syscall(250, 10, -4, b'user', b'MARK', 0) >= 0\n"  # keyctl(KEYCTL_SEARCH, ...)
        "    return a + b if made or seen else -1\n"
    )
    for _ in range(3):  # every slot uid gets a chance to see an earlier run's key
        hostile(code)


def test_memory_of_all_processes_together_is_bounded(contained):
    # Four processes of 150 MiB each stay under RLIMIT_AS (256 MiB) one by one; the slot's cgroup
    # (300 MiB for the whole run) stops them together. Each child holds its memory for a second, so
    # that the four overlap however the kernel schedules them on a busy machine.
    if not contained.cgroup.kind:
        pytest.skip(f"no cgroup on this machine, so no bound on a run's total memory: {contained.cgroup.reason}")
    cfg = SandboxConfig(timeout_s=4.0, cpu_s=4, memory_mb=256, slot_memory_mb=300)
    hostile(
        "import os, time\n"
        "def add(a, b):\n"
        "    kids = []\n"
        "    for _ in range(3):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            x = b'k' * (150 * 2**20)\n"
        "            time.sleep(1.0)\n"
        "            os._exit(0)\n"
        "        kids.append(pid)\n"
        "    x = b'k' * (150 * 2**20)\n"
        "    time.sleep(0.5)\n"
        "    ok = all(os.waitpid(p, 0)[1] == 0 for p in kids)\n"
        "    return a + b if ok else -1\n",
        cfg=cfg,
    )


# ----------------------------------------------------------------------------- the code reward end to end


def test_code_reward_many_hostile_completions_in_one_batch(contained):
    ex = Example(
        prompt="", answer="", meta={"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], "entry_point": "add"}
    )
    bad = [
        "```python\nimport os\nwhile True:\n    os.fork()\n```",
        "```python\nwhile True: pass\n```",
        "```python\nclass A:\n    __eq__ = lambda s, o: True\ndef add(a, b): return A()\n```",
        "no code at all",
        "```python\nimport sys; sys.exit(0)\n```",
    ]
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    fns = build_rewards([{"name": "code", "timeout_s": 2.0, "cpu_s": 2}])
    t = time.monotonic()
    s = score_completions(fns, bad + [good], [ex] * 6, timeout_s=10.0, workers=4)
    assert time.monotonic() - t < 10
    assert s.per_fn["code"] == [0.0] * 5 + [1.0]
    assert s.metrics["reward/errors"] == 0
    assert _slot_uid_pids() == []
    assert code_score(good, ex, CFG) == 1.0


# ----------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>" + " or ".join(str(i) for i in range(1000)) + "</answer>",  # answer spam
        "<answer>" + ", ".join(str(i) for i in range(100)) + "</answer>",
        "\\boxed{1}\\boxed{7}\\boxed{3}",  # several boxes in the final answer
        "<answer>\\boxed{7}\\boxed{8}</answer>",
        "<answer></answer>",
        "\\boxed{}",
        "<answer>" + "9^{" * 30 + "9" + "}" * 30 + "</answer>",  # enormous expressions
        "<answer>" + "7" * 100_000 + "</answer>",
        "<answer>" + "\\frac{1}{" * 500 + "}" * 500 + "</answer>",
        "\\boxed{" * 100_000,
        "<answer>7</answer>" * 10_000 + "<answer>6</answer>",
    ],
)
def test_math_hostile(completion):
    math_score("<answer>x + 1</answer>", "1 + x")  # a worker is up: the bound below is the comparison's
    t = time.monotonic()
    try:
        value = math_score(completion, "7", timeout_s=2.0)
    except TimeoutError:
        value = 0.0
    assert value == 0.0
    assert time.monotonic() - t < 4.0
    assert math_score("<answer>7</answer>", "7") == 1.0


# ----------------------------------------------------------------------------- tool calls

TOOLS_EX = Example(
    prompt="",
    answer="",
    meta={
        "tools": [TOOL_SPECS["calculator"], TOOL_SPECS["date_add"]],
        "expected_tool": "calculator",
        "expected_result": 6,
    },
)


@pytest.mark.parametrize(
    "payload",
    [
        '{"name": "calculator", "arguments": {"expression": "2*3"}',  # malformed
        "{'name': 'calculator', 'arguments': {'expression': '2*3'}}",  # not JSON
        '{"name": "calculator", "arguments": {"expression": NaN}}',
        '{"name": "calculator", "arguments": {"expression": "2*3", "x": Infinity}}',
        '{"name": "calculator", "arguments": {"expression": "2*3", "x": 1e999}}',
        '{"name": "calculator", "arguments": {"expression": "2*3", "x": ' + "9" * 5000 + "}}",  # huge int
        '{"name": "calculator", "arguments": {"expression": "2*3", "x": ' + "[" * 10_000 + "]" * 10_000 + "}}",
        '{"name": "calculator", "name": "calculator", "arguments": {"expression": "2*3"}}',  # duplicate key
        '{"name": "calculator", "arguments": {"expression": "2*3", "expression": "6"}}',
        '{"name": "shell", "arguments": {"cmd": "rm -rf /"}}',  # unknown tool
        '{"name": "calculator", "arguments": {"expression": "__import__(\'os\').system(\'id\')"}}',
        '{"name": "calculator", "arguments": {"expression": "9**9**9**9"}}',
        '{"name": "calculator", "arguments": {"expression": "' + "1+" * 100_000 + '1"}}',
        '["calculator", {"expression": "2*3"}]',
        "",
    ],
)
def test_tool_call_hostile(payload):
    t = time.monotonic()
    assert tool_call_score(f"<tool_call>{payload}</tool_call>", TOOLS_EX) == 0.0
    assert time.monotonic() - t < 1.0
    assert (
        tool_call_score('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>', TOOLS_EX)
        == 1.0
    )


# ----------------------------------------------------------------------------- programs other than Python

# A candidate probe: what can run besides the interpreter's Python? Each attempt reports
# what happened, as plain data: ("ran", detail) or ("refused", errno name or message).
EXEC_PROBE = r"""
import ctypes, errno, glob, mmap, os, platform, shutil, subprocess, sys, sysconfig

def _run(argv):
    try:
        r = subprocess.run(argv, capture_output=True, timeout=5)
    except OSError as e:
        return ["refused", errno.errorcode.get(e.errno, str(e.errno))]
    if r.returncode == 0 and r.stdout.strip() == b"42":
        return ["ran", "42"]
    return ["refused", "exit %d: %s" % (r.returncode, r.stderr.decode("utf-8", "replace")[-120:])]

def _machine_code(code):
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return ctypes.CFUNCTYPE(ctypes.c_long)(addr)()

def probe():
    out = {}
    st = os.statvfs("/tmp")
    out["tmp_noexec"] = bool(st.f_flag & os.ST_NOEXEC)
    # 1. an executable (a copy of the interpreter) in the writable /tmp, run directly
    exe = "/tmp/work/copied-python"
    shutil.copy(sys.executable, exe)
    os.chmod(exe, 0o755)
    out["exec_copy"] = _run([exe, "-I", "-S", "-c", "print(6 * 7)"])
    # 2. the same, through the dynamic loader (which maps the file instead of execve-ing it)
    ldso = sorted(glob.glob("/lib64/ld-linux*") + glob.glob("/lib/ld-linux*"))
    out["exec_via_ldso"] = _run([ldso[0], exe, "-I", "-S", "-c", "print(6 * 7)"]) if ldso else ["refused", "no ld.so"]
    # 3. a shared library copied into /tmp, loaded with ctypes
    sos = sorted(glob.glob(os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload", "*.so")))
    lib = "/tmp/work/copied.so"
    shutil.copy(sos[0], lib)
    try:
        ctypes.CDLL(lib)
        out["dlopen_copy"] = ["ran", os.path.basename(sos[0])]
    except OSError as e:
        out["dlopen_copy"] = ["refused", str(e)[-80:]]
    # 4. machine code written to anonymous executable memory and called through ctypes
    arch = platform.machine()
    ret42 = {"x86_64": b"\xb8\x2a\x00\x00\x00\xc3",  # mov eax, 42; ret
             "aarch64": bytes.fromhex("40058052c0035fd6")}.get(arch)  # mov w0, #42; ret
    unshare = {"x86_64": bytes.fromhex("bf00000010" "b810010000" "0f05" "c3")}.get(arch)
    try:
        out["machine_code"] = ["ran", _machine_code(ret42)] if ret42 else ["refused", "arch " + arch]
    except (OSError, ValueError) as e:
        out["machine_code"] = ["refused", str(e)]
    # 5. machine code making a system call the seccomp filter denies: unshare(CLONE_NEWUSER)
    if unshare:
        out["raw_unshare"] = ["ran", _machine_code(unshare)]  # the raw return: -errno
    return out
"""


def _exec_probe() -> dict:
    res, values = sb._run(
        EXEC_PROBE,
        [sb.TestCase("call", fn="probe")],
        SandboxConfig(timeout_s=8.0, cpu_s=6, memory_mb=512),
        sb.probe_isolation(),
        want_values=True,
    )
    assert values and type(values[0]) is PlainDict, (res.details, res.stderr[-2000:])
    return dict(values[0].pairs)


def test_programs_other_than_python(contained):
    """docs/security.md, "Programs other than Python": /tmp is noexec, so a copied executable or
    library cannot be started or loaded; machine code in anonymous memory does run, and seccomp
    still holds for its system calls."""
    import errno as _errno
    import platform

    t = time.monotonic()
    got = _exec_probe()
    assert time.monotonic() - t < 10
    print(got)
    assert got["tmp_noexec"] is True
    assert got["exec_copy"] == ["refused", "EACCES"], got
    assert got["exec_via_ldso"][0] == "refused" and "failed to map segment" in got["exec_via_ldso"][1], got
    assert got["dlopen_copy"][0] == "refused" and "failed to map segment" in got["dlopen_copy"][1], got
    if platform.machine() in ("x86_64", "aarch64"):
        assert got["machine_code"] == ["ran", 42], got  # stated in docs/security.md: this runs
    if platform.machine() == "x86_64" and contained.seccomp:
        assert got["raw_unshare"] == ["ran", -_errno.EPERM], got  # the filter sees machine code's calls too
    assert _slot_uid_pids() == []
