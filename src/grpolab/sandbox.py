"""Run untrusted Python (model-written code) against tests, and grade it in the parent.

What one run does (see docs/security.md for the guarantees and their limits):

1. The parent picks a free *slot* (at most `max_parallel` runs at once). Each slot has its own
   unprivileged uid (when grpolab runs as root), so RLIMIT_NPROC bounds each candidate separately
   and leftovers of one slot are found and killed by uid.
2. It starts `unshare --pid --net --mount --ipc --uts --fork --kill-child --mount-proc` (adding
   `--user --map-root-user` when not root) running a small trusted *launcher* (python -I -S).
   Inside the new namespaces the launcher makes every mount read-only, mounts a small private tmpfs
   on /tmp, /var/tmp, /dev/shm, creates an empty working directory there, sets rlimits (CPU, AS,
   FSIZE, NOFILE, NPROC, CORE=0), drops to the slot uid with no_new_privs, and execs the *harness*
   (a fresh `python -I -S -B` with a scrubbed environment). Without namespaces (isolation
   "best_effort" on an OS that does not allow them) it does the same minus the namespaces and
   mounts, in a temporary directory the parent deletes afterwards.
3. The harness reads the job from stdin (the code and the *inputs* of each test, never the
   expected outputs), runs the candidate, calls the function on each test's arguments, and writes
   one JSON line per test to a dedicated pipe, with the result converted to plain data by a
   type-strict encoder (an object with a custom `__eq__` cannot be encoded, so it cannot pass).
4. The parent enforces the wall-clock limit (SIGKILL to the whole process group; with a PID
   namespace this tears down every process the candidate started, `setsid` double forks included),
   caps stdout/stderr/results, and grades: the number of tests comes from the caller, a missing or
   duplicated result is a failure, the exit code is ignored, and values are compared type-strictly
   in the parent.

`isolation="require"` refuses to run when namespaces are unavailable; "best_effort" warns once,
prominently, and runs with reduced isolation.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import math
import os
import queue
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from grpolab.types import ConfigError

log = logging.getLogger(__name__)

ISOLATION_MODES = ("require", "best_effort")
DEFAULT_UID_BASE = 61000  # slot k runs as uid/gid DEFAULT_UID_BASE + k (root only)
MAX_RESULT_BYTES = 4 * 1024 * 1024
MAX_VALUE_CHARS = 256 * 1024


class SandboxUnavailable(ConfigError):
    """isolation="require" but this OS does not let grpolab build the namespaces."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one candidate run.

    timeout_s: wall clock for the whole run (all tests); the process tree is SIGKILLed after it.
    cpu_s: RLIMIT_CPU.  memory_mb: RLIMIT_AS per process.  fsize_mb: RLIMIT_FSIZE (largest file).
    nofile: RLIMIT_NOFILE.  nproc: RLIMIT_NPROC (processes + threads of the slot uid).
    max_output_bytes: stdout and stderr are each cut after this many bytes.
    tmpfs_mb: size of the private /tmp (namespaces only).
    isolation: "require" (refuse without namespaces) or "best_effort" (warn once and run).
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    fsize_mb: int = 8
    nofile: int = 64
    nproc: int = 8
    max_output_bytes: int = 64 * 1024
    tmpfs_mb: int = 32
    isolation: str = "best_effort"

    def validate(self) -> "SandboxConfig":
        """Raise ConfigError naming the first bad field."""
        if self.isolation not in ISOLATION_MODES:
            raise ConfigError(f"sandbox.isolation: expected require|best_effort, got {self.isolation!r}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 600):
            raise ConfigError(f"sandbox.timeout_s: expected a number in (0, 600], got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "fsize_mb", "nofile", "nproc", "max_output_bytes", "tmpfs_mb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"sandbox.{name}: expected a positive integer, got {v!r}")
        if self.memory_mb < 64:
            raise ConfigError("sandbox.memory_mb: at least 64 (a Python interpreter needs ~30 MB)")
        if self.nofile < 16:
            raise ConfigError("sandbox.nofile: at least 16")
        return self


@dataclass(frozen=True)
class TestCase:
    """One test, graded in the parent.

    kind "call": the harness calls `fn(*args)` and reports the plain-data result, compared here with
    `expected`. kind "assert": the harness runs `source` and reports whether it raised; weaker,
    since the child reports the verdict itself (used only for tests that are not a plain call
    compared to a literal, see grpolab.rewards.code).
    """

    __test__ = False  # not a pytest test class

    kind: str
    fn: str = ""
    args: tuple = ()
    expected: Any = None
    source: str = ""
    tol: float | None = None  # numeric result: |actual - expected| <= tol
    rel_tol: float | None = None  # numeric result: math.isclose(actual, expected, rel_tol, abs_tol=tol)


@dataclass
class SandboxResult:
    """What one candidate run produced; `passed` has exactly one entry per test."""

    passed: list[bool]
    details: list[str]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    isolation: str = ""
    load_error: str | None = None
    tampered: bool = False

    @property
    def fraction(self) -> float:
        """Fraction of tests passed (0.0 when there are no tests)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


# ============================================================================ child-side code
# The functions below run inside the sandbox. They are sent as source (inspect.getsource) to a
# `python -I -S` process, so they use only the standard library and import inside themselves.


def _plain(v, depth=0, budget=None):
    """Encode a result as JSON-able plain data, type-strictly (subclasses are rejected)."""
    import math as _m

    if budget is None:
        budget = [MAX_VALUE_CHARS]
    if depth > 32:
        raise ValueError("result nested too deeply")
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("result too large")
    t = type(v)
    if v is None or t is bool:
        return v
    if t is int:
        if -(2**53) < v < 2**53:
            return v
        if v.bit_length() > 100_000:
            raise ValueError("integer result too large")
        budget[0] -= v.bit_length() // 4
        return {"$": "int", "v": hex(v)}
    if t is float:
        return v if _m.isfinite(v) else {"$": "float", "v": repr(v)}
    if t is str:
        budget[0] -= len(v)
        if budget[0] < 0:
            raise ValueError("result too large")
        return v
    if t is bytes:
        budget[0] -= 2 * len(v)
        if budget[0] < 0:
            raise ValueError("result too large")
        return {"$": "bytes", "v": v.hex()}
    if t is complex:
        return {"$": "complex", "v": [_plain(v.real, depth + 1, budget), _plain(v.imag, depth + 1, budget)]}
    if t is list or t is tuple:
        return {"$": t.__name__, "v": [_plain(x, depth + 1, budget) for x in v]}
    if t is set or t is frozenset:
        import json as _j

        items = [_plain(x, depth + 1, budget) for x in v]
        return {"$": "set", "v": sorted(items, key=lambda x: _j.dumps(x, sort_keys=True))}
    if t is dict:
        import json as _j

        pairs = [[_plain(k, depth + 1, budget), _plain(x, depth + 1, budget)] for k, x in v.items()]
        return {"$": "dict", "v": sorted(pairs, key=lambda p: _j.dumps(p[0], sort_keys=True))}
    raise TypeError(f"result of type {t.__name__} is not plain data")


def _unplain(x, depth=0):
    """Decode `_plain` output back into Python values (raises on anything malformed)."""
    if depth > 40:
        raise ValueError("nested too deeply")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is not dict or set(x) != {"$", "v"}:
        raise ValueError("malformed plain value")
    tag, v = x["$"], x["v"]
    if tag == "int" and type(v) is str:
        return int(v, 16)
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if tag == "complex" and type(v) is list and len(v) == 2:
        return complex(_unplain(v[0], depth + 1), _unplain(v[1], depth + 1))
    if tag in ("list", "tuple", "set") and type(v) is list:
        items = [_unplain(i, depth + 1) for i in v]
        return items if tag == "list" else tuple(items) if tag == "tuple" else frozenset(items)
    if tag == "dict" and type(v) is list:
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict")
            out[_unplain(pair[0], depth + 1)] = _unplain(pair[1], depth + 1)
        return out
    raise ValueError(f"unknown tag {tag!r}")


def _harness_main():
    """Child: read the job from stdin, run the candidate, report one JSON line per test."""
    import builtins
    import json
    import os
    import sys

    job = json.loads(sys.stdin.buffer.read().decode())
    fd, nonce = job["fd"], job["nonce"]
    write, dumps = os.write, json.dumps  # captured before any candidate code runs

    def emit(obj):
        obj["n"] = nonce
        data = (dumps(obj) + "\n").encode()
        while data:
            data = data[write(fd, data):]

    safe_builtins = dict(builtins.__dict__)
    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(job["setup"] + "\n" + job["code"], "solution.py", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit included: nothing counts as success
        emit({"load_error": f"{type(e).__name__}: {str(e)[:300]}"})
        return
    for i, t in enumerate(job["tests"]):
        try:
            if t["kind"] == "call":
                fn = ns[t["fn"]]
                args = _unplain(t["args"])
                emit({"i": i, "v": _plain(fn(*args))})
            else:
                exec(compile(t["src"], "<test>", "exec"), dict(ns, __builtins__=dict(safe_builtins)))
                emit({"i": i, "pass": True})
        except BaseException as e:  # noqa: BLE001
            try:
                emit({"i": i, "err": f"{type(e).__name__}: {str(e)[:200]}"})
            except BaseException:  # noqa: BLE001 - result fd closed by the candidate
                pass
    emit({"done": True})


def _launcher_main():
    """Trusted stage inside the namespaces: mounts, rlimits, drop privileges, exec the harness."""
    import ctypes
    import json
    import os
    import resource
    import sys

    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    ms_rdonly, ms_nosuid, ms_nodev, ms_remount, ms_bind = 1, 2, 4, 32, 4096

    def mount(src, target, fstype, flags, data):
        args = [a.encode() if a is not None else None for a in (src, target, fstype, data)]
        if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    if cfg["mounts"]:
        targets = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                targets.append((parts[4], parts[5]))
        for target, opts in targets:  # every mount read-only (devices stay usable)
            if target.startswith("/proc"):
                continue
            flags = ms_remount | ms_bind | ms_rdonly
            for opt, bit in (("nosuid", ms_nosuid), ("nodev", ms_nodev), ("noexec", 8)):
                if opt in opts.split(","):
                    flags |= bit
            try:
                mount(None, target, None, flags, None)
            except OSError:
                pass  # best effort; the dropped uid cannot write there anyway
        size = f"size={cfg['tmpfs_mb']}m,mode=1777"
        for target in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
            if os.path.isdir(target):
                mount("tmpfs", target, "tmpfs", ms_nosuid | ms_nodev, size)
        bind = cfg.get("bind_prefix")
        if bind:  # make the interpreter reachable for the unprivileged uid, inside this namespace only
            prefix, blocked = bind["prefix"], bind["blocked"]
            os.mkdir("/tmp/.python", 0o755)
            mount(prefix, "/tmp/.python", None, ms_bind | 16384, None)  # MS_REC
            mount(None, "/tmp/.python", None, ms_remount | ms_bind | ms_rdonly, None)
            mount("tmpfs", blocked, "tmpfs", ms_nosuid | ms_nodev, "size=1m,mode=755")
            os.makedirs(prefix, 0o755, exist_ok=True)
            mount("/tmp/.python", prefix, None, 8192, None)  # MS_MOVE
            os.rmdir("/tmp/.python")
        workdir = "/tmp/work"
        os.mkdir(workdir, 0o700)
        if cfg["uid"] is not None:
            os.chown(workdir, cfg["uid"], cfg["gid"])
    else:
        workdir = cfg["workdir"]
    os.chdir(workdir)

    os.nice(cfg["nice"])  # the trainer outranks the candidate for the CPU (timeouts stay prompt)
    lim = cfg["limits"]
    for name, value in (("RLIMIT_CPU", lim["cpu"]), ("RLIMIT_AS", lim["as"]),
                        ("RLIMIT_FSIZE", lim["fsize"]), ("RLIMIT_NOFILE", lim["nofile"]),
                        ("RLIMIT_NPROC", lim["nproc"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
        if os.getuid() != cfg["uid"] or os.geteuid() != cfg["uid"]:
            os._exit(97)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid binaries cannot raise privileges
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    exe = cfg["python"]
    os.execve(exe, [exe, "-I", "-S", "-B", "-c", cfg["harness"]], env)


def _child_source(main) -> str:
    """Source of a child program: the helpers plus `main()`."""
    parts = [f"MAX_VALUE_CHARS = {MAX_VALUE_CHARS}"]
    parts += [inspect.getsource(f) for f in (_plain, _unplain, main)]
    parts.append(f"{main.__name__}()")
    return "\n\n".join(parts)


_HARNESS_SRC = _child_source(_harness_main)
_LAUNCHER_SRC = _child_source(_launcher_main)


# ============================================================================ interpreter


def _world_reachable(path: str) -> bool:
    """True if every directory above `path` is traversable by others and the file is executable."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    while True:
        try:
            if not os.stat(d).st_mode & 0o001:
                return False
        except OSError:
            return False
        if d == "/":
            break
        d = os.path.dirname(d)
    try:
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False


def _interpreter(iso: "Isolation") -> tuple[str, dict | None]:
    """The Python the harness runs on, and a bind plan when its prefix must be made reachable.

    Running as root with a dropped uid, the trainer's interpreter may sit below a directory the
    slot uid cannot enter (e.g. /root/.pyenv). With a mount namespace the launcher then mounts a
    tmpfs over the closed directory and binds the interpreter prefix back, read-only; without one a
    world-reachable system python3 is used instead.
    """
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if not iso.drop_uid or _world_reachable(exe):
        return exe, None
    prefix = os.path.realpath(sys.base_prefix)
    if iso.namespaces and exe.startswith(prefix + os.sep):
        d, blocked = prefix, None
        while d != "/":
            d = os.path.dirname(d)
            try:
                if not os.stat(d).st_mode & 0o001:
                    blocked = d
            except OSError:
                break
        if blocked and blocked != "/":
            return exe, {"prefix": prefix, "blocked": blocked}
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand) and _world_reachable(cand):
            return os.path.realpath(cand), None
    raise OSError(f"no Python interpreter reachable by an unprivileged uid ({exe} is not)")


