"""Process helpers shared by every part of grpolab that starts a child process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def kill_process_group(proc: subprocess.Popen, *, wait_s: float = 5.0) -> bool:
    """SIGKILL the process group led by `proc` (started with start_new_session=True) and reap it.

    Returns True when the leader was reaped within `wait_s` seconds. A group that is already gone,
    or that this process may not signal, is not an error.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


BUSY_CODE = "while True: pass"
"""What a busy process runs: one core's worth of load that never sleeps (a stand-in for the browser, the
indexer or the other job of a machine doing something else)."""


@contextlib.contextmanager
def busy_processes(n: int, own_sessions: bool = True):
    """Run `n` single-threaded processes spinning at 100% of a core for the duration of the block; they
    are killed (and reaped) when it ends, however it ends. Yields their pids.

    own_sessions: each in a session of its own, as separate programs are (where the kernel groups tasks by
    session, autogroup, each is a scheduling group of its own, and a group's tasks share its CPU share);
    False keeps them in the caller's session (each in a process group of its own, as jobs started with
    `&` from one shell are), so that they share the caller's scheduling group."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-S", "-c", BUSY_CODE],
            stdin=subprocess.DEVNULL,
            start_new_session=own_sessions,
            process_group=None if own_sessions else 0,
        )
        for _ in range(max(0, n))
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            kill_process_group(p)


__all__ = ["kill_process_group", "busy_processes", "BUSY_CODE"]
