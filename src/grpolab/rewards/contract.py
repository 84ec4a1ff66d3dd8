"""What TRL's GRPOTrainer gives a reward function besides the completions, and where the calls run.

TRL 1.16 (trl/trainer/grpo_trainer.py, `_calculate_rewards`) calls every reward function with

    prompts=..., completions=..., completion_ids=..., <each dataset column>=...,
    trainer_state=self.state, log_extra=self._log_completion_extra, log_metric=self._log_metric,
    environments=... (with an environment_factory)

- `completion_ids`: per completion, its token ids after the prompt (EOS included, no padding).
- `trainer_state`: transformers' `TrainerState`; `global_step` is the optimizer steps done when
  the batch is scored (0 for the first), `max_steps` the run's length, `epoch` the epochs of
  training data used so far (a float).
- `log_extra(column: str, values: list)`: one value per completion of the call, added to the
  completions table (grpolab: each completion's `extra` in samples.jsonl).
- `log_metric(name: str, value: float)`: one scalar, averaged over the step and logged as `name`
  (grpolab: metrics.jsonl).

Where the calls run (TRL: sync functions one after another on the trainer's thread; `async def`
functions, recognised by `is_async_callable`, awaited together with asyncio.gather on an event loop
in a daemon thread):

- `run_here(calls)`: in the calling thread, one after another (signal.alarm works there, as
  math-verify's timeouts need); a call cannot be stopped, so no timeout applies.
- `run_async(calls, timeout_s)`: every coroutine awaited together on one event loop in a daemon thread of
  its own; the calling thread waits at most `timeout_s` for them, whatever they do (block the loop,
  swallow their cancellation, await a thread that never ends): past it they are timeouts, and the loop
  and its threads are abandoned, never joined.
- `run_pooled(calls, workers, timeout_s)`: worker threads, each call with a timeout, for the rest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import math
import threading
import time
import typing
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

OK, ERROR, TIMEOUT = "ok", "error", "timeout"

RewardThread = Literal["auto", "main", "workers"]
"""The `reward_thread` setting: where synchronous reward calls run (see `placement`)."""
THREADS: tuple[str, ...] = typing.get_args(RewardThread)


def is_async_callable(fn: Callable) -> bool:
    """Whether calling `fn` returns a coroutine: TRL's test (trl.trainer.utils.is_async_callable):
    functools.partial unwrapped, and a callable object whose __call__ is async."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 (its __call__ method)


def placement(fn: Callable, thread: str, batch: bool = True) -> str:
    """Where one function's calls run: "async" (an async function, always awaited on the event loop),
    "main" (the calling thread) or "workers" (the worker threads, with a timeout).

    thread="auto": a TRL-form function (`batch`: completions in, one score each out) runs in the calling
    thread, as TRL runs them; one with a `max_concurrency` attribute was written for a pool (the built-in
    math and code rewards, a sandboxed reward of your own) and grpolab's per-sample `fn(completion,
    example)` keeps its timeout: both run on the workers. "main" and "workers" put every synchronous
    function there."""
    if thread not in THREADS:
        raise ValueError(f"reward_thread must be one of {', '.join(THREADS)}, got {thread!r}")
    if getattr(fn, "is_async", False) or is_async_callable(fn):
        return "async"
    if thread == "auto":
        return "main" if batch and getattr(fn, "max_concurrency", None) is None else "workers"
    return thread


def run_here(calls: list[Callable[[], Any]]) -> list[tuple[str, Any]]:
    """Each call in the calling thread, in order: (status, value or exception). A TimeoutError the call
    raises itself (math-verify's signal-based limit) is a timeout; KeyboardInterrupt and SystemExit pass."""
    out: list[tuple[str, Any]] = []
    for call in calls:
        try:
            out.append((OK, call()))
        except TimeoutError as e:
            out.append((TIMEOUT, e))
        except Exception as e:  # noqa: BLE001 - a reward's failure is a number
            out.append((ERROR, e))
    return out


