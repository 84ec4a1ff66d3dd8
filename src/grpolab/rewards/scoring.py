"""Run reward functions over a batch: bounded time, bounded threads, failures become numbers.

`score_completions` calls every (reward function, completion) pair on a small thread pool. A call
that raises scores 0 (on_error="zero") or NaN (on_error="exclude": the caller drops NaN samples) and
increments `reward/errors`; a call that runs past `timeout_s` (or raises TimeoutError, as the math
and code verifiers do when their own budget runs out) does the same and increments
`reward/timeouts`. Nothing raises out of it.

A reward function may carry a `max_concurrency` attribute (the code reward sets it to the
sandbox's pool size, math to its worker pool): no more of its calls run at once, so waiting for
that pool does not count against a call's time. Python cannot kill a thread: a call abandoned at
its timeout keeps its thread until it returns, and a fresh thread takes its place so the batch
goes on.
The verifiers shipped here bound their own time (worker processes, sandbox), so that never piles up.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from grpolab.types import Example

log = logging.getLogger(__name__)

ON_ERROR = ("zero", "exclude")


@dataclass
class RewardFn:
    """A named, weighted reward function: fn(completion, example) -> float."""

    name: str
    weight: float
    fn: Callable[[str, Example], float]


@dataclass
class Scores:
    """Scores of one batch.

    total:   weighted sum per completion (NaN where on_error="exclude" dropped a sample).
    per_fn:  each function's raw (unweighted) score per completion.
    metrics: "reward/<name>/mean" per function (over non-NaN scores), "reward/errors" and
             "reward/timeouts" (counts in this call).
    """

    total: list[float]
    per_fn: dict[str, list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


_OK, _ERROR, _TIMEOUT = "ok", "error", "timeout"


def _run_calls(calls: list[Callable[[], float]], workers: int, timeout_s: float,
               groups: list[int] | None = None, limits: dict[int, int] | None = None) -> list[tuple[str, object]]:
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
                out: tuple[str, object] = (_OK, calls[i]())
            except TimeoutError as e:
                out = (_TIMEOUT, e)
            except BaseException as e:  # noqa: BLE001 - a verifier failure is a number
                out = (_ERROR, e)
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
                        results[i] = (_TIMEOUT, TimeoutError(f"reward call exceeded {timeout_s}s"))
                        done[0] += 1
                        progress[0] = now
                        spawn()  # the stuck thread keeps its slot; give the batch a new one
                    else:
                        next_deadline = min(next_deadline, deadline)
            if pending and now - progress[0] > timeout_s:  # nothing can start: a group is stuck
                for i in pending:
                    results[i] = (_TIMEOUT, TimeoutError("reward call could not start"))
                    done[0] += 1
                pending.clear()
                cond.notify_all()
            if done[0] < n:
                cond.wait(timeout=max(0.001, next_deadline - now))
    return results  # type: ignore[return-value]


def _to_score(value: object) -> float:
    """A reward function's return value as a finite float (else ValueError)."""
    if isinstance(value, bool):
        return float(value)
    x = float(value)  # type: ignore[arg-type]
    if not math.isfinite(x):
        raise ValueError(f"reward returned a non-finite value {x}")
    return x


def score_completions(fns: list[RewardFn], completions: list[str], examples: list[Example], *,
                      timeout_s: float = 10.0, workers: int = 4, on_error: str = "zero") -> Scores:
    """Score every completion with every reward function (see the module docstring)."""
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    n = len(completions)
    calls, groups, limits = [], [], {}
    for k, rf in enumerate(fns):
        limit = getattr(rf.fn, "max_concurrency", None)
        if isinstance(limit, int) and limit > 0:
            limits[k] = limit
        for c, ex in zip(completions, examples, strict=True):
            calls.append(lambda f=rf.fn, c=c, ex=ex: f(c, ex))
            groups.append(k)
    results = _run_calls(calls, workers, timeout_s, groups, limits) if calls else []

    fail_value = 0.0 if on_error == "zero" else math.nan
    per_fn: dict[str, list[float]] = {}
    errors = timeouts = 0
    for k, rf in enumerate(fns):
        scores = []
        for j in range(n):
            status, value = results[k * n + j]
            if status == _OK:
                try:
                    scores.append(_to_score(value))
                    continue
                except (TypeError, ValueError) as e:
                    status, value = _ERROR, e
            if status == _TIMEOUT:
                timeouts += 1
            else:
                errors += 1
                log.debug("reward %s failed on sample %d: %r", rf.name, j, value)
            scores.append(fail_value)
        per_fn[rf.name] = scores

    total = [sum(rf.weight * per_fn[rf.name][j] for rf in fns) for j in range(n)]
    metrics: dict[str, float] = {}
    for rf in fns:
        valid = [s for s in per_fn[rf.name] if not math.isnan(s)]
        metrics[f"reward/{rf.name}/mean"] = sum(valid) / len(valid) if valid else 0.0
    metrics["reward/errors"] = float(errors)
    metrics["reward/timeouts"] = float(timeouts)
    return Scores(total=total, per_fn=per_fn, metrics=metrics)
