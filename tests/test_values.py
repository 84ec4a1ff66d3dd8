"""grpolab.util.values: type-strict comparison of plain values, without hashing untrusted data."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from grpolab.util.values import PlainDict, PlainSet, canonical, plain_equal, short_repr


def test_type_strict_rules():
    assert plain_equal(3, 3.0) and plain_equal(0.1 + 0.2, 0.3) and not plain_equal(3, 3.1)
    assert not plain_equal(True, 1) and not plain_equal(1, True) and plain_equal(False, False)
    assert not plain_equal([1, 2], (1, 2)) and plain_equal((1, [2]), (1, [2.0]))
    assert not plain_equal("1", 1) and not plain_equal(None, 0) and plain_equal(None, None)
    assert plain_equal(b"x", b"x") and not plain_equal(b"x", "x")
    assert plain_equal(1 + 2j, complex(1.0, 2.0))
    assert plain_equal(float("nan"), float("nan")) and not plain_equal(float("nan"), 1.0)


def test_sets_and_dicts_with_unhashed_values():
    assert plain_equal({1, 2}, frozenset({2, 1})) and plain_equal({1, 2}, PlainSet((2, 1)))
    assert plain_equal({2.0, (1, "a")}, PlainSet(((1, "a"), 2))) and not plain_equal({1}, PlainSet((True,)))
    assert not plain_equal({1, 2}, PlainSet((1, 1)))  # a "set" with a duplicate is not {1, 2}
    assert plain_equal({"a": 1, "b": [2]}, PlainDict((("b", [2.0]), ("a", 1))))
    assert not plain_equal({"a": 1, "b": 2}, PlainDict((("a", 1), ("a", 2))))  # duplicated key
    assert not plain_equal({"a": 1}, {"a": 1, "b": 2}) and not plain_equal({"a": 1}, {"a": 2})
    assert plain_equal(
        {frozenset({1}): {2: None}}, PlainDict(((PlainSet((1,), frozen=True), PlainDict(((2, None),))),))
    )


def test_canonical_is_self_delimiting():
    assert canonical(["ab", "c"]) != canonical(["a", "bc"]) and canonical((1,)) != canonical([1])
    assert canonical(2.0) == canonical(2) and canonical(True) != canonical(1)
    with pytest.raises(TypeError):
        canonical(object())


def test_hash_colliding_integers_compare_fast():
    p = (1 << 61) - 1
    items = tuple(1 + k * p for k in range(80_000))  # all hash to 1
    t = time.monotonic()
    assert plain_equal(PlainSet(items), PlainSet(items[::-1])) and not plain_equal(set(range(3)), PlainSet(items))
    assert time.monotonic() - t < 3.0


def test_numbers_beyond_float_range_and_reprs():
    assert not plain_equal(10**400, 1e308) and not plain_equal(1e308, 10**400) and plain_equal(10**400, 10**400)
    assert not plain_equal(float("inf"), 10**400)
    assert short_repr(10**5000) == "<int of 16610 bits>" and len(short_repr("x" * 1000)) == 100

    class Bad:
        def __repr__(self):
            raise RuntimeError("no")

    assert short_repr(Bad()) == "<Bad>"
    assert plain_equal(Bad(), Bad()) is False  # not plain data: unequal, never an exception


def test_values_does_not_import_the_sandbox():
    code = "import sys, grpolab.util.values, grpolab.rewards.tool_call; print(any('sandbox' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_integers_are_graded_exactly():
    """An expected int takes an int, or a float exactly equal; no tolerance, not near 0."""
    import math

    a, b = 10**17 + 1, 3
    assert float(a) + float(b) != a + b and not plain_equal(a + b, float(a) + float(b))
    assert math.isclose(math.gamma(24), math.factorial(23), rel_tol=1e-9) and math.gamma(24) != math.factorial(23)
    assert not plain_equal(math.factorial(23), math.gamma(24))  # within 1e-9 relatively, not equal
    assert plain_equal(math.factorial(20), math.gamma(21))  # exactly equal as a float: accepted
    assert not plain_equal(0, 1e-13 * 7) and not plain_equal(0, -0.0 + 1e-300)
    assert plain_equal(0, 0.0) and plain_equal(0, -0.0) and plain_equal(2**60, float(2**60))
    assert not plain_equal(2**53 + 1, float(2**53 + 1)) and not plain_equal(3, float("inf"))
    assert not plain_equal(1, True) and not plain_equal(True, 1) and not plain_equal(3, 3 + 1e-15)
    assert not plain_equal([1, 2**60 + 1], [1, float(2**60 + 1)])  # nested too
    assert not plain_equal({"n": 0}, {"n": 1e-13}) and plain_equal(1 + 0j, complex(1, 1e-13))  # complex: floats
    # float expected values keep their tolerances
    assert plain_equal(0.3, 0.1 + 0.2) and plain_equal(0.0, 1e-13) and plain_equal(1e20, 10**20 + 1)
    assert plain_equal(2.5, 2.5 * (1 + 1e-12)) and not plain_equal(2.5, 2.5 * (1 + 1e-6))
