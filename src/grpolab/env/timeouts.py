"""One tool call under a time limit: on a daemon thread, in the calling thread, or in a child process.

`call_with_timeout(fn, arguments, timeout_s)` runs `fn(**arguments)` and returns its result as text
(`result_text`: strings as they are, else JSON, else str(); a list also kept as the value it was,
ToolText), a `Raised` carrying what it raised, or None when it did not return in time. The result is
converted on the call's own thread, so that a hostile __str__ or a huge json.dumps is covered by the
timeout too. grpolab.env.runner turns these outcomes into the model's tool messages; the environment
adapters (adapters.py, openenv.py, skyrl.py) and rollout.py run an environment's own step or
factory through it.

Each call runs on a daemon thread of its own, waited for at most `timeout_s`. A Python thread
cannot be killed: a tool that hangs keeps its thread until it returns (if ever). The call still gets
its error message and the trajectory goes on; `stuck_calls()` says how many timed-out calls are still
running. Their threads are daemons, so a stuck tool never keeps the trainer from exiting at the end of
a run (a pool's worker threads would: Python joins them at exit). A tool that may hang for good
should enforce its own limit (the `python` tool of builtin.py runs code in the sandbox, which kills it).
A tool that is one long C operation holding the GIL does not even let its waiter wake at the timeout:
`process=True` (env.tool_process) runs each call in a forked child process instead, killed at its
limit (grpolab.env.process). While `limit_stuck_calls`'s cap (env.max_stuck_calls) of stuck calls
still run, a call on a thread is not started (a `Raised` carrying StuckCallsError).

Every call runs inside budget.in_call: the tool sees its deadline (budget.call_deadline) and counts
its own events (budget.note_event).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from grpolab.env.budget import in_call
from grpolab.env.process import remote_call, run_in_process

MAX_ERROR_CHARS = 300
"""Longest exception text quoted back to the model."""

DEFAULT_MAX_STUCK = 4
"""Most calls that ran past their limit may still be running (in threads) before new ones are refused."""

_stuck_lock = threading.Lock()
_stuck = 0
_max_stuck = DEFAULT_MAX_STUCK


def stuck_calls() -> int:
    """Calls that timed out and are still running (their threads cannot be killed)."""
    return _stuck


def limit_stuck_calls(n: int) -> None:
    """Set the cap on stuck calls (env.max_stuck_calls; process-wide, as the count is): while stuck_calls()
    is at it, a call that would run on a thread is not started (StuckCallsError)."""
    global _max_stuck
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise ValueError(f"the cap on stuck tool calls must be an integer >= 1, got {n!r}")
    _max_stuck = n


def crowded() -> str | None:
    """Why no call may start on a thread now (the stuck calls are at their cap), else None."""
    n = _stuck
    if n < _max_stuck:
        return None
    return (
        f"{n} earlier calls that ran past their time limit are still running (at most {_max_stuck} may be; "
        "their threads cannot be stopped)"
    )


class StuckCallsError(RuntimeError):
    """A call not started because the stuck calls are at their cap (env.max_stuck_calls)."""


def _add_stuck(k: int) -> None:
    global _stuck
    with _stuck_lock:
        _stuck += k


class Pending:
    """fn(*args) running on a daemon thread: wait(timeout) -> (finished, value). A call still running
    when its waiter gives up is counted in stuck_calls() until it returns. The thread runs in a copy of
    the caller's context (contextvars), so a trajectory's budget is seen by its calls."""

    def __init__(self, fn: Callable, *args: Any) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False
        self.value: Any = None

        def run() -> None:
            self.value = fn(*args)
            with self._lock:
                self._done.set()
                if self._abandoned:
                    _add_stuck(-1)

        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(run,), name="grpolab-env", daemon=True).start()

    def wait(self, timeout_s: float | None) -> bool:
        """True if the call finished within timeout_s (None: wait for it); else it is counted as stuck."""
        if self._done.wait(timeout_s):
            return True
        with self._lock:
            if self._done.is_set():
                return True
            self._abandoned = True
            _add_stuck(1)
        return False


def to_text(result: Any) -> str:
    """A tool's result as the text of a tool message: strings as they are, else JSON, else str()."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(result)


