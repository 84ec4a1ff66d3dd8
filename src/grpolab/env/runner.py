"""Run the tool calls of model turns: every failure becomes an error message and a counted event.

`ToolRunner.run(items)` runs one turn's parsed calls in the order they were written and returns a
Reply with one `tool` message per call. What can go wrong, the message the model reads, and the
event counted (Reply.events):

    a block that does not parse          "Error: could not parse the tool call: ..."   parse
    a tool the environment does not have "Error: unknown tool 'x'. Available: ..."     unknown_tool
    arguments that do not fit the schema "Error: bad arguments for tool 'x': ..."      bad_arguments
    a tool that raises                   "Error: tool 'x' raised ValueError: ..."      exception
    a tool that runs past timeout_s      "Error: tool 'x' timed out after 2 s ..."     timeout
    a result longer than max_result_chars  the result, cut, ending "...[truncated N chars]"  truncated
    a tool-time budget spent (budget.py) "Error: tool 'x' was not run: ... budget ..."  budget
    text with lone UTF-16 surrogates     the text, repaired (grpolab.util.text)        invalid_unicode

Text is made safe once, where it crosses into the trainer: a call's name and arguments when the
model's JSON is parsed (calls.py), and every string of a Reply (messages, event and tool names) when
an environment's step returns it (`_safe_step`, which every environment's step goes through in
run_turns): whatever a tool returns or raises, and whatever a user's environment answers, reaches
the tokenizer, the metrics and samples.jsonl as valid Unicode. Tools may count events of their own
(budget.note_event), which land in the same Reply.events.

A result that is not a string is converted: `json.dumps` when it can be, else `str`. Calls per
tool name are counted in Reply.calls for the tools the environment offers (a name the model made up
is counted only as `unknown_tool`, so that hostile names cannot grow the metrics without bound).

Each tool call runs on a daemon thread of its own, waited for at most `timeout_s`. A Python thread
cannot be killed: a tool that hangs keeps its thread until it returns (if ever). The call still gets
its error message and the trajectory goes on; `stuck_calls()` says how many timed-out calls are still
running. Their threads are daemons, so a stuck tool never keeps the trainer from exiting at the end of
a run (a pool's worker threads would: Python joins them at exit). A tool that may hang for good
should enforce its own limit (the `python` tool of builtin.py runs code in the sandbox, which kills it).
A tool that is one long C operation holding the GIL does not even let its waiter wake at the timeout:
`ToolRunner(process=True)` (env.tool_process) runs each call in a forked child process instead, killed at
its limit (grpolab.env.process). While `limit_stuck_calls`'s cap (env.max_stuck_calls) of stuck calls
still run, a call on a thread is not started: the model reads why and a `stuck` event is counted.

`run_turns(envs, turn_texts)` steps many trajectories' environments concurrently (one daemon thread
per trajectory); within a trajectory calls run one after another, in order, because a stateful
environment's tools may depend on each other. A step therefore takes at most (calls in the turn,
capped by calls.MAX_CALLS) x timeout_s, and at most the step's tool-time budget when run_turns is
given the trajectories' clocks (budget.py): every call's wait is then cut to what is left of its
trajectory's budget and of the step's, and the tool sees that deadline (budget.call_deadline).

Where a synchronous tool runs is a choice (env.tool_thread): `ToolRunner(here=True)` runs it in the
calling thread with no timeout, and `run_turns(sequential=True)` steps the trajectories one after
another in the calling thread, so that a tool written for TRL (which calls sync tools on the main
thread) may use `signal.alarm` for its own limit. Async tools keep their daemon thread and timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpolab.env.base import EnvConfigError, Reply
from grpolab.env.budget import TrajectoryClock, current_clock, in_call, trajectory_clock
from grpolab.env.calls import ParseError, ToolCall
from grpolab.env.process import available as process_available
from grpolab.env.process import remote_call, run_in_process
from grpolab.env.schema import prepare_arguments
from grpolab.util.text import safe_data

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESULT_CHARS = 4000
MAX_ERROR_CHARS = 300
"""Longest exception text quoted back to the model."""
STEP_GRACE_S = 1.0
"""How long run_turns waits past the step's tool-time budget for a step to hand back its reply (its calls
were all cut at the budget; this is time to return)."""

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


class _Pending:
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


def cut(text: str, max_chars: int) -> tuple[str, int]:
    """`text` cut to `max_chars` with a visible marker; (text, number of characters removed)."""
    if len(text) <= max_chars:
        return text, 0
    removed = len(text) - max_chars
    return f"{text[:max_chars]}...[truncated {removed} chars]", removed


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
    call = _Pending(_invoke, fn, arguments, convert, deadline, events)
    return call.value if call.wait(timeout_s) else None


class ToolRunner:
    """Runs parsed calls against a set of tools (name -> function) and their schemas.

    functions: the callables, by the name the model calls them with.
    schemas: name -> OpenAI function schema, used to check arguments (a tool without a schema
        gets its arguments unchecked).
    timeout_s: longest wait for one call (a tool may set its own as a `timeout_s` attribute).
    max_result_chars: longer results are cut, marked.
    here: run synchronous tools in the calling thread, without a timeout (env.tool_thread=main).
    process: run every call in a forked child process, killed at its limit (env.tool_process; this
        takes precedence over `here`).
    """

    def __init__(
        self,
        functions: Mapping[str, Callable],
        schemas: Mapping[str, dict] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
        process: bool = False,
    ) -> None:
        if process and not process_available():
            raise EnvConfigError(
                "running tool calls in a child process needs os.fork (POSIX); "
                "set env.tool_process=false on this platform"
            )
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not (isinstance(max_result_chars, int) and max_result_chars > 0):
            raise ValueError(f"max_result_chars must be a positive integer, got {max_result_chars!r}")
        self.functions = dict(functions)
        self.schemas = dict(schemas or {})
        self.timeout_s = float(timeout_s)
        self.max_result_chars = max_result_chars
        self.here = here
        self.process = process

    def run(self, items: Sequence[ToolCall | ParseError]) -> Reply:
        """Run the calls in order; one tool message per item, errors included. done is False."""
        reply = Reply(parsed=list(items))
        for item in items:
            self.add(reply, self.run_one(item, reply.events, reply.calls))
        return reply

    @staticmethod
    def add(reply: Reply, message: dict) -> None:
        """Append a call's message to the reply; a list result's value goes to reply.values (the rewards'),
        its text stays the message's content (the model's)."""
        if isinstance(message.get("content"), ToolText):
            reply.values[len(reply.messages)] = message["content"].value
            message["content"] = str(message["content"])
        reply.messages.append(message)

    def run_one(self, item: ToolCall | ParseError, events: Counter, calls: Counter) -> dict:
        """One call's tool message; failures are counted in `events`, calls per tool in `calls`."""
        if isinstance(item, ParseError):
            events["parse"] += 1
            return {
                "role": "tool",
                "content": f"Error: could not parse the tool call: {item.reason}. "
                'Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.',
            }
        if getattr(item, "repaired", 0):
            events["invalid_unicode"] += 1
        name = item.name
        fn = self.functions.get(name)
        if fn is None:
            events["unknown_tool"] += 1
            available = ", ".join(sorted(self.functions)[:30]) or "none"
            return {
                "role": "tool",
                "name": name[:100],
                "content": f"Error: unknown tool {name[:100]!r}. Available tools: {available}.",
            }
        calls[name] += 1
        arguments, err = (item.arguments, None)
        if name in self.schemas:
            arguments, err = prepare_arguments(self.schemas[name], item.arguments)
        if err:
            events["bad_arguments"] += 1
            return {"role": "tool", "name": name, "content": f"Error: bad arguments for tool {name!r}: {err}."}
        return {"role": "tool", "name": name, "content": self._result(name, fn, arguments, events)}

    def timeout_for(self, fn: Callable) -> float:
        """The wait for one call: the tool's own `timeout_s` attribute if it sets one, else the runner's.

        A tool that queues for a shared resource (the sandbox's slots) declares a longer wait
        than a pure function needs.
        """
        own = getattr(fn, "timeout_s", None)
        if isinstance(own, (int, float)) and not isinstance(own, bool) and own > 0:
            return float(own)
        return self.timeout_s

    def _result(self, name: str, fn: Callable, arguments: dict, events: Counter) -> str:
        """The content of the tool message for one valid call, within the trajectory's budget (if any)."""
        timeout_s = self.timeout_for(fn)
        clock = current_clock()
        left = clock.left() if clock is not None else timeout_s
        if left <= 0:
            events["budget"] += 1
            return f"Error: tool {name!r} was not run: {clock.spent()}. Give your final answer now."
        wait = min(timeout_s, left)
        here = self.here and not inspect.iscoroutinefunction(fn)
        why = None if (self.process or here) else crowded()
        if why:
            events["stuck"] += 1
            return f"Error: tool {name!r} was not run: {why}. Give your final answer now."
        own: Counter = Counter()
        t0 = time.monotonic()
        out = call_with_timeout(fn, arguments, wait, events=own, here=here, process=self.process)
        if clock is not None:
            clock.charge(time.monotonic() - t0)
        if out is None:
            if wait < timeout_s:
                events["budget"] += 1
                return (
                    f"Error: tool {name!r} was stopped after {wait:.3g} s: {clock.spent()}. Give your final answer now."
                )
            events["timeout"] += 1
            fate = "was stopped" if self.process else "was abandoned"
            return f"Error: tool {name!r} timed out after {timeout_s:g} s and {fate}; try a simpler call."
        events.update(own)  # the call has returned: its own counter is no longer written to
        if isinstance(out, Raised) and isinstance(out.error, StuckCallsError):  # the cap was reached meanwhile
            events["stuck"] += 1
            return f"Error: tool {name!r} was not run: {out.error}. Give your final answer now."
        if isinstance(out, Raised):
            events["exception"] += 1
            return f"Error: tool {name!r} raised {out.describe()}"
        text, removed = cut(out, self.max_result_chars)
        if removed:
            events["truncated"] += 1
        return ToolText(text, out.value) if isinstance(out, ToolText) else text


