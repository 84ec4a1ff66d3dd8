"""A reward function's return value as a score: a finite float, or None where a batch function does not apply.

Conversion runs in the scoring thread, under the call's timeout (grpolab.rewards.scoring): `scored` wraps a
per-sample call, `batched` a batch call (its list split into one result per completion, at most n + 1 items
read); an async function's coroutine is converted once awaited, on the event loop. What is not a finite
number is a BadScore saying what it was (None from a per-sample function too), which scoring counts in
`reward/errors` like a raise.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable

from grpolab.rewards.contract import ERROR, OK

MAX_SCORE = 1e6
"""Largest |score| a reward function's value keeps; beyond it the score is clipped to ±MAX_SCORE and counted
(reward/clipped). The update computes in float32, where one -1e300 would be -inf and void the whole step's
update; within ±1e6 the advantages and the loss of any estimator stay finite."""


def clip_score(x: float) -> tuple[float, bool]:
    """(x clipped to [-MAX_SCORE, MAX_SCORE], whether it was clipped): min(max(x, -M), M)."""
    if x > MAX_SCORE:
        return MAX_SCORE, True
    if x < -MAX_SCORE:
        return -MAX_SCORE, True
    return x, False


class BadScore(ValueError):
    """A reward function returned something that is not a finite number."""


def to_score(value: object) -> float:
    """A reward function's return value as a finite float (else BadScore saying what it was).

    Runs in the scoring thread, under the call's timeout: a `__float__` that raises (RuntimeError,
    MemoryError) fails this call like a raise in the function; one that never returns is a timeout.
    """
    if isinstance(value, bool):
        return float(value)
    if value is None:
        raise BadScore("returned None")
    if isinstance(value, (str, bytes, list, tuple, dict, set)):
        raise BadScore(f"returned a {type(value).__name__}, not a number")
    try:
        x = float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise BadScore(f"returned a {type(value).__name__} too large for a float") from None
    except (TypeError, ValueError):
        raise BadScore(f"returned a {type(value).__name__}, not a number") from None
    if math.isnan(x):
        raise BadScore("returned NaN")
    if math.isinf(x):
        raise BadScore(f"returned {x}")
    return x


def scored(f: Callable[[], object]) -> Callable[[], float]:
    """A per-sample call whose value is converted to a score in the scoring thread."""
    return _converting(f, to_score)


def batch_results(value: object, n: int) -> list[tuple[str, object]]:
    """Split one batch call's return value into n per-completion results: (ok, float), (ok, None)
    for "does not apply", or (error, BadScore). At most n + 1 items are ever read, so an endless
    iterable is a wrong length, not an endless list. Runs in the scoring thread (see batched)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        err = BadScore(f"returned a {type(value).__name__}, not a list of {n} scores")
        return [(ERROR, err)] * n
    items = list(itertools.islice(iter(value), n + 1))  # type: ignore[call-overload]
    if len(items) != n:
        err = BadScore(f"returned {'more than ' + str(n) if len(items) > n else len(items)} scores for {n} completions")
        return [(ERROR, err)] * n
    out: list[tuple[str, object]] = []
    for v in items:
        if v is None:
            out.append((OK, None))
            continue
        try:
            out.append((OK, to_score(v)))
        except BadScore as e:
            out.append((ERROR, e))
    return out


def batched(f: Callable[[], object], n: int) -> Callable[[], object]:
    """A batch call whose value is split and converted in the scoring thread, under its timeout (an async
    function's coroutine is converted once awaited, on the event loop)."""
    return _converting(f, lambda value: batch_results(value, n))


def _converting(f: Callable[[], object], convert: Callable[[object], object]) -> Callable[[], object]:
    """f, its value passed through convert: at once, or after the await when f returns a coroutine."""

    def call() -> object:
        value = f()
        if inspect.isawaitable(value):

            async def converted() -> object:
                return convert(await value)

            return converted()
        return convert(value)

    return call
