"""Starting one run: the command the parent starts, and the trusted launcher inside the sandbox.

The parent starts `unshare --pid --net --mount --ipc --uts --fork --kill-child` (plus `--user
--map-root-user` when not root) running the launcher (`python -I -S`, standard library only). The
launcher is the PID namespace's init and stays the trusted root of the run:

1. joins the slot's cgroup (when there is one) and reads the job from stdin;
2. builds a minimal root file system and pivots into it (see `_build_root`): the candidate sees an
   empty working directory, the interpreter, its standard library and the shared libraries these
   load, /dev/null-like devices, and a private noexec tmpfs on /tmp; nothing of the host (no /proc, no
   repository, no datasets, no site-packages);
3. forks the *candidate* before it reads the job (so no test is in its memory): it drops to the
   slot uid, sets rlimits, re-arms PR_SET_PDEATHSIG after the uid change, sets no_new_privs and
   the seccomp filter, and runs the harness in this interpreter (no second Python start-up); then
   reads the job and forks the *checker* (same uid, not dumpable, holds the result pipe), see
   grpolab.sandbox.channel;
4. is the watchdog: it kills every process of the namespace when the checker is done, when the
   wall-clock bound passes, or when stdin ends (the trainer died, even by SIGKILL), then exits,
   which takes the namespace down. The parent also SIGKILLs the process group at its own deadline.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import sys

from grpolab.sandbox import channel
from grpolab.sandbox.channel import _checker_main, _harness_main, _recv
from grpolab.util.threads import SINGLE_THREAD_ENV

WATCHDOG_GRACE_S = 1.0  # the init's own wall-clock bound is the run's timeout plus this
ROOT_ERROR = "grpolab sandbox: cannot build the minimal root"  # the launcher's stderr when _build_root fails
ROOT_ERROR_EXIT = 97
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


# ============================================================================ inside the sandbox


def _enter(libc, cfg, workdir, parent, checker):
    """Become the candidate (or the checker): limits, the slot uid, death signal, no privileges."""
    import ctypes
    import resource

    if not checker:  # the trainer outranks the candidate for the CPU (timeouts stay prompt)
        os.nice(cfg["nice"])
    lim = cfg["limits"]
    for name, value in (
        ("RLIMIT_CPU", lim["cpu"]),
        ("RLIMIT_AS", lim["as"]),
        ("RLIMIT_FSIZE", lim["fsize"]),
        ("RLIMIT_NOFILE", lim["nofile"]),
        ("RLIMIT_NPROC", lim["nproc"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
            os._exit(97)
    elif os.geteuid() == 0 and cfg["mounts"]:  # root of a user namespace: give up every capability
        if libc.prctl(28, 0x2F, 0, 0, 0) != 0:  # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP (locked)
            os._exit(95)
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable = 0 (two words each)
        if libc.capset(header, data) != 0:
            os._exit(95)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL; the uid change cleared it, so re-arm it
    if os.getppid() != parent:
        os._exit(97)  # the launcher died before the death signal was armed
    if checker:
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: the candidate cannot ptrace or read the checker
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: setuid binaries cannot raise privileges
        os._exit(96)
    if cfg["seccomp"]:
        prog = bytes.fromhex(cfg["seccomp"])
        buf = ctypes.create_string_buffer(prog, len(prog))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
        if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            os._exit(96)
    os.chdir(workdir)


def _build_root(libc, cfg):
    """Mount a minimal read-only root (in this private mount namespace), pivot into it; the workdir."""
    import ctypes

    rdonly, nosuid, nodev, noexec, remount, bind, rec = 1, 2, 4, 8, 32, 4096, 16384

    def mount(src, target, fstype, flags, data):
        args = [a.encode() if a is not None else None for a in (src, target, fstype, data)]
        if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    # A fresh tmpfs over a host directory that holds nothing the plan needs (private to this
    # namespace; /tmp unless the interpreter lives there, see isolation.root_mountpoint) is the new root.
    plan = cfg["plan"]
    new = plan["mountpoint"]
    mount("tmpfs", new, "tmpfs", nosuid | nodev, "size=1m,nr_inodes=8192,mode=755")
    # The only writable mount, noexec, mounted first: planned paths under /tmp (an interpreter or
    # libraries that live there) are bind-mounted inside it, read-only, in directories owned by root.
    # Nothing written there can be execve'd, mapped executable by ld.so or dlopen'ed (machine code
    # in anonymous memory still runs: see docs/security.md).
    os.mkdir(new + "/tmp", 0o755)
    mount(
        "tmpfs",
        new + "/tmp",
        "tmpfs",
        nosuid | nodev | noexec,
        f"size={cfg['tmpfs_mb']}m,nr_inodes={cfg['tmpfs_inodes']},mode=1777",
    )
    for d in plan["dirs"]:
        os.mkdir(new + d, 0o755)
    for link, target in plan["links"]:
        os.symlink(target, new + link)
    for src in plan["files"]:
        os.close(os.open(new + src, os.O_WRONLY | os.O_CREAT, 0o644))
        mount(src, new + src, None, bind, None)
        mount(None, new + src, None, remount | bind | rdonly | nosuid | (0 if src.startswith("/dev/") else nodev), None)
    for src in plan["trees"]:
        mount(src, new + src, None, bind | rec, None)
        mount(None, new + src, None, remount | bind | rdonly | nosuid | nodev, None)
    for d in plan["masks"]:  # e.g. site-packages inside the standard library: an empty directory
        mount("tmpfs", new + d, "tmpfs", rdonly | nosuid | nodev, "size=4k,nr_inodes=2,mode=755")
    workdir = "/tmp/work"
    while os.path.lexists(new + workdir):
        workdir += "_"
    os.mkdir(new + workdir, 0o700)
    if cfg["uid"] is not None:
        os.chown(new + workdir, cfg["uid"], cfg["uid"])
    mount(None, new, None, remount | rdonly | nosuid | nodev, None)
    os.chdir(new)
    if libc.syscall(cfg["sys_pivot_root"], b".", b".") != 0 or libc.umount2(b".", 2) != 0:  # MNT_DETACH
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root: {os.strerror(err)}")
    os.chdir("/")
    return workdir


def _launcher_main():
    """The sandbox's init: set up, start checker and candidate, watch, and tear everything down."""
    import ctypes
    import fcntl
    import resource  # noqa: F401 - imported before the root changes
    import select
    import signal
    import sys
    import time

    cfg = json.loads(sys.argv[1])
    wall_end = time.monotonic() + cfg["wall_s"]
    libc = ctypes.CDLL(None, use_errno=True)
    for path in cfg["cgroups"]:
        with open(path, "w") as f:
            f.write("0")  # this process; children inherit the cgroup
    try:
        workdir = _build_root(libc, cfg) if cfg["mounts"] else cfg["workdir"]
    except OSError as e:
        os.write(2, f"{ROOT_ERROR}: {e}\n".encode("utf-8", "replace"))
        os._exit(ROOT_ERROR_EXIT)
    me = os.getpid()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    done_r, done_w = os.pipe()  # held by the checker only: its end wakes the watchdog
    res_fd = cfg["res_fd"]
    devnull = os.open("/dev/null", os.O_RDWR)
    # The candidate is forked before the job is read: nothing of the tests is in its memory. It runs
    # the harness in this (fresh, trusted) interpreter after dropping everything, without an exec.
    cand = os.fork()
    if cand == 0:
        try:
            hi_r, hi_w = fcntl.fcntl(req_r, fcntl.F_DUPFD, 100), fcntl.fcntl(rep_w, fcntl.F_DUPFD, 100)
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)
            os.dup2(devnull, 0)
            os.closerange(5, 1 << 16)  # the result pipe, stdin's pipe, everything else of the launcher
            _enter(libc, cfg, workdir, me, checker=False)
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir})
            os.environ.update(cfg["thread_env"])  # one compute thread: the trainer's team keeps its cores
            sys.argv[:] = ["solution.py"]
            if cfg["mounts"]:  # the interpreter's own path in the new root (a venv's link is not there)
                sys.executable = sys._base_executable = cfg["exe"]
            if cfg["exec_python"]:  # no mount namespace and this Python is unreachable for the uid
                exe = cfg["exec_python"]
                os.execve(exe, [exe, "-I", "-S", "-B", "-c", cfg["harness"]], dict(os.environ))
            del cfg
            _harness_main()
        finally:
            os._exit(0)
    try:
        job = _recv(0, 1 << 27)
    except (EOFError, OSError, ValueError):
        job = None  # the trainer went away before sending the job
    chk = os.fork() if job is not None else -1
    if chk == 0:
        try:
            for fd in (req_r, rep_w, done_r):
                os.close(fd)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            _enter(libc, cfg, workdir, me, checker=True)
            _checker_main(job, req_w, rep_r, res_fd)
        finally:
            os._exit(0)
    for fd in (req_r, req_w, rep_r, rep_w, done_w, res_fd, devnull):
        os.close(fd)
    while job is not None:
        left = wall_end - time.monotonic()
        if left <= 0:
            break
        try:
            ready, _, _ = select.select([0, done_r], [], [], left)
        except InterruptedError:
            continue
        if done_r in ready:
            break  # the checker finished (or died)
        if 0 in ready and not os.read(0, 4096):
            break  # stdin ended: the trainer is gone
    if me == 1:
        os.kill(-1, signal.SIGKILL)  # every other process of this PID namespace
    else:
        for pid in (cand, chk):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    os._exit(0)