# ============================================================================ isolation probe


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do (probed once per process)."""

    namespaces: bool  # pid + net + mount (+ipc, uts) namespaces via unshare
    user_ns: bool  # namespaces need --user (not root)
    drop_uid: bool  # running as root: each slot gets its own unprivileged uid
    uid_base: int | None
    reason: str = ""

    @property
    def full(self) -> bool:
        """Namespaces, and the candidate is not the real root."""
        return self.namespaces and (self.drop_uid or self.user_ns)

    @property
    def level(self) -> str:
        return "full" if self.full else "reduced"

    def describe(self) -> str:
        parts = ["pid+net+mount namespaces" if self.namespaces else "NO namespaces"]
        if self.drop_uid:
            parts.append("nobody (uid 65534)" if self.uid_base == 65534
                         else f"own uid per slot (leased from {self.uid_base})")
        else:
            parts.append("user namespace" if self.user_ns else "SAME uid as the trainer")
        return ", ".join(parts) + (f" ({self.reason})" if self.reason else "")


_probe_lock = threading.Lock()
_probe_result: Isolation | None = None
_warned = False


def _unshare_cmd(user_ns: bool) -> list[str]:
    path = shutil.which("unshare") or "/usr/bin/unshare"
    cmd = [path]
    if user_ns:
        cmd += ["--user", "--map-root-user"]
    return cmd + ["--pid", "--net", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc", "--"]


def _probe_candidate(iso: Isolation) -> tuple[bool, str]:
    """Run a harmless program under `iso`; True if it worked and reported the expected isolation."""
    code = (
        "import os, resource, socket\n"
        "def probe():\n"
        "    try:\n"
        "        socket.create_connection(('1.1.1.1', 53), timeout=0.5).close(); net = True\n"
        "    except OSError:\n"
        "        net = False\n"
        "    return [os.getpid(), os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0], net]\n"
    )
    cfg = SandboxConfig(timeout_s=20.0, cpu_s=10)
    try:
        res, values = _run(code, [TestCase("call", fn="probe")], cfg, iso, want_values=True, setup="")
    except OSError as e:
        return False, str(e)
    if not values or not isinstance(values[0], list):
        return False, (res.load_error or res.stderr.strip()[-300:] or f"exit code {res.returncode}")
    pid, uid, nproc, net = values[0]
    if iso.namespaces and (pid != 1 or net):
        return False, f"namespaces not effective (pid {pid}, network {'reachable' if net else 'cut'})"
    if iso.drop_uid and uid == 0:
        return False, "could not drop root"
    return True, ""


def probe_isolation(force: bool = False) -> Isolation:
    """Find the strongest isolation this machine allows (cached; `force` re-probes)."""
    global _probe_result
    with _probe_lock:
        if _probe_result is not None and not force:
            return _probe_result
        root = os.geteuid() == 0
        have_unshare = shutil.which("unshare") is not None and sys.platform.startswith("linux")
        reasons = []
        candidates = []
        if have_unshare:
            candidates.append(Isolation(True, not root, root, DEFAULT_UID_BASE if root else None))
        else:
            reasons.append("the `unshare` tool (util-linux) is not installed")
        if root:
            candidates.append(Isolation(False, False, True, DEFAULT_UID_BASE))
            candidates.append(Isolation(False, False, True, 65534))  # nobody, if high uids are not mapped
        candidates.append(Isolation(False, False, False, None))
        chosen = candidates[-1]
        for iso in candidates:
            ok, why = _probe_candidate(iso)
            if ok:
                chosen = iso
                break
            reasons.append(f"{iso.describe()}: {why}")
        _probe_result = Isolation(chosen.namespaces, chosen.user_ns, chosen.drop_uid, chosen.uid_base,
                                  reason="; ".join(reasons) if not chosen.full else "")
        return _probe_result


def check_isolation(mode: str) -> Isolation:
    """Probe; raise SandboxUnavailable under "require" if isolation is reduced, else warn once."""
    global _warned
    iso = probe_isolation()
    if iso.full:
        return iso
    msg = (
        "grpolab sandbox: REDUCED ISOLATION. Model-written code will run without "
        f"PID/network/mount namespaces or without dropping privileges: {iso.describe()}. "
        "Set sandbox isolation: require to refuse instead."
    )
    if mode == "require":
        raise SandboxUnavailable(msg.replace("Set sandbox isolation: require to refuse instead.",
                                             "isolation: require refuses to run code like this."))
    if not _warned:
        _warned = True
        banner = "!" * 100
        print(f"\n{banner}\n{msg}\n{banner}\n", file=sys.stderr, flush=True)
        log.warning(msg)
    return iso


# ============================================================================ slots


class _Slots:
    """A bounded set of run slots. Slot k runs as a uid leased to this process alone.

    Several grpolab processes may share a machine (and each sweeps its uids after a run), so uids
    are leased with an exclusive flock on a lock file per uid, held for the life of the process.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._q: queue.Queue[int] = queue.Queue()
        for k in range(n):
            self._q.put(k)
        self._uids: dict[int, int] = {}
        self._locks: list[int] = []
        self._lock = threading.Lock()

    def acquire(self) -> int:
        return self._q.get()

    def release(self, k: int) -> None:
        self._q.put(k)

    def uid(self, k: int, base: int) -> int:
        """The uid leased for slot k (leasing one on first use)."""
        with self._lock:
            if k not in self._uids:
                self._uids[k] = self._lease(base)
            return self._uids[k]

    def _lease(self, base: int) -> int:
        import fcntl

        lock_dir = os.path.join(tempfile.gettempdir(), "grpolab-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        taken = set(self._uids.values())
        for uid in range(base, base + 4096):
            if uid in taken:
                continue
            fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._locks.append(fd)
            _sweep_uid(uid)  # leftovers of a crashed earlier owner
            return uid
        raise OSError(f"no free sandbox uid in [{base}, {base + 4096})")


MAX_PARALLEL = max(1, os.cpu_count() or 1)
_SLOTS = _Slots(MAX_PARALLEL)


def sandbox_uids() -> list[int]:
    """The uids this process has leased for its sandbox slots so far."""
    return sorted(_SLOTS._uids.values())


def _pids_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (read from /proc)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return pids


def _sweep_uid(uid: int, deadline_s: float = 5.0) -> bool:
    """Kill every process of `uid` (a slot uid, never a real user); True once none is left."""
    end = time.monotonic() + deadline_s
    while True:
        pids = _pids_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            log.error("sandbox: %d processes of uid %d survive SIGKILL", len(pids), uid)
            return False
        time.sleep(0.01)


# ============================================================================ running


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group (unshare's --kill-child then takes the namespace down)."""
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.error("sandbox: process %d did not die after SIGKILL", proc.pid)


def _parse_results(raw: bytes, nonce: str, n_tests: int) -> tuple[dict[int, dict], str | None, bool]:
    """Per-test result records keyed by index, the load error if any, and whether tampering was seen."""
    out: dict[int, dict] = {}
    load_error = None
    tampered = False
    for line in raw.split(b"\n")[:-1] if raw.endswith(b"\n") else raw.split(b"\n")[:-1]:
        try:
            msg = json.loads(line, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            tampered = True
            continue
        if type(msg) is not dict or msg.get("n") != nonce:
            tampered = True
            continue
        if "load_error" in msg:
            load_error = str(msg["load_error"])[:500]
            continue
        i = msg.get("i")
        if type(i) is not int:
            continue
        if not 0 <= i < n_tests or i in out:
            tampered = True
            continue
        out[i] = msg
    return out, load_error, tampered


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def plain_equal(expected: Any, actual: Any, rel_tol: float = 1e-9) -> bool:
    """Type-strict equality of plain values.

    bool only equals bool; int and float compare numerically (floats with rel_tol); str, bytes,
    list, tuple, dict and set must match in type and, recursively, in content.
    """
    te, ta = type(expected), type(actual)
    if te is bool or ta is bool:
        return te is ta and expected == actual
    if te in (int, float) and ta in (int, float):
        if te is int and ta is int:
            return expected == actual
        if math.isnan(expected) or math.isnan(actual):
            return math.isnan(expected) and math.isnan(actual)
        return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=1e-12)
    if te is set:
        te = frozenset
    if te is not ta:
        return False
    if te in (list, tuple):
        return len(expected) == len(actual) and all(plain_equal(e, a, rel_tol) for e, a in zip(expected, actual))
    if te is dict:
        if set(expected) != set(actual):
            return False
        return all(plain_equal(expected[k], actual[k], rel_tol) for k in expected)
    if te in (str, bytes, frozenset, complex, type(None)):
        return expected == actual
    return False


def _numeric_close(t: TestCase, actual: Any) -> bool:
    """Tolerance comparison for tests written as abs(f(x) - y) < tol or math.isclose(f(x), y)."""
    if type(actual) not in (int, float) or not math.isfinite(actual):
        return False
    if t.rel_tol is not None:
        return math.isclose(actual, t.expected, rel_tol=t.rel_tol, abs_tol=t.tol or 0.0)
    return abs(actual - t.expected) <= (t.tol or 0.0)


def _grade(tests: Sequence[TestCase], records: dict[int, dict]) -> tuple[list[bool], list[str]]:
    """Compare each test's reported result with the expectation held by the parent."""
    passed, details = [], []
    for i, t in enumerate(tests):
        rec = records.get(i)
        if rec is None:
            passed.append(False)
            details.append("no result")
            continue
        if "err" in rec:
            passed.append(False)
            details.append(str(rec["err"])[:200])
            continue
        if t.kind == "call":
            try:
                actual = _unplain(rec.get("v", {"$": "?", "v": None}))
            except (ValueError, TypeError, RecursionError) as e:
                passed.append(False)
                details.append(f"malformed result: {e}")
                continue
            ok = _numeric_close(t, actual) if (t.tol is not None or t.rel_tol is not None) \
                else plain_equal(t.expected, actual)
            passed.append(ok)
            details.append("ok" if ok else f"expected {t.expected!r:.100}, got {actual!r:.100}")
        else:
            ok = rec.get("pass") is True
            passed.append(ok)
            details.append("ok" if ok else "assert failed")
    return passed, details


def _encode_tests(tests: Sequence[TestCase]) -> list[dict]:
    """What the child gets per test: inputs only, never the expected output."""
    out = []
    for t in tests:
        if t.kind == "call":
            out.append({"kind": "call", "fn": t.fn, "args": _plain(tuple(t.args))})
        elif t.kind == "assert":
            out.append({"kind": "assert", "src": t.source})
        else:
            raise ValueError(f"unknown test kind {t.kind!r}")
    return out


def _run(code: str, tests: Sequence[TestCase], cfg: SandboxConfig, iso: Isolation, *,
         setup: str = "", want_values: bool = False):
    """One run under a given isolation (internal; run_tests picks the isolation)."""
    slot = _SLOTS.acquire()
    workdir = None
    uid = None
    t0 = time.monotonic()
    try:
        if iso.drop_uid and iso.uid_base is not None:
            uid = 65534 if iso.uid_base == 65534 else _SLOTS.uid(slot, iso.uid_base)
        if not iso.namespaces:
            workdir = tempfile.mkdtemp(prefix="grpolab-sbx-")
            if uid is not None:
                os.chown(workdir, uid, uid)
        nonce = secrets.token_hex(16)
        r_fd, w_fd = os.pipe()
        limits = {
            "cpu": int(cfg.cpu_s), "as": int(cfg.memory_mb) * 1024 * 1024,
            "fsize": int(cfg.fsize_mb) * 1024 * 1024, "nofile": int(cfg.nofile), "nproc": int(cfg.nproc),
        }
        if uid is None and os.geteuid() != 0:
            limits["nproc"] += len(_pids_of_uid(os.getuid()))  # NPROC counts all our processes
        python, bind_prefix = _interpreter(iso)
        launcher_cfg = {
            "python": python, "bind_prefix": bind_prefix, "mounts": iso.namespaces, "tmpfs_mb": cfg.tmpfs_mb,
            "uid": uid, "gid": uid,
            "workdir": workdir, "limits": limits, "harness": _HARNESS_SRC, "nice": 10,
        }
        cmd = [sys.executable, "-I", "-S", "-B", "-c", _LAUNCHER_SRC, json.dumps(launcher_cfg)]
        if iso.namespaces:
            cmd = _unshare_cmd(iso.user_ns) + cmd
        job = json.dumps({"fd": w_fd, "nonce": nonce, "code": code, "setup": setup,
                          "tests": _encode_tests(tests)}).encode()
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(w_fd,), start_new_session=True, close_fds=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}, cwd="/",
            )
        finally:
            os.close(w_fd)
        deadline = t0 + cfg.timeout_s
        try:
            out, err, res, timed_out, overflow = _communicate_all(proc, job, r_fd, deadline, cfg.max_output_bytes)
        finally:
            _kill_tree(proc)
            try:
                os.close(r_fd)
            except OSError:
                pass
        records, load_error, tampered = _parse_results(res, nonce, len(tests))
        tampered = tampered or overflow
        passed, details = _grade(tests, records)
        if tampered:
            passed = [False] * len(tests)
            details = ["result channel tampered with"] * len(tests)
        result = SandboxResult(
            passed=passed, details=details, stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"), returncode=proc.returncode, timed_out=timed_out,
            wall_s=time.monotonic() - t0, isolation=iso.describe(), load_error=load_error, tampered=tampered,
        )
        if want_values:
            values = []
            for i in range(len(tests)):
                try:
                    values.append(_unplain(records[i]["v"]))
                except (KeyError, ValueError, TypeError):
                    values.append(None)
            return result, values
        return result
    finally:
        if uid is not None and uid != 65534:
            _sweep_uid(uid)  # with a PID namespace nothing is left; without one this kills escapees
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        _SLOTS.release(slot)


