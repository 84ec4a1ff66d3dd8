"""Reward calls in forked child processes: the bound that holds whatever a reward does (`reward_process`).

A reward function of your own reads the model's text, so the model chooses its input: a regular expression
that backtracks (`re.match(r"(a+)+$", text)` on 40 a's and a b), `10 ** int(digits)`, a parser that
recurses. Such work is one long C operation holding the GIL: no thread can stop it, and no waiting thread
even wakes up until it ends. Here the calls run in a forked copy of the trainer (grpolab.util.forked),
which is killed at the call's limit with everything it started:

    run_isolated(calls, async_, timeout_s, workers, log) -> [(status, value), ...]

One child per chunk of one function's calls (at most `workers` chunks, and no more than the function's
`max_concurrency`), each driven by a thread of this process that waits on the child's pipe (select: no
GIL held). A synchronous chunk runs its calls one after another in the child's main thread (so
signal.alarm works there, as math-verify's own limits need); each sends its result as it ends, and each
has `timeout_s` from the end of the one before. An `async def` chunk awaits its calls together on an event
loop in the child, all within `timeout_s` of the chunk's start. Past the limit the child is killed
(grpolab.util.forked.kill_tree) and a fresh one runs the chunk's calls that are left; the call that ran
over is a timeout (async: every call not done). A child that dies without a result (an allocation past
its memory limit, a crash) fails the call it was running.

What comes back: the score (converted in the child, grpolab.rewards.values), or what was raised (its type
name and message), and what the call logged (TRL's `log_extra` / `log_metric`: grpolab.rewards.contract.
CallLog's journal, replayed here). What a call changes in memory (a global, a counter in the function's
object, an environment's attributes) stays in the child; a reward that must keep state, or that uses the
trainer's GPU (CUDA cannot be used in a forked child), runs with `reward_process=false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from grpolab.rewards.contract import ERROR, OK, TIMEOUT, CallLog
from grpolab.rewards.values import BadScore
from grpolab.util.forked import fork_child, kill_tree, write_all

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Most bytes one call's result may take; past it the child is killed and the call fails."""
MAX_MESSAGE_CHARS = 2000
"""Longest error message carried back from a child."""
DEFAULT_MEMORY_MB = 2048
"""The memory a reward's child may add to what it inherits from the trainer (reward_memory_mb)."""
GPU_HINT = (
    " (this reward ran in a child process, forked from the trainer, where CUDA cannot be used: set "
    "reward_process=false for a reward that uses the GPU)"
)

_error_types: dict[str, type] = {}


class ChildProcessDied(RuntimeError):
    """The child running a reward call ended without sending its result."""


def remote_error(type_name: str, message: str) -> BaseException:
    """An exception standing for one raised in a child: BadScore and TimeoutError as themselves, anything
    else as an exception whose class has the original's name (so messages read `raised ValueError: ...`)."""
    if type_name == "BadScore":
        return BadScore(message)
    if type_name == "TimeoutError":
        return TimeoutError(message)
    if type_name == ChildProcessDied.__name__:
        return ChildProcessDied(message)
    if "CUDA" in message and "fork" in message:
        message += GPU_HINT
    cls = _error_types.get(type_name)
    if cls is None:
        cls = _error_types.setdefault(type_name, type(type_name, (Exception,), {"__module__": "reward_process"}))
    return cls(message)