class ToolText(str):
    """The text of a tool's result that also carries the list the tool returned (`value`): the model reads
    the text, the reward functions the list (Reply.values), as TRL passes a list result through."""

    value: Any

    def __new__(cls, text: str, value: Any) -> ToolText:
        out = super().__new__(cls, text)
        out.value = value
        return out


def result_text(result: Any) -> str:
    """to_text(result); for a list, a ToolText carrying a copy of it as the tool returned it."""
    text = to_text(result)
    if not isinstance(result, list):
        return text
    try:
        kept = copy.deepcopy(result)
    except Exception:  # noqa: BLE001 - an object that cannot be copied: the list as it is
        kept = result
    return ToolText(text, kept)


def short_error(e: BaseException) -> str:
    """`Type: message` of an exception, bounded (its str() may itself fail or be huge)."""
    try:
        msg = str(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        msg = ""
    msg = msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


class Raised:
    """A tool's exception, carried back from its worker thread as a value (from a child process, only its
    description: `text`)."""

    def __init__(self, error: BaseException | None, text: str | None = None) -> None:
        self.error = error
        self.text = text

    def describe(self) -> str:
        """`Type: message`, bounded (short_error)."""
        return self.text if self.text is not None else short_error(self.error)


def _invoke(
    fn: Callable, arguments: dict, convert: bool = True, deadline: float | None = None, events: Counter | None = None
) -> Any:
    """Run one tool in a worker thread and (with `convert`) turn its result into text there.

    Conversion happens here so that a hostile __str__ or a huge json.dumps is covered by the
    timeout too. Every exception (SystemExit included) is returned, never raised, so that the
    waiting thread can tell the tool's failures from its own interruption. The tool sees its
    deadline and counts its own events through grpolab.env.budget.
    """
    try:
        with in_call(deadline, events if events is not None else Counter()):
            result = fn(**arguments)
            if inspect.isawaitable(result):  # an async tool (TRL accepts them): run it to completion here
                result = asyncio.run(_await(result))
            return result_text(result) if convert else result
    except BaseException as e:  # noqa: BLE001 - the tool's failure is the model's error message
        return Raised(e)


async def _await(awaitable):
    """asyncio.run needs a coroutine; this wraps any awaitable."""
    return await awaitable


def call_with_timeout(
    fn: Callable,
    arguments: dict,
    timeout_s: float,
    *,
    convert: bool = True,
    events: Counter | None = None,
    here: bool = False,
    process: bool = False,
) -> Any:
    """Run `fn(**arguments)` on a daemon thread: its text (or, without `convert`, its value), a
    `Raised` carrying the exception it raised, or None if it did not return within timeout_s.
    `events` receives the events the tool counts itself (budget.note_event).
    here: run it in the calling thread instead, waiting as long as it takes (env.tool_thread=main);
    the tool still sees its deadline (budget.call_deadline) and may stop itself there.
    process: run it in a forked child process, killed at timeout_s (grpolab.env.process; text only).
    On a thread, while the stuck calls are at their cap (limit_stuck_calls), the call is not started: a
    `Raised` carrying StuckCallsError."""
    deadline = time.monotonic() + timeout_s
    if process:
        if not convert:
            raise ValueError("call_with_timeout: a call in a child process returns text (convert=True)")
        own: Counter = Counter()
        out = run_in_process(
            functools.partial(remote_call, functools.partial(_invoke, fn, arguments, True, deadline, own), fn, own),
            timeout_s,
        )
        if out is None:
            return None
        kind, text, counted = out
        if events is not None:
            events.update(counted)
        if kind == "ok":
            return text
        return Raised(None, text if kind == "raised" else f"ToolProcessError: {text}")
    if here:
        return _invoke(fn, arguments, convert, deadline, events)
    why = crowded()
    if why:
        return Raised(StuckCallsError(why))
    call = Pending(_invoke, fn, arguments, convert, deadline, events)
    return call.value if call.wait(timeout_s) else None
