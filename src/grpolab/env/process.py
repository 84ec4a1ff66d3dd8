"""Run one tool call in a child process that can be killed: the hard time bound (env.tool_process=true).

A Python thread cannot be stopped, and a tool that is one long C operation holding the GIL (`a ** b` on
big numbers, a catastrophic regex such as `(a+)+$`, `sum(range(n))`) does not even let its waiter wake up
at the timeout: the trainer freezes with it. A call run here is a forked copy of the trainer process:

    fork; the child moves to a process group of its own, runs the call, writes its result (JSON) to a
    pipe and exits (os._exit: no atexit handlers, no buffers of the trainer flushed twice)
    the parent waits on the pipe (select: no GIL held) until the call's time limit, then kills the
    child's whole process group (SIGKILL) and reaps it

so the waiter returns within the limit plus the time to fork and to kill (milliseconds), whatever the
tool does, and nothing the call started outlives it. What the call changes in memory (its object's
attributes, module globals) stays in the child: the parent's copy is as it was before the call. The
child reports a change of its object's attributes (a bound method's `__self__.__dict__`, compared by
pickle digest before and after the call) as a `process_state_lost` event, so that a stateful tool run
this way is seen in the metrics instead of silently losing its state.

POSIX only (os.fork); the result must be text (the runner converts a tool's result in the child).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import Any

MAX_RESULT_BYTES = 64 * 1024 * 1024
"""Most bytes a child may send back; past it the call is killed and reported as failed."""


def available() -> bool:
    """True where a call can run in a forked process (POSIX)."""
    return hasattr(os, "fork")


def state_digest(fn: Callable) -> bytes | None:
    """Digest of the attributes of a bound method's object (None: a plain function, or not picklable)."""
    owner = getattr(fn, "__self__", None)
    state = getattr(owner, "__dict__", None)
    if owner is None or state is None:
        return None
    try:
        return hashlib.sha256(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    except Exception:  # noqa: BLE001 - an object that cannot be pickled is not checked
        return None


def _child(work: Callable[[], tuple[str, str, dict]], w: int) -> None:
    """The child's whole life: run `work`, send (kind, text, events) as JSON, exit without cleanup."""
    code = 0
    try:
        os.setpgid(0, 0)
        try:
            payload = work()
        except BaseException as e:  # noqa: BLE001 - whatever happens is reported, never raised
            payload = ("raised", f"{type(e).__name__}", {})
        data = json.dumps(payload).encode("utf-8", "surrogatepass")
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    """SIGKILL the child's process group (what it started too), then the child itself; reap it."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def run_in_process(work: Callable[[], tuple[str, str, dict]], timeout_s: float) -> tuple[str, str, dict] | None:
    """`work()` in a forked child, waited for at most timeout_s: its (kind, text, events) where kind is "ok"
    (text: the result) or "raised" (text: the error), ("died", why, {}) if the child ended without a
    result, or None if it ran past timeout_s (it is killed, with its process group, before this returns)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        os.close(r)
        _child(work, w)
    os.close(w)
    try:
        os.setpgid(pid, pid)  # also from this side: no race with the child's own setpgid
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    size = 0
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_RESULT_BYTES:
                _kill(pid)
                return ("died", f"its result is longer than {MAX_RESULT_BYTES} bytes", {})
            chunks.append(chunk)
    finally:
        os.close(r)
        _kill(pid)  # a child that has written its result is exiting: this reaps it and anything it left behind
    if timed_out:
        return None
    try:
        kind, text, events = json.loads(b"".join(chunks).decode("utf-8", "surrogatepass"))
        return str(kind), str(text), {str(k): int(v) for k, v in dict(events).items()}
    except (ValueError, TypeError):
        return ("died", "its process ended without a result", {})


def remote_call(invoke: Callable[[], Any], fn: Callable, events: dict) -> tuple[str, str, dict]:
    """What a child runs: `invoke()` (the runner's call, returning text or an error object with a
    `describe()`), as (kind, text, events), with `process_state_lost` counted when fn's object changed."""
    before = state_digest(fn)
    out = invoke()
    if before is not None and state_digest(fn) != before:
        events["process_state_lost"] = events.get("process_state_lost", 0) + 1
    if isinstance(out, str):
        return "ok", out, dict(events)
    return "raised", out.describe(), dict(events)
