"""A forked child process that can be killed with everything it started: the hard bound on user code.

A Python thread cannot be stopped, and code that is one long C operation holding the GIL (`a ** b` on big
numbers, a catastrophic regex such as `(a+)+$`) does not even let a waiting thread wake up. A forked copy of
this process can be killed at any moment. `fork_child(work, memory_mb)` starts one:

    the child moves to a process group of its own, dies with this process (PR_SET_PDEATHSIG), becomes the
    subreaper of what it starts (PR_SET_CHILD_SUBREAPER: a grandchild whose parent exits, `setsid cmd &`
    included, is re-parented to the child instead of to init), limits its address space to what it
    inherited plus `memory_mb` (RLIMIT_AS; inherited by what it starts), runs `work(fd)` (fd: the write end
    of a pipe to the parent) and exits with os._exit (no atexit handlers, no buffers of the parent
    flushed twice)

`kill_tree(pid)` stops the child, SIGKILLs every live process below it (found through /proc's parent
links, again until none is left: the subreaper keeps them all below it), then the child's process group
and the child, and reaps it. Where there is no /proc (or no prctl: not Linux), only the process group is
killed, and a process that left it with setsid survives.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SWEEP_ROUNDS = 50
"""Most /proc scans of one kill (each kills what it finds; a new scan sees what those left behind)."""


def available() -> bool:
    """True where a call can run in a forked process (POSIX)."""
    return hasattr(os, "fork")


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value) through libc; False where it is not there or fails."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols, libc's among them (no lookup)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError, TypeError):
        return False


def vm_size() -> int:
    """This process's virtual memory size in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_memory(memory_mb: int | None) -> None:
    """RLIMIT_AS = the address space this process has now plus memory_mb MiB (None or 0: no limit). A fork
    inherits the trainer's mappings, so the bound is what the child may add, not an absolute size."""
    if not memory_mb:
        return
    base = vm_size()
    if base <= 0:
        return
    limit = base + int(memory_mb) * 1024 * 1024
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def fork_child(work: Callable[[int], None], memory_mb: int | None = None) -> tuple[int, int]:
    """Fork a child that runs work(w) (see the module docstring). Returns (pid, r): the child's pid and the
    read end of its pipe (the caller closes it and kills the child with kill_tree)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            limit_memory(memory_mb)
            work(w)
        except BaseException:  # noqa: BLE001 - whatever happens, the child exits here
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpgid(pid, pid)  # also from this side: no race with the child's own setpgid
    return pid, r


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of data to fd."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _parents() -> dict[int, tuple[int, str]] | None:
    """pid -> (parent pid, state letter) of every process /proc shows; None where there is no /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out: dict[int, tuple[int, str]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) >= 2:
            out[int(name)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
    return out


def descendants(pid: int) -> list[int] | None:
    """The live (not zombie) processes below pid, by /proc's parent links; None where there is no /proc."""
    table = _parents()
    if table is None:
        return None
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        if table[p][1] != "Z":
            out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _signal(fn: Callable[[int, int], None], target: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        fn(target, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL the child `pid` and everything below it (see the module docstring), then reap the child."""
    _signal(os.kill, pid, signal.SIGSTOP)  # it starts nothing more; as a subreaper it still adopts orphans
    for _ in range(SWEEP_ROUNDS):
        found = descendants(pid)
        if not found:
            break
        for p in found:
            _signal(os.kill, p, signal.SIGKILL)
    _signal(os.killpg, pid, signal.SIGKILL)
    _signal(os.kill, pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


__all__ = ["available", "descendants", "fork_child", "kill_tree", "limit_memory", "vm_size", "write_all"]