def _source(main, *helpers) -> str:
    parts = [
        f"import json, os\nROOT_ERROR = {ROOT_ERROR!r}\nROOT_ERROR_EXIT = {ROOT_ERROR_EXIT}\nMAX_VALUE_CHARS = {channel.MAX_VALUE_CHARS}\nMAX_FRAME_BYTES = {channel.MAX_FRAME_BYTES}"
    ]
    parts += [inspect.getsource(f) for f in helpers + (main,)]
    parts.append(f"{main.__name__}()")
    return "\n\n".join(parts)


HARNESS_SRC = _source(channel._harness_main, channel._plain, channel._unplain, channel._send, channel._recv)
LAUNCHER_SRC = _source(
    _launcher_main,
    channel._plain,
    channel._unplain,
    channel._send,
    channel._recv,
    channel._harness_main,
    channel._checker_main,
    _enter,
    _build_root,
)


# ============================================================================ parent side


def launcher_command(cfg: dict, unshare: list[str] | None) -> list[str]:
    """The argv that starts one run (`unshare` prefix when namespaces are used)."""
    cmd = [sys.executable, "-I", "-S", "-B", "-c", LAUNCHER_SRC, json.dumps(cfg)]
    return (unshare or []) + cmd


def launcher_config(
    *,
    exec_python: str | None,
    plan: dict | None,
    uid: int | None,
    workdir: str | None,
    limits: dict,
    res_fd: int,
    wall_s: float,
    cgroups: list[str],
    seccomp: bytes | None,
    tmpfs_mb: int,
    tmpfs_inodes: int,
) -> dict:
    """What the launcher is told (JSON on its command line; the job itself comes on stdin)."""
    return {
        "exec_python": exec_python,
        "harness": HARNESS_SRC if exec_python else "",
        "plan": plan,
        "exe": os.path.realpath(sys.executable),
        "mounts": plan is not None,
        "uid": uid,
        "workdir": workdir,
        "limits": limits,
        "res_fd": res_fd,
        "wall_s": wall_s,
        "cgroups": cgroups,
        "nice": 10,
        "seccomp": seccomp.hex() if seccomp else "",
        "tmpfs_mb": tmpfs_mb,
        "tmpfs_inodes": tmpfs_inodes,
        "sys_pivot_root": _SYS_PIVOT_ROOT.get(platform.machine(), -1),
        "thread_env": dict(SINGLE_THREAD_ENV),
    }


__all__ = ["LAUNCHER_SRC", "ROOT_ERROR", "ROOT_ERROR_EXIT", "WATCHDOG_GRACE_S", "launcher_command", "launcher_config"]
