"""Resource limits of one candidate run: rlimits, a cgroup per slot, a seccomp filter.

Three layers, each stopping what the others cannot:

- rlimits (per process, always): CPU seconds, address space, file size, open files, processes of
  the slot uid, no core dumps.
- a cgroup per slot (where the machine allows it): the memory of every process of the run
  together (page cache, tmpfs and memfd pages included, which RLIMIT_AS does not see) and the
  number of tasks. cgroup v2 when its memory and pids controllers can be delegated to us, else the
  v1 memory and pids hierarchies, else none; `cgroup_support()` says which, and why.
- a seccomp filter (x86_64, aarch64): system calls an unprivileged function never needs fail with
  EPERM: new namespaces (unshare, setns, clone with namespace flags; clone3 gets ENOSYS so libc
  falls back to clone), mount, ptrace and process_vm_*, the kernel keyring, memfd_create, bpf,
  userfaultfd, perf_event_open, io_uring, module loading, kexec. Other architectures: none (said
  so by `seccomp_program()` returning None).
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import re
import struct
import threading
from dataclasses import dataclass, field

from grpolab.util.fields import ConfigError

log = logging.getLogger(__name__)

ISOLATION_MODES = ("require", "best_effort")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one candidate run.

    timeout_s: wall clock for the whole run (all tests); the process tree is SIGKILLed after it,
    and the namespace's init kills everything itself shortly after (even if the trainer is gone).
    cpu_s: RLIMIT_CPU.  memory_mb: RLIMIT_AS per process.  fsize_mb: RLIMIT_FSIZE (largest file).
    nofile: RLIMIT_NOFILE.  nproc: RLIMIT_NPROC (processes + threads of the slot uid).
    slot_memory_mb: memory of the whole run (all its processes, tmpfs and memfd included), when a
    cgroup is available.  max_output_bytes: stdout and stderr are each cut after this many bytes.
    tmpfs_mb / tmpfs_inodes: size and inode count of the private /tmp (namespaces only).
    isolation: "require" (refuse without namespaces) or "best_effort" (warn once and run).
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    fsize_mb: int = 8
    nofile: int = 64
    nproc: int = 8
    slot_memory_mb: int = 1024
    max_output_bytes: int = 64 * 1024
    tmpfs_mb: int = 32
    tmpfs_inodes: int = 2048
    isolation: str = "best_effort"

    def validate(self) -> SandboxConfig:
        """Raise ConfigError naming the first bad field."""
        if self.isolation not in ISOLATION_MODES:
            raise ConfigError(f"sandbox.isolation: expected require|best_effort, got {self.isolation!r}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 600):
            raise ConfigError(f"sandbox.timeout_s: expected a number in (0, 600], got {self.timeout_s!r}")
        for name in (
            "cpu_s",
            "memory_mb",
            "fsize_mb",
            "nofile",
            "nproc",
            "slot_memory_mb",
            "max_output_bytes",
            "tmpfs_mb",
            "tmpfs_inodes",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"sandbox.{name}: expected a positive integer, got {v!r}")
        if self.memory_mb < 64:
            raise ConfigError("sandbox.memory_mb: at least 64 (a Python interpreter needs ~30 MB)")
        if self.slot_memory_mb < 128:
            raise ConfigError("sandbox.slot_memory_mb: at least 128 (init, checker and candidate share it)")
        if self.nofile < 16:
            raise ConfigError("sandbox.nofile: at least 16")
        if self.tmpfs_inodes < 64:
            raise ConfigError("sandbox.tmpfs_inodes: at least 64")
        return self

    def rlimits(self) -> dict[str, int]:
        """The rlimits the launcher sets on the candidate (and the checker)."""
        return {
            "cpu": int(self.cpu_s),
            "as": int(self.memory_mb) * 2**20,
            "fsize": int(self.fsize_mb) * 2**20,
            "nofile": int(self.nofile),
            "nproc": int(self.nproc),
        }


# ============================================================================ seccomp

# System calls denied with EPERM, by architecture (numbers from the kernel's syscall tables).
_DENY = {
    "x86_64": {
        "ptrace": 101,
        "syslog": 103,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "acct": 163,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "init_module": 175,
        "delete_module": 176,
        "finit_module": 313,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "memfd_create": 319,
        "bpf": 321,
        "userfaultfd": 323,
        "perf_event_open": 298,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "kcmp": 312,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "pidfd_getfd": 438,
        "mount_setattr": 442,
        "memfd_secret": 447,
        "fanotify_init": 300,
        "quotactl": 179,
    },
    "aarch64": {
        "ptrace": 117,
        "syslog": 116,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "acct": 89,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "init_module": 105,
        "delete_module": 106,
        "finit_module": 273,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "memfd_create": 279,
        "bpf": 280,
        "userfaultfd": 282,
        "perf_event_open": 241,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "kcmp": 272,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "pidfd_getfd": 438,
        "mount_setattr": 442,
        "memfd_secret": 447,
        "fanotify_init": 262,
        "quotactl": 60,
    },
}
_ARCH = {"x86_64": (0xC000003E, 56, 435), "aarch64": (0xC00000B7, 220, 435)}  # audit arch, clone, clone3
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (and CLONE_NEWTIME = 0x80)
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The BPF program (struct sock_filter[]) for this architecture, or None where unsupported."""
    machine = machine or platform.machine()
    if machine not in _DENY or not platform.system() == "Linux":
        return None
    arch, clone, clone3 = _ARCH[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [_ins(ld, 0, 0, 4), _ins(jeq, 1, 0, arch), _ins(ret, 0, 0, _RET_KILL_PROCESS), _ins(ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI (nr | 0x40000000) would bypass the numbers below
        prog += [_ins(jge, 0, 1, 0x40000000), _ins(ret, 0, 0, _RET_ERRNO | _EPERM)]
    for nr in sorted(_DENY[machine].values()):
        prog += [_ins(jeq, 0, 1, nr), _ins(ret, 0, 0, _RET_ERRNO | _EPERM)]
    prog += [_ins(jeq, 0, 1, clone3), _ins(ret, 0, 0, _RET_ERRNO | _ENOSYS)]
    prog += [
        _ins(jeq, 0, 3, clone),
        _ins(ld, 0, 0, 16),
        _ins(jset, 0, 1, _CLONE_NS_FLAGS),
        _ins(ret, 0, 0, _RET_ERRNO | _EPERM),
    ]
    prog.append(_ins(ret, 0, 0, _RET_ALLOW))
    return b"".join(prog)


# ============================================================================ cgroups


@dataclass(frozen=True)
class CgroupSupport:
    """Which cgroup the slots get: kind "v2", "v1" or "" (none), the parent directories, and why."""

    kind: str
    dirs: dict = field(default_factory=dict)  # "v2": {"unified": dir}; "v1": {"memory": dir, "pids": dir}
    reason: str = ""

    def describe(self) -> str:
        if self.kind:
            return f"cgroup {self.kind} per slot (memory, pids)"
        return f"NO cgroup ({self.reason})"


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fs type, super options) per line of /proc/self/mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) >= 5 and len(b) >= 3:
            out.append((a[3], a[4], b[0], b[2]))
    return out


def _join(mount_point: str, mount_root: str, cg_path: str) -> str:
    rel = cg_path
    if mount_root != "/" and (cg_path == mount_root or cg_path.startswith(mount_root + "/")):
        rel = cg_path[len(mount_root) :]
    return os.path.join(mount_point, rel.lstrip("/"))


def detect_cgroups(mountinfo: str, self_cgroup: str, probe_write: bool = True) -> CgroupSupport:
    """Pick the cgroup layer from /proc/self/mountinfo and /proc/self/cgroup text (pure but for writes).

    v2: a cgroup2 mount whose cgroup for this process offers memory and pids, and where they are
    (or can be) enabled for children. v1: memory and pids hierarchies, both writable. With
    `probe_write`, a test directory is created and removed to prove we may.
    """
    paths = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2]
    mounts = _mounts(mountinfo)
    reasons = []
    for root, point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in paths:
            continue
        base = _join(point, root, paths[""])
        try:
            ctrls = open(os.path.join(base, "cgroup.controllers")).read().split()
        except OSError as e:
            reasons.append(f"v2 at {point}: {e.strerror}")
            continue
        if not {"memory", "pids"} <= set(ctrls):
            reasons.append(f"v2 at {point}: memory/pids controllers not offered (offered: {' '.join(ctrls) or 'none'})")
            continue
        if probe_write:
            why = _try_v2(base)
            if why:
                reasons.append(f"v2 at {base}: {why}")
                continue
        return CgroupSupport("v2", {"unified": base})
    dirs = {}
    for ctrl in ("memory", "pids"):
        for root, point, fstype, opts in mounts:
            if fstype == "cgroup" and ctrl in opts.split(",") and ctrl in paths:
                dirs[ctrl] = _join(point, root, paths[ctrl])
                break
    if set(dirs) == {"memory", "pids"}:
        if probe_write:
            for ctrl, d in dirs.items():
                why = _try_mkdir(d)
                if why:
                    reasons.append(f"v1 {ctrl} at {d}: {why}")
                    return CgroupSupport("", reason="; ".join(reasons))
        return CgroupSupport("v1", dirs)
    reasons.append("no cgroup v1 memory+pids hierarchies either")
    return CgroupSupport("", reason="; ".join(reasons))