def _failed_step(error: BaseException | None, kind: str = "timeout") -> Reply:
    """The Reply of an environment whose step raised (error) or did not return in time (None; counted
    as `kind`: timeout, or budget when the step's tool-time budget ran out)."""
    if error is None:
        return Reply(
            messages=[{"role": "user", "content": "Error: the environment did not answer in time."}],
            done=True,
            events=Counter({kind: 1}),
        )
    return Reply(
        messages=[{"role": "user", "content": f"Error: the environment failed: {short_error(error)}"}],
        done=True,
        events=Counter(exception=1),
    )


def safe_reply(reply: Reply) -> Reply:
    """The Reply with every string in it made valid Unicode (grpolab.util.text): messages, event kinds and
    tool names; each repaired string counts one `invalid_unicode` event."""
    messages, a = safe_data(reply.messages)
    events, b = safe_data(dict(reply.events))
    calls, c = safe_data(dict(reply.calls))
    values, d = safe_data(reply.values)
    if a + b + c + d:
        reply.messages, reply.events, reply.calls, reply.values = messages, Counter(events), Counter(calls), values
        reply.events["invalid_unicode"] += a + b + c + d
    return reply


def _safe_step(env: Any, text: str, clock: TrajectoryClock | None = None) -> Reply:
    """env.step(text) under the trajectory's tool-time budget, its Reply made safe (safe_reply); a raising
    step is turned into a final Reply (the trajectory ends)."""
    try:
        with trajectory_clock(clock):
            reply = env.step(text)
    except Exception as e:  # noqa: BLE001 - a bug in a user's environment ends its trajectory only
        log.warning("environment %s: step raised %s", type(env).__name__, ascii(short_error(e)))
        reply = _failed_step(e)
    if not isinstance(reply, Reply):
        reply = _failed_step(TypeError(f"{type(env).__name__}.step returned {type(reply).__name__}, not a Reply"))
    return safe_reply(reply)


