"""Process helpers shared by every part of grpolab that starts a child process."""

from __future__ import annotations

import os
import signal
import subprocess


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


__all__ = ["kill_process_group"]