def _try_mkdir(d: str) -> str:
    test = os.path.join(d, f"grpolab-probe-{os.getpid()}")
    try:
        os.mkdir(test)
        os.rmdir(test)
    except OSError as e:
        return e.strerror or str(e)
    return ""


def _try_v2(base: str) -> str:
    """Enable memory+pids for children of `base` (needed to limit them); '' on success."""
    try:
        have = open(os.path.join(base, "cgroup.subtree_control")).read().split()
        if not {"memory", "pids"} <= set(have):
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory +pids")
    except OSError as e:
        return (
            f"cannot enable memory/pids for child cgroups ({e.strerror}); run grpolab in a delegated "
            "cgroup (e.g. systemd-run --scope -p Delegate=yes)"
        )
    return _try_mkdir(base)


_cg_lock = threading.Lock()
_cg_support: CgroupSupport | None = None
_cg_made: dict[tuple[int, str], str] = {}
_cg_limits: dict[tuple[int, str], tuple] = {}


def cgroup_support(force: bool = False) -> CgroupSupport:
    """This machine's cgroup layer (probed once; root only: others cannot create cgroups here)."""
    global _cg_support
    with _cg_lock:
        if _cg_support is None or force:
            if not platform.system() == "Linux":
                _cg_support = CgroupSupport("", reason="not Linux")
            else:
                try:
                    mi, cg = open("/proc/self/mountinfo").read(), open("/proc/self/cgroup").read()
                    _cg_support = detect_cgroups(mi, cg)
                except OSError as e:
                    _cg_support = CgroupSupport("", reason=f"cannot read /proc/self: {e}")
        return _cg_support


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _remove_stale(parent: str) -> None:
    """rmdir the slot cgroups of grpolab processes that died without cleaning up (empty ones only)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"grpolab-(\d+)-slot\d+", name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its owner is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            pass


def slot_cgroup(slot: int, cfg: SandboxConfig, support: CgroupSupport) -> list[str]:
    """The cgroup.procs files the launcher joins for a run in `slot` (created and limited here)."""
    if not support.kind:
        return []
    mem = int(cfg.slot_memory_mb) * 2**20
    pids = int(cfg.nproc) + 8  # init, checker, candidate harness, and the candidate's own
    procs = []
    with _cg_lock:
        for ctrl, parent in support.dirs.items():
            key = (slot, ctrl)
            d = _cg_made.get(key)
            if d is None:
                if not any(c == ctrl for _, c in _cg_made):
                    _remove_stale(parent)
                d = os.path.join(parent, f"grpolab-{os.getpid()}-slot{slot}")
                os.makedirs(d, exist_ok=True)
                _cg_made[key] = d
            if _cg_limits.get(key) != (mem, pids):
                if ctrl == "unified":
                    _write(os.path.join(d, "memory.max"), str(mem))
                    for name, val in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                        if os.path.exists(os.path.join(d, name)):
                            _write(os.path.join(d, name), val)
                    _write(os.path.join(d, "pids.max"), str(pids))
                elif ctrl == "memory":
                    names = ["memory.limit_in_bytes"]
                    if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                        names.append("memory.memsw.limit_in_bytes")  # memory + swap: no swapping out
                    try:  # memsw >= limit at every step: lowering sets limit first, raising memsw first
                        for name in names:
                            _write(os.path.join(d, name), str(mem))
                    except OSError:
                        for name in reversed(names):
                            _write(os.path.join(d, name), str(mem))
                else:
                    _write(os.path.join(d, "pids.max"), str(pids))
                _cg_limits[key] = (mem, pids)
            procs.append(os.path.join(d, "cgroup.procs"))
    return procs


@atexit.register
def _remove_cgroups() -> None:
    for d in list(_cg_made.values()):
        try:
            os.rmdir(d)
        except OSError:
            pass


__all__ = [
    "ISOLATION_MODES",
    "CgroupSupport",
    "SandboxConfig",
    "cgroup_support",
    "detect_cgroups",
    "seccomp_program",
    "slot_cgroup",
]
