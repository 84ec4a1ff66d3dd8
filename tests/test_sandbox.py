"""The sandbox: plain-data encoding, type-strict grading, limits, isolation, the bounded pool."""

from __future__ import annotations

import json
import os
import time

import pytest

from grpolab import sandbox as sb
from grpolab.sandbox import SandboxConfig, TestCase, channel, grading, isolation, literal_test, run_many, run_tests
from grpolab.types import ConfigError
from grpolab.values import plain_equal

ADD = [literal_test("add(1, 2)", "3"), literal_test("add(-4, 4)", "0"), literal_test("add(10, 5)", "15")]
GOOD = "def add(a, b):\n    return a + b\n"
FAST = SandboxConfig(timeout_s=3.0)


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -7, 2**80, -(2**200), 1.5, float("inf"), "h\u00e9", b"\x00\xff", 1 + 2j,
     [1, [2, (3,)]], (1, "a"), {1, 2}, frozenset({"x"}), {"a": [1], 2: (None,)}],
)
def test_plain_roundtrip(value):
    enc = json.loads(json.dumps(channel._plain(value)))
    assert plain_equal(value, channel._unplain(enc))  # in the child
    assert plain_equal(value, channel.decode(enc, channel.Budget()))  # in the parent (sets, dicts unhashed)


def test_plain_rejects_non_plain_types():
    class Eq:
        def __eq__(self, other):
            return True

    class MyInt(int):
        def __eq__(self, other):
            return True

    for v in (Eq(), MyInt(3), [Eq()], {"k": MyInt(1)}, iter([1]), object()):
        with pytest.raises(TypeError):
            channel._plain(v)
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError):
        channel._plain(deep)
    with pytest.raises(ValueError):
        channel._plain("x" * (channel.MAX_VALUE_CHARS + 1))


def test_plain_equal_is_type_strict():
    assert plain_equal(3, 3.0) and plain_equal(0.1 + 0.2, 0.3)
    assert not plain_equal(True, 1) and not plain_equal(1, True)
    assert not plain_equal([1, 2], (1, 2))
    assert not plain_equal("1", 1)
    assert plain_equal({1, 2}, frozenset({2, 1}))
    assert not plain_equal({"a": 1}, {"a": 1, "b": 2})
    assert not plain_equal(None, 0)


def test_literal_test_parses_without_evaluating():
    t = literal_test("f([1, 2], 'x', (3,))", "{'a': 1}")
    assert t.fn == "f" and t.args == ([1, 2], "x", (3,)) and t.expected == {"a": 1}
    for bad in ("f(g(1))", "f(__import__('os'))", "x.f(1)", "f(a=1)"):
        with pytest.raises(ValueError):
            literal_test(bad, "1")


def test_expected_values_never_reach_the_child():
    tests = [literal_test("add(1, 2)", "'SECRET-EXPECTED-VALUE'")]
    job = grading.encode_job("def add(a, b): pass", tests)
    assert b"SECRET-EXPECTED-VALUE" not in job


def test_correct_wrong_and_partial():
    assert run_tests(GOOD, ADD, FAST).passed == [True, True, True]
    r = run_tests("def add(a, b):\n    return 3\n", ADD, FAST)
    assert r.passed == [True, False, False] and r.fraction == pytest.approx(1 / 3)
    assert "expected 0, got 3" in r.details[1]


def test_load_error_and_missing_function():
    r = run_tests("def add(a, b) return a", ADD, FAST)
    assert r.fraction == 0 and r.load_error and "SyntaxError" in r.load_error
    r = run_tests("def plus(a, b):\n    return a + b\n", ADD, FAST)
    assert r.fraction == 0 and "KeyError" in r.details[0]


def test_exceptions_and_type_strictness_in_the_loop():
    code = "def add(a, b):\n    if a == 1: raise ValueError('no')\n    return float(a + b) if a == 10 else a + b\n"
    r = run_tests(code, ADD, FAST)
    assert r.passed == [False, True, True]  # 15.0 == 15 numerically; bool would not pass
    r = run_tests("def add(a, b):\n    return True\n", [literal_test("add(0, 1)", "1")], FAST)
    assert r.passed == [False]


def test_tolerance_tests():
    t = TestCase("call", fn="f", args=(), expected=0.3, tol=1e-6)
    assert run_tests("def f():\n    return 0.3000001\n", [t], FAST).passed == [True]
    assert run_tests("def f():\n    return 0.31\n", [t], FAST).passed == [False]
    assert run_tests("def f():\n    return '0.3'\n", [t], FAST).passed == [False]


def test_timeout_keeps_results_reported_before_it():
    code = "def add(a, b):\n    if a == 10:\n        while True: pass\n    return a + b\n"
    t = time.monotonic()
    r = run_tests(code, ADD, SandboxConfig(timeout_s=1.5))
    assert time.monotonic() - t < 4
    assert r.timed_out and r.passed == [True, True, False]


def test_output_is_captured_and_capped():
    code = "import sys\nprint('hello')\nsys.stderr.write('x' * 10**6)\ndef add(a, b):\n    return a + b\n"
    r = run_tests(code, ADD, SandboxConfig(timeout_s=3.0, max_output_bytes=1000))
    assert r.stdout.startswith("hello") and len(r.stderr) <= 1000


def test_duplicate_results_are_tampering():
    records, _, tampered = grading.parse_results(b'{"i": 0, "v": 3}\n{"i": 0, "v": 3}\n', 1)
    assert tampered
    records, _, tampered = grading.parse_results(b'{"i": 5, "v": 3}\n', 1)
    assert tampered and records == {}
    records, _, tampered = grading.parse_results(b'{"i": 0, "v": NaN}\n', 1)
    assert tampered
    records, _, tampered = grading.parse_results(b'{"tampered": "reply out of protocol"}\n', 1)
    assert tampered


def test_no_tests_is_zero():
    assert run_tests(GOOD, [], FAST).fraction == 0.0


def test_config_validation():
    with pytest.raises(ConfigError, match="isolation"):
        SandboxConfig(isolation="maybe").validate()
    with pytest.raises(ConfigError, match="memory_mb"):
        SandboxConfig(memory_mb=0).validate()
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxConfig(timeout_s=-1).validate()


def test_isolation_probe_reports_namespaces_here():
    iso = sb.probe_isolation()
    assert iso.describe()
    if os.geteuid() == 0 and iso.namespaces:
        assert iso.full and iso.drop_uid


def test_require_refuses_reduced_isolation(monkeypatch, capsys):
    reduced = sb.Isolation(namespaces=False, user_ns=False, drop_uid=False, uid_base=None, reason="test")
    monkeypatch.setattr(isolation, "_probe_result", reduced)
    monkeypatch.setattr(isolation, "_warned", False)
    with pytest.raises(sb.SandboxUnavailable, match="REDUCED ISOLATION"):
        sb.check_isolation("require")
    assert sb.check_isolation("best_effort") is reduced
    sb.check_isolation("best_effort")
    err = capsys.readouterr().err
    assert err.count("REDUCED ISOLATION") == 1  # warned once, prominently


def test_run_many_is_bounded_and_ordered():
    jobs = [(GOOD if i % 2 == 0 else "def add(a, b):\n    return 0\n", ADD) for i in range(6)]
    res = run_many(jobs, FAST, workers=8)
    assert [r.fraction for r in res] == [1.0, pytest.approx(1 / 3)] * 3