def _communicate_all(proc, job, r_fd, deadline, max_output):
    """_communicate, returning (stdout, stderr, results, timed_out, overflow) as bytes."""
    assert proc.stdin and proc.stdout and proc.stderr
    win = proc.stdin.fileno()
    fds = {"out": proc.stdout.fileno(), "err": proc.stderr.fileno(), "res": r_fd}
    caps = {"out": max_output, "err": max_output, "res": MAX_RESULT_BYTES}
    bufs = {k: bytearray() for k in fds}
    open_names = set(fds)
    os.set_blocking(win, False)
    pending = memoryview(job)
    writing = len(pending) > 0
    timed_out = overflow = False
    exited_at = None
    while open_names or writing:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.5:
            break  # main process gone, an escapee holds a pipe: stop waiting
        rlist = [fds[k] for k in open_names]
        try:
            r, w, _ = select.select(rlist, [win] if writing else [], [], max(0.0, min(0.1, deadline - now)))
        except InterruptedError:
            continue
        for name in [k for k in open_names if fds[k] in r]:
            try:
                data = os.read(fds[name], 65536)
            except OSError:
                data = b""
            if not data:
                open_names.discard(name)
                continue
            room = caps[name] - len(bufs[name])
            bufs[name] += data[: max(0, room)]
            if len(data) > room:
                open_names.discard(name)  # over the cap: stop reading; closing makes the child see EPIPE
                if name == "res":
                    overflow = True
                else:
                    (proc.stdout if name == "out" else proc.stderr).close()
        if w:
            try:
                n = os.write(win, pending[:65536])
                pending = pending[n:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                pending = pending[:0]
            if not pending:
                writing = False
                proc.stdin.close()
    if writing or not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:
            pass
    return bytes(bufs["out"]), bytes(bufs["err"]), bytes(bufs["res"]), timed_out, overflow


def run_tests(code: str, tests: Sequence[TestCase], config: SandboxConfig | None = None, *,
              setup: str = "") -> SandboxResult:
    """Run `code` (then `setup` first) in the sandbox and grade it against `tests` in the parent."""
    cfg = (config or SandboxConfig()).validate()
    iso = check_isolation(cfg.isolation)
    if not tests:
        return SandboxResult(passed=[], details=[], isolation=iso.describe())
    return _run(code, tests, cfg, iso, setup=setup)


def run_many(jobs: Sequence[tuple[str, Sequence[TestCase]]], config: SandboxConfig | None = None,
             workers: int | None = None, setup: str = "") -> list[SandboxResult]:
    """Run several candidates on a bounded pool (at most MAX_PARALLEL at once)."""
    cfg = (config or SandboxConfig()).validate()
    check_isolation(cfg.isolation)
    n = max(1, min(workers or MAX_PARALLEL, MAX_PARALLEL))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="grpolab-sandbox") as ex:
        return list(ex.map(lambda job: run_tests(job[0], job[1], cfg, setup=setup), jobs))


def literal_test(call_src: str, expected_src: str) -> TestCase:
    """A call test from source text: `call_src` must be `name(literal, ...)`, expected a literal.

    Parsed with ast.literal_eval in the parent; nothing is evaluated.
    """
    tree = ast.parse(call_src.strip(), mode="eval").body
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name) or tree.keywords:
        raise ValueError(f"not a plain call: {call_src!r}")
    args = tuple(ast.literal_eval(a) for a in tree.args)
    return TestCase("call", fn=tree.func.id, args=args, expected=ast.literal_eval(expected_src))


__all__ = [
    "ISOLATION_MODES", "Isolation", "SandboxConfig", "SandboxResult", "SandboxUnavailable", "TestCase",
    "check_isolation", "literal_test", "plain_equal", "probe_isolation", "run_many", "run_tests",
]
