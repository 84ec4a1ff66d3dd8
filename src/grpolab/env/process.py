"""Run one tool call in a child process that can be killed: the hard time bound (env.tool_process=true).

A Python thread cannot be stopped, and a tool that is one long C operation holding the GIL (`a ** b` on
big numbers, a catastrophic regex such as `(a+)+$`, `sum(range(n))`) does not even let its waiter wake up
at the timeout: the trainer freezes with it. A call run here is a forked copy of the trainer process:

    fork (grpolab.util.forked.fork_child); the child runs the call with its address space bounded
    (env.tool_memory_mb beyond what it inherited), writes its result (JSON) to a pipe and exits
    the parent waits on the pipe (select: no GIL held) until the call's time limit, then kills the child
    and every process below it (grpolab.util.forked.kill_tree: `setsid cmd &` included) and reaps it

so the waiter returns within the limit plus the time to fork and to kill (milliseconds), whatever the
tool does, and nothing the call started outlives it (on Linux; elsewhere, what left the child's process
group with setsid survives). What the call changes in memory (its object's
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
import time
from collections.abc import Callable
from typing import Any

from grpolab.util.forked import available as available  # noqa: F401 - runner.py reads it here
from grpolab.util.forked import fork_child, kill_tree, write_all

MAX_RESULT_BYTES = 64 * 1024 * 1024
"""Most bytes a child may send back; past it the call is killed and reported as failed."""

DEFAULT_MEMORY_MB = 1024
"""The memory a tool call's child may add to what it inherited (env.tool_memory_mb)."""
_memory_mb = DEFAULT_MEMORY_MB


def limit_memory(mb: int) -> None:
    """Set the memory a tool call's child may add (env.tool_memory_mb; process-wide, as the fork is; 0: none)."""
    global _memory_mb
    if not (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 0):
        raise ValueError(f"the memory of a tool call's child process must be an integer >= 0 MiB, got {mb!r}")
    _memory_mb = mb


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


def run_in_process(
    work: Callable[[], tuple[str, str, dict]], timeout_s: float, memory_mb: int | None = None
) -> tuple[str, str, dict] | None:
    """`work()` in a forked child (grpolab.util.forked: killed with everything it started, its address space
    bounded by memory_mb MiB beyond what it inherited), waited for at most timeout_s: its (kind, text,
    events) (memory_mb None: the process-wide limit_memory) where kind is "ok" (text: the result) or "raised" (text: the error), ("died", why, {}) if the
    child ended without a result, or None if it ran past timeout_s (it is killed, with what it started,
    before this returns)."""

    def child(w: int) -> None:
        try:
            payload = work()
        except BaseException as e:  # noqa: BLE001 - whatever happens is reported, never raised
            payload = ("raised", f"{type(e).__name__}", {})
        write_all(w, json.dumps(payload).encode("utf-8", "surrogatepass"))

    pid, r = fork_child(child, _memory_mb if memory_mb is None else memory_mb)
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
                return ("died", f"its result is longer than {MAX_RESULT_BYTES} bytes", {})
            chunks.append(chunk)
    finally:
        os.close(r)
        kill_tree(pid)  # a child that has written its result is exiting: this reaps it and what it left behind
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