def run_turns(
    envs: Sequence[Any],
    turn_texts: Sequence[str],
    *,
    step_timeout_s: float | None = None,
    clocks: Sequence[TrajectoryClock] | None = None,
    sequential: bool = False,
) -> list[Reply]:
    """Step every trajectory's environment with its model turn, concurrently; Replies in order.

    Each tool call inside a step has its own timeout (the environment's runner). step_timeout_s,
    if given, bounds the wait for the whole batch: a step still running then gets a final
    Reply with a `timeout` event (for environments of unknown code, whose step may hang).
    clocks: one per environment, their tool-time budgets (budget.ToolBudget.clocks; they share one
    step clock). The wait counts against the step's budget; a step still running STEP_GRACE_S after
    that budget is spent gets a final Reply with a `budget` event.
    sequential: step them one after another in the calling thread (env.tool_thread=main); the budgets
    still cut each call's wait, but a step that hangs in the calling thread cannot be stopped.
    """
    if len(envs) != len(turn_texts) or (clocks is not None and len(clocks) != len(envs)):
        raise ValueError(
            f"run_turns: {len(envs)} environments but {len(turn_texts)} turns"
            + (f" and {len(clocks)} clocks" if clocks is not None else "")
        )
    if sequential:
        return [
            _safe_step(env, text, clock) for env, text, clock in zip(envs, turn_texts, clocks or [None] * len(envs))
        ]
    if not clocks:
        return _step_all(envs, turn_texts, [None] * len(envs), step_timeout_s, "timeout")
    with clocks[0].step.waiting() as step:
        budget_s = max(0.0, step.left()) + STEP_GRACE_S
        kind = "budget" if step_timeout_s is None or budget_s < step_timeout_s else "timeout"
        return _step_all(envs, turn_texts, list(clocks), min(budget_s, step_timeout_s or budget_s), kind)


def _step_all(envs: Sequence[Any], texts: Sequence[str], clocks: list, limit_s: float | None, kind: str) -> list[Reply]:
    """run_turns' work: each step on a thread of its own (none for one step without a limit)."""
    if len(envs) == 1 and limit_s is None:  # no thread hop for a single trajectory
        return [_safe_step(envs[0], texts[0], clocks[0])]
    steps = [_Pending(_safe_step, env, text, clock) for env, text, clock in zip(envs, texts, clocks)]
    deadline = None if limit_s is None else time.monotonic() + limit_s
    return [
        s.value
        if s.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        else _failed_step(None, kind)
        for s in steps
    ]
