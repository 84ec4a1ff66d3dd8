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
- `run_async(calls, timeout_s)`: every coroutine awaited together on one event loop in a thread of
  its own, each bounded by `timeout_s` (asyncio.wait_for).
- grpolab.rewards.scoring's worker threads, with a timeout, for the rest.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
import threading
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


def run_async(calls: list[Callable[[], Any]], timeout_s: float) -> list[tuple[str, Any]]:
    """Await every call's coroutine together (asyncio.gather, as TRL) on a new event loop in a thread of its
    own, each bounded by timeout_s. A call that does not return a coroutine is taken as it returned."""

    async def one(call: Callable[[], Any]) -> tuple[str, Any]:
        try:
            value = call()
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(value, timeout_s)
            return OK, value
        except asyncio.TimeoutError as e:  # TimeoutError on Python >= 3.11
            return TIMEOUT, e if str(e) else TimeoutError(f"async reward call exceeded {timeout_s}s")
        except Exception as e:  # noqa: BLE001
            return ERROR, e

    async def every() -> list[tuple[str, Any]]:
        return list(await asyncio.gather(*(one(c) for c in calls)))

    results: list = []
    failure: list[BaseException] = []

    def loop_thread() -> None:
        try:
            results.extend(asyncio.run(every()))
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            failure.append(e)

    t = threading.Thread(target=loop_thread, name="grpolab-reward-async", daemon=True)
    t.start()
    t.join()
    if failure:
        return [(ERROR, failure[0])] * len(calls)
    return results


class CallLog:
    """What reward functions logged during one scoring of N completions: `log_extra` columns (N values
    each, None where nothing was logged) and `log_metric` values (averaged per name). Thread-safe."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.extra: dict[str, list] = {}
        self.values: dict[str, list[float]] = defaultdict(list)
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

        return log_extra

    def log_metric(self, name: str, value: float) -> None:
        """TRL's log_metric(name, value): a scalar, averaged over the step and logged as `name`."""
        x = float(value)
        with self._lock:
            self.values[str(name)].append(x)

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
    "RewardThread",
    "THREADS",
    "is_async_callable",
    "placement",
    "run_async",
    "run_here",
    "trainer_state",
]
