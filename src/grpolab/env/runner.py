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

Each tool call runs through timeouts.call_with_timeout: on a daemon thread of its own, waited for at most
`timeout_s` (a thread that cannot be stopped is counted in `stuck_calls()`, and while env.max_stuck_calls
of them still run, a call on a thread is not started: the model reads why and a `stuck` event is
counted), or with `ToolRunner(process=True)` (env.tool_process) in a forked child process killed at its
limit (grpolab.env.process).

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

import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpolab.env.base import EnvConfigError, Reply
from grpolab.env.budget import TrajectoryClock, current_clock, trajectory_clock
from grpolab.env.calls import ParseError, ToolCall
from grpolab.env.process import available as process_available
from grpolab.env.schema import prepare_arguments
from grpolab.env.timeouts import Pending, Raised, StuckCallsError, ToolText, call_with_timeout, crowded, short_error
from grpolab.util.text import safe_data

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESULT_CHARS = 4000
STEP_GRACE_S = 1.0
"""How long run_turns waits past the step's tool-time budget for a step to hand back its reply (its calls
were all cut at the budget; this is time to return)."""


def cut(text: str, max_chars: int) -> tuple[str, int]:
    """`text` cut to `max_chars` with a visible marker; (text, number of characters removed)."""
    if len(text) <= max_chars:
        return text, 0
    removed = len(text) - max_chars
    return f"{text[:max_chars]}...[truncated {removed} chars]", removed


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
                "content": f"Error: could not parse the tool call: {item.reason}. Write {item.expected}.",
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
    steps = [Pending(_safe_step, env, text, clock) for env, text, clock in zip(envs, texts, clocks)]
    deadline = None if limit_s is None else time.monotonic() + limit_s
    return [
        s.value
        if s.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        else _failed_step(None, kind)
        for s in steps
    ]