def run_pooled(
    calls: list[Callable[[], float]],
    workers: int,
    timeout_s: float,
    groups: list[int] | None = None,
    limits: dict[int, int] | None = None,
) -> list[tuple[str, object]]:
    """Run the calls on up to `workers` threads; each gets `timeout_s` from its own start.

    groups/limits: at most limits[g] calls of group g run at once (a reward whose backend has a
    bounded pool, e.g. the sandbox, says so), so queueing for that pool does not eat a call's time.
    Returns (status, value_or_error) per call, status in ok / error / timeout. Calls that cannot
    start because their group is stuck for timeout_s are reported as timeouts too.
    """
    n = len(calls)
    groups = groups or [0] * n
    limits = limits or {}
    results: list[tuple[str, object] | None] = [None] * n
    started: list[float | None] = [None] * n
    pending: list[int] = list(range(n))
    running: dict[int, int] = {}
    cond = threading.Condition()
    done = [0]
    progress = [time.monotonic()]

    def next_call() -> int | None:
        for pos, i in enumerate(pending):
            g = groups[i]
            if running.get(g, 0) < limits.get(g, n):
                del pending[pos]
                running[g] = running.get(g, 0) + 1
                return i
        return None

    def worker() -> None:
        while True:
            with cond:
                while True:
                    if not pending:
                        return
                    i = next_call()
                    if i is not None:
                        break
                    cond.wait(0.1)
                started[i] = progress[0] = time.monotonic()
            try:
                out: tuple[str, object] = (OK, calls[i]())
            except TimeoutError as e:
                out = (TIMEOUT, e)
            except BaseException as e:  # noqa: BLE001 - a verifier failure is a number
                out = (ERROR, e)
            with cond:
                running[groups[i]] -= 1
                progress[0] = time.monotonic()
                cond.notify_all()
                if results[i] is None:
                    results[i] = out
                    done[0] += 1
                else:
                    return  # this call was abandoned at its timeout and replaced: retire

    def spawn() -> None:
        threading.Thread(target=worker, name="grpolab-reward", daemon=True).start()

    for _ in range(max(1, min(workers, n))):
        spawn()
    with cond:
        while done[0] < n:
            now = time.monotonic()
            next_deadline = now + 0.5
            for i in range(n):
                if results[i] is None and started[i] is not None:
                    deadline = started[i] + timeout_s
                    if now >= deadline:
                        results[i] = (TIMEOUT, TimeoutError(f"reward call exceeded {timeout_s}s"))
                        done[0] += 1
                        progress[0] = now
                        spawn()  # the stuck thread keeps its slot; give the batch a new one
                    else:
                        next_deadline = min(next_deadline, deadline)
            if pending and now - progress[0] > timeout_s:  # nothing can start: a group is stuck
                for i in pending:
                    results[i] = (TIMEOUT, TimeoutError("reward call could not start"))
                    done[0] += 1
                pending.clear()
                cond.notify_all()
            if done[0] < n:
                cond.wait(timeout=max(0.001, next_deadline - now))
    return results  # type: ignore[return-value]


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """An event loop's default executor (asyncio.to_thread, run_in_executor(None, ...)) whose every job runs
    on a daemon thread of its own, never joined: a job that outlives its call's timeout is abandoned, and
    neither the loop's end nor the interpreter's exit waits for it (a ThreadPoolExecutor by type only, as
    asyncio's set_default_executor asks; none of its pool threads is ever started)."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(e)

        threading.Thread(target=run, name="grpolab-reward-executor", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: the jobs' threads are daemons, abandoned at their call's timeout."""


def run_async(calls: list[Callable[[], Any]], timeout_s: float) -> list[tuple[str, Any]]:
    """Await every call's coroutine together (as TRL's asyncio.gather) on a new event loop in a daemon thread
    of its own, and wait at most timeout_s for them from here, whatever they do.

    The bound is kept by this (calling) thread, not by the loop: a coroutine that blocks the loop with
    synchronous work, one that swallows its CancelledError, or one awaiting a thread that never ends
    (asyncio.to_thread: the loop's executor is a DaemonExecutor, abandoned, never joined) is a timeout at
    timeout_s; its tasks are then cancelled and the loop's thread is left to end by itself. A call that
    does not return a coroutine is taken as it returned."""
    n = len(calls)
    results: list[tuple[str, Any] | None] = [None] * n
    lock = threading.Lock()
    finished = threading.Event()
    count = [0]
    tasks: list[asyncio.Task] = []

    def record(i: int, result: tuple[str, Any]) -> None:
        with lock:
            if results[i] is None:
                results[i] = result
                count[0] += 1
                if count[0] == n:
                    finished.set()

    async def one(i: int, call: Callable[[], Any]) -> None:
        try:
            value = call()
            if inspect.isawaitable(value):
                value = await value
            result: tuple[str, Any] = (OK, value)
        except TimeoutError as e:  # asyncio.TimeoutError on Python >= 3.11; the reward's own limit
            result = (TIMEOUT, e)
        except Exception as e:  # noqa: BLE001 - a reward's failure is a number
            result = (ERROR, e)
        record(i, result)

    loop = asyncio.new_event_loop()
    loop.set_default_executor(DaemonExecutor())

    async def every() -> None:
        tasks.extend(loop.create_task(one(i, c)) for i, c in enumerate(calls))
        await asyncio.wait(tasks)

    def loop_thread() -> None:
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(every())
        except BaseException as e:  # noqa: BLE001 - the loop itself failed: every call not done fails
            for i in range(n):
                record(i, (ERROR, e))
        finally:
            with contextlib.suppress(Exception):
                loop.close()  # its DaemonExecutor's shutdown does not wait

    if n:
        threading.Thread(target=loop_thread, name="grpolab-reward-async", daemon=True).start()
        finished.wait(timeout_s)
    late = TimeoutError(f"async reward call exceeded {timeout_s}s")
    for i in range(n):
        record(i, (TIMEOUT, late))
    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # closed in between: nothing left to cancel
            loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
    return results  # type: ignore[return-value]