def _error(e: BaseException) -> dict:
    try:
        message = str(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = ""
    return {"t": type(e).__name__, "m": message[:MAX_MESSAGE_CHARS]}


def encode(result: tuple[str, Any]) -> list:
    """(status, value) as JSON data: a score, None, a batch call's list of (status, value), or an error."""
    status, value = result
    if status != OK:
        return [status, _error(value)]
    if isinstance(value, list):  # a batch call's per-completion results
        return [OK, {"b": [encode(part) for part in value]}]
    return [OK, {"v": value}]


def decode(data: list) -> tuple[str, Any]:
    """The inverse of encode."""
    status, value = data
    if status != OK:
        return str(status), remote_error(str(value.get("t")), str(value.get("m")))
    if "b" in value:
        return OK, [decode(part) for part in value["b"]]
    return OK, value["v"]


def _call_result(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return OK, call()
    except TimeoutError as e:
        return TIMEOUT, e
    except Exception as e:  # noqa: BLE001 - a reward's failure is a number
        return ERROR, e


def _send(w: int, i: int, result: tuple[str, Any], log: CallLog | None, mark: int) -> int:
    """One frame: the call's index, its encoded result, and what it logged since `mark`; returns the new mark."""
    entries = log.journal[mark:] if log is not None else []
    try:
        data = json.dumps({"i": i, "r": encode(result), "log": entries}).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        data = json.dumps({"i": i, "r": encode((ERROR, e)), "log": []}).encode()
    write_all(w, struct.pack("<I", len(data)) + data)
    return len(log.journal) if log is not None else 0


def _child_sync(calls: list[Callable[[], Any]], todo: list[int], log: CallLog | None) -> Callable[[int], None]:
    def work(w: int) -> None:
        mark = len(log.journal) if log is not None else 0
        for i in todo:
            mark = _send(w, i, _call_result(calls[i]), log, mark)

    return work


def _child_async(calls: list[Callable[[], Any]], todo: list[int], log: CallLog | None) -> Callable[[int], None]:
    def work(w: int) -> None:
        lock = threading.Lock()
        mark = [len(log.journal) if log is not None else 0]

        async def one(i: int) -> None:
            try:
                value = calls[i]()
                if asyncio.iscoroutine(value) or hasattr(value, "__await__"):
                    value = await value
                result: tuple[str, Any] = (OK, value)
            except TimeoutError as e:
                result = (TIMEOUT, e)
            except Exception as e:  # noqa: BLE001
                result = (ERROR, e)
            with lock:
                mark[0] = _send(w, i, result, log, mark[0])

        async def every() -> None:
            await asyncio.gather(*(one(i) for i in todo))

        asyncio.run(every())

    return work


def _frames(buffer: bytearray) -> list[dict]:
    """Take every complete frame off the front of buffer."""
    out = []
    while len(buffer) >= 4:
        (size,) = struct.unpack("<I", buffer[:4])
        if len(buffer) < 4 + size:
            break
        out.append(json.loads(bytes(buffer[4 : 4 + size]).decode("utf-8", "surrogatepass")))
        del buffer[: 4 + size]
    return out


def _drive(
    calls: list[Callable[[], Any]],
    chunk: list[int],
    is_async: bool,
    timeout_s: float,
    log: CallLog | None,
    memory_mb: int | None,
    results: list,
) -> None:
    """Run one chunk of calls in children until every one has a result (see the module docstring)."""
    todo = list(chunk)
    while todo:
        work = (_child_async if is_async else _child_sync)(calls, todo, log)
        pid, r = fork_child(work, memory_mb)
        deadline = time.monotonic() + timeout_s
        buffer = bytearray()
        ended = "died"
        try:
            while todo:
                left = deadline - time.monotonic()
                if left <= 0:
                    ended = "timeout"
                    break
                ready, _, _ = select.select([r], [], [], left)
                if not ready:
                    continue
                data = os.read(r, 1 << 16)
                if not data:
                    break
                buffer += data
                if len(buffer) > MAX_FRAME_BYTES + 4:
                    ended = "too long"
                    break
                for frame in _frames(buffer):
                    i = int(frame["i"])
                    if i not in todo:
                        continue
                    todo.remove(i)
                    results[i] = decode(frame["r"])
                    if log is not None:
                        with contextlib.suppress(Exception):  # a malformed entry is dropped, never raised
                            log.replay(frame.get("log") or [])
                    if not is_async:
                        deadline = time.monotonic() + timeout_s
        except (ValueError, KeyError, TypeError, struct.error) as e:
            ended = f"sent a malformed result ({type(e).__name__})"
        finally:
            os.close(r)
            kill_tree(pid)
        if not todo:
            return
        failed = todo if is_async else todo[:1]
        for i in failed:
            if ended == "timeout":
                results[i] = (TIMEOUT, TimeoutError(f"reward call exceeded {timeout_s}s (its process was killed)"))
            elif ended == "too long":
                results[i] = (ERROR, ChildProcessDied(f"its result is longer than {MAX_FRAME_BYTES} bytes"))
            else:
                why = "its process ended without a result (out of memory, or a crash)" if ended == "died" else ended
                results[i] = (ERROR, ChildProcessDied(why))
        todo = [i for i in todo if i not in failed]


def chunks(indices: list[int], k: int) -> list[list[int]]:
    """indices cut into at most k contiguous runs of near-equal length (none empty)."""
    k = max(1, min(k, len(indices)))
    size, extra = divmod(len(indices), k)
    out, start = [], 0
    for j in range(k):
        end = start + size + (1 if j < extra else 0)
        out.append(indices[start:end])
        start = end
    return [c for c in out if c]


def run_isolated(
    calls: list[Callable[[], Any]],
    groups: list[int],
    is_async: dict[int, bool],
    timeout_s: float,
    workers: int,
    limits: dict[int, int] | None = None,
    log: CallLog | None = None,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
) -> list[tuple[str, Any]]:
    """Run every call in child processes (see the module docstring): (status, value or exception) per call.

    groups[i]: the function call i belongs to (one child runs calls of one function only); is_async[g]:
    that function's calls return coroutines; limits[g]: at most this many of its children at once
    (max_concurrency); workers: at most this many children per function."""
    results: list[tuple[str, Any] | None] = [None] * len(calls)
    threads = []
    for g in dict.fromkeys(groups):
        mine = [i for i, k in enumerate(groups) if k == g]
        width = min(workers, (limits or {}).get(g, workers))
        for chunk in chunks(mine, width):
            threads.append(
                threading.Thread(
                    target=_drive,
                    args=(calls, chunk, bool(is_async.get(g)), timeout_s, log, memory_mb, results),
                    name="grpolab-reward-process",
                    daemon=True,
                )
            )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r if r is not None else (ERROR, ChildProcessDied("no result")) for r in results]


__all__ = ["DEFAULT_MEMORY_MB", "ChildProcessDied", "chunks", "decode", "encode", "remote_error", "run_isolated"]
