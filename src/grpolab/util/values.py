"""Type-strict comparison of plain values, shared by the verifiers (code, tool calls).

Plain values are None, bool, int, float, str, bytes, complex, list, tuple, set, frozenset and dict,
nested. This module runs no model code and imports nothing from the sandbox, so verifiers that
only compare data (tool calls) do not pull the sandbox in.

Values decoded from an untrusted source (a sandboxed candidate) may carry `PlainSet` and
`PlainDict` instead of set and dict: their items are kept as a sequence and are never put in a hash
table, so a crafted set of integers that all hash alike cannot stall the grader. Set and dict
comparison here never hashes the untrusted side either: both sides are turned into canonical,
self-delimiting strings and compared sorted (O(n log n), whatever the hashes).
"""

from __future__ import annotations

import math
from typing import Any


class PlainSet:
    """A set (or frozenset) decoded from untrusted data: its items, unhashed, in the order received."""

    __slots__ = ("frozen", "items")

    def __init__(self, items: tuple, frozen: bool = False) -> None:
        self.items = tuple(items)
        self.frozen = frozen

    def __repr__(self) -> str:
        return f"{'frozenset' if self.frozen else 'set'}({list(self.items)!r})"


class PlainDict:
    """A dict decoded from untrusted data: its (key, value) pairs, unhashed, in insertion order."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: tuple) -> None:
        self.pairs = tuple(pairs)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self.pairs) + "}"


_SET_TYPES = (set, frozenset, PlainSet)
_DICT_TYPES = (dict, PlainDict)


def _set_items(x) -> tuple:
    return x.items if type(x) is PlainSet else tuple(x)


def _dict_pairs(x) -> tuple:
    return x.pairs if type(x) is PlainDict else tuple(x.items())


def canonical(x: Any) -> str:
    """A canonical, self-delimiting string for a plain value (equal values, equal strings).

    Numbers: an integral finite float is written like the int it equals (2.0 and 2 are one set
    element, as in Python); bool is not a number here (True and 1 differ). Sets and dicts sort
    their items' strings. Raises TypeError on anything that is not plain data.
    """
    t = type(x)
    if x is None:
        return "N"
    if t is bool:
        return "b1" if x else "b0"
    if t is int:
        return f"i{x:x};"
    if t is float:
        if math.isfinite(x) and x == int(x):
            return f"i{int(x):x};"
        return f"f{x.hex()};"
    if t is complex:
        return "c" + canonical(x.real) + canonical(x.imag)
    if t is str:
        return f"s{len(x)}:{x}"
    if t is bytes:
        return f"y{len(x)}:{x.hex()}"
    if t is list or t is tuple:
        return ("l" if t is list else "t") + f"{len(x)}(" + "".join(canonical(v) for v in x) + ")"
    if t in _SET_TYPES:
        items = sorted(canonical(v) for v in _set_items(x))
        return f"S{len(items)}(" + "".join(items) + ")"
    if t in _DICT_TYPES:
        pairs = sorted(canonical(k) + canonical(v) for k, v in _dict_pairs(x))
        return f"D{len(pairs)}(" + "".join(pairs) + ")"
    raise TypeError(f"not plain data: {t.__name__}")


def _numbers_equal(expected, actual, rel_tol: float) -> bool:
    if type(expected) is int:
        # An int is graded exactly: an int equal to it, or a float whose value is exactly that
        # integer (Python compares int and float exactly: 2**53 + 1 != float(2**53 + 1)). No
        # tolerance, not even near 0: 1e-13 is not 0, math.gamma(21) is not 20!.
        if type(actual) is float:
            return math.isfinite(actual) and actual == expected
        return expected == actual
    fe, fa = type(expected) is float, type(actual) is float
    if (fe and not math.isfinite(expected)) or (fa and not math.isfinite(actual)):
        if (fe and math.isnan(expected)) or (fa and math.isnan(actual)):
            return fe and fa and math.isnan(expected) and math.isnan(actual)
        return fe and fa and expected == actual  # inf only equals the same inf
    try:
        return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=1e-12)
    except OverflowError:  # an int beyond float range is never close to a finite float
        return False


def plain_equal(expected: Any, actual: Any, rel_tol: float = 1e-9) -> bool:
    """Type-strict equality of plain values; never raises (anything odd is simply unequal).

    bool only equals bool. An expected int equals an int of the same value or a float exactly
    equal to it (no tolerance); an expected float equals an int or float within `rel_tol` (and an
    absolute 1e-12 around 0); an int too large for a float is unequal to every float. (Set
    elements and dict keys compare exactly, as Python's do.) str, bytes, list, tuple must match in
    type and, recursively, in content; set equals set or frozenset; dict equals dict (order
    ignored, values compared recursively with the same rules).
    """
    try:
        return _equal(expected, actual, rel_tol)
    except (TypeError, ValueError, OverflowError, RecursionError, MemoryError):
        return False


def _equal(expected, actual, rel_tol) -> bool:
    te, ta = type(expected), type(actual)
    if te is bool or ta is bool:
        return te is ta and expected == actual
    if te in (int, float) and ta in (int, float):
        return _numbers_equal(expected, actual, rel_tol)
    if te in _SET_TYPES and ta in _SET_TYPES:
        e, a = _set_items(expected), _set_items(actual)
        return len(e) == len(a) and sorted(map(canonical, e)) == sorted(map(canonical, a))
    if te in _DICT_TYPES and ta in _DICT_TYPES:
        e, a = _dict_pairs(expected), _dict_pairs(actual)
        if len(e) != len(a):
            return False
        es = sorted(((canonical(k), i) for i, (k, _) in enumerate(e)))
        as_ = sorted(((canonical(k), i) for i, (k, _) in enumerate(a)))
        if [k for k, _ in es] != [k for k, _ in as_]:
            return False
        if any(as_[j][0] == as_[j - 1][0] for j in range(1, len(as_))):
            return False  # a duplicated key: not a real dict
        return all(_equal(e[i][1], a[j][1], rel_tol) for (_, i), (_, j) in zip(es, as_))
    if te is not ta:
        return False
    if te is list or te is tuple:
        return len(expected) == len(actual) and all(_equal(x, y, rel_tol) for x, y in zip(expected, actual))
    if te is complex:
        return _numbers_equal(expected.real, actual.real, rel_tol) and _numbers_equal(
            expected.imag, actual.imag, rel_tol
        )
    if te in (str, bytes, type(None)):
        return expected == actual
    return False


def short_repr(x: Any, limit: int = 100) -> str:
    """repr() cut to `limit` characters that never raises (huge ints, odd objects)."""
    try:
        if type(x) is int and x.bit_length() > 1000:
            return f"<int of {x.bit_length()} bits>"
        s = repr(x)
    except Exception:  # noqa: BLE001 - a repr that raises must not fail the grading
        return f"<{type(x).__name__}>"
    return s if len(s) <= limit else s[: limit - 3] + "..."


__all__ = ["PlainDict", "PlainSet", "canonical", "plain_equal", "short_repr"]