class CallLog:
    """What reward functions logged during one scoring of N completions: `log_extra` columns (N values
    each, None where nothing was logged) and `log_metric` values (averaged per name). Thread-safe."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.extra: dict[str, list] = {}
        self.values: dict[str, list[float]] = defaultdict(list)
        self.journal: list[list] = []
        """Every call logged, in order (["extra", start, end, column, values], ["metric", name, value]): what a
        reward call run in a child process sends back (grpolab.rewards.isolated), replayed here."""
        self._lock = threading.Lock()

    def log_extra_for(self, start: int, end: int) -> Callable[[str, list], None]:
        """TRL's log_extra(column, values) for a call that scores completions start..end-1: one value each."""

        def log_extra(column: str, values: list) -> None:
            """Log extra columns to the completions table (one value per completion of this call)."""
            values = json.loads(json.dumps(list(values), default=str))  # as the completions table holds them
            if len(values) != end - start:
                raise ValueError(
                    f"log_extra({column!r}, ...): {len(values)} values for the {end - start} "
                    "completions of this call; give one value per completion"
                )
            with self._lock:
                col = self.extra.setdefault(str(column), [None] * self.n)
                col[start:end] = values
                self.journal.append(["extra", start, end, str(column), values])

        return log_extra

    def log_metric(self, name: str, value: float) -> None:
        """TRL's log_metric(name, value): a scalar, averaged over the step and logged as `name`."""
        x = float(value)
        with self._lock:
            self.values[str(name)].append(x)
            self.journal.append(["metric", str(name), x])

    def replay(self, entries: list) -> None:
        """Apply journal entries recorded by another copy of this log (a child process's)."""
        for entry in entries:
            if entry[0] == "extra":
                _, start, end, column, values = entry
                if isinstance(values, list) and len(values) == end - start and 0 <= start <= end <= self.n:
                    with self._lock:
                        self.extra.setdefault(str(column), [None] * self.n)[start:end] = values
                        self.journal.append(list(entry))
            elif entry[0] == "metric":
                self.log_metric(str(entry[1]), float(entry[2]))

    def metrics(self) -> dict[str, float]:
        """name -> the mean of the values logged under it (NaNs left out; NaN when none is finite)."""
        out = {}
        for name, xs in self.values.items():
            finite = [x for x in xs if not math.isnan(x)]
            out[name] = sum(finite) / len(finite) if finite else math.nan
        return out


def trainer_state(
    global_step: int, max_steps: int, epoch: float = 0.0, num_train_epochs: int = 0, train_batch_size: int | None = None
) -> Any:
    """transformers' TrainerState with the fields TRL's reward functions read (global_step, max_steps,
    epoch); imported here, when a run makes one, not when grpolab.rewards is imported."""
    from transformers import TrainerState

    return TrainerState(
        global_step=global_step,
        max_steps=max_steps,
        epoch=epoch,
        num_train_epochs=num_train_epochs,
        train_batch_size=train_batch_size,
    )


__all__ = [
    "CallLog",
    "DaemonExecutor",
    "RewardThread",
    "THREADS",
    "is_async_callable",
    "placement",
    "run_async",
    "run_here",
    "run_pooled",
    "trainer_state",
]
