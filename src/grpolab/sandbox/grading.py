"""Grading, in the parent: what a test is, what the sandbox is told, and how results are judged.

The number of tests comes from the task; a missing result is a failure; the exit code is ignored.
Call tests are judged here: the sandbox only ever receives the function name and the arguments,
never the expected value, and the reported value is decoded under a budget (channel.decode) and
compared type-strictly (grpolab.util.values.plain_equal). Assert tests (a task's own check code) are
judged by the checker process inside the sandbox, which the candidate cannot reach. Every test is
graded on its own: a value that cannot be compared (a 10**5000, an overflowing float) fails that
test only. A run whose channel broke protocol, or whose results overran the decoding budget, is
marked tampered and every test fails.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.sandbox import channel
from grpolab.util.values import plain_equal, short_repr


@dataclass(frozen=True)
class TestCase:
    """One test.

    kind "call": the checker calls `fn(*args)` and reports the plain-data result, compared in the
    parent with `expected` (or within `tol` / `rel_tol` for numbers). kind "assert": the checker
    runs `source` in the check namespace, where `fn` and `candidate` call into the candidate, and
    reports whether it raised. `prelude` (either kind) runs in that namespace first: the task's
    setup statements (imports, helper data), shared by every later test of the run.
    """

    __test__ = False  # not a pytest test class

    kind: str
    fn: str = ""
    args: tuple = ()
    expected: Any = None
    source: str = ""
    tol: float | None = None  # numeric result: |actual - expected| <= tol
    rel_tol: float | None = None  # numeric result: math.isclose(actual, expected, rel_tol, abs_tol=tol)
    prelude: str = ""


@dataclass
class SandboxResult:
    """What one candidate run produced; `passed` has exactly one entry per test."""

    passed: list[bool]
    details: list[str]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    isolation: str = ""
    load_error: str | None = None
    tampered: bool = False
    no_slot: bool = False  # the run's deadline passed before a slot was free: the code never ran

    @property
    def fraction(self) -> float:
        """Fraction of tests passed (0.0 when there are no tests)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def encode_job(code: str, tests: Sequence[TestCase], setup: str = "", check_setup: str = "") -> bytes:
    """The job for the sandbox: code and test *inputs*, never an expected value."""
    out, names = [], {}
    for t in tests:
        if t.kind == "call":
            out.append({"kind": "call", "fn": t.fn, "args": channel._plain(tuple(t.args)), "prelude": t.prelude})
        elif t.kind == "assert":
            out.append({"kind": "assert", "src": t.source, "prelude": t.prelude})
            if t.fn:
                names.update({"candidate": t.fn, t.fn: t.fn})  # both names call the entry point
        else:
            raise ValueError(f"unknown test kind {t.kind!r}")
    job = {"code": code, "setup": setup, "check_setup": check_setup, "names": names, "tests": out}
    return channel.frame(json.dumps(job).encode())


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def parse_results(raw: bytes, n_tests: int) -> tuple[dict[int, dict], str | None, bool]:
    """Per-test records keyed by index, the load error if any, and whether the protocol broke."""
    out: dict[int, dict] = {}
    load_error = None
    tampered = False
    lines = raw.split(b"\n")
    for line in lines[:-1]:  # an unterminated last line was cut off: ignored
        try:
            msg = json.loads(line, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            tampered = True
            continue
        if type(msg) is not dict:
            tampered = True
            continue
        if "tampered" in msg:
            tampered = True
        elif "load_error" in msg:
            load_error = str(msg["load_error"])[:500]
        elif "i" in msg:
            i = msg["i"]
            if type(i) is not int or not 0 <= i < n_tests or i in out:
                tampered = True
            else:
                out[i] = msg
    return out, load_error, tampered


def _numeric_close(t: TestCase, actual: Any) -> bool:
    """Tolerance comparison for tests written as abs(f(x) - y) < tol or math.isclose(f(x), y)."""
    if type(actual) not in (int, float) or (type(actual) is float and not math.isfinite(actual)):
        return False
    try:
        if t.rel_tol is not None:
            return math.isclose(actual, t.expected, rel_tol=t.rel_tol, abs_tol=t.tol or 0.0)
        return abs(actual - t.expected) <= (t.tol or 0.0)
    except OverflowError:
        return False


def _grade_one(t: TestCase, rec: dict, budget: channel.Budget) -> tuple[bool, str]:
    if "err" in rec:
        return False, str(rec["err"])[:200]
    if t.kind != "call":
        return (rec.get("pass") is True), ("ok" if rec.get("pass") is True else "assert failed")
    try:
        actual = channel.decode(rec.get("v", {"$": "?", "v": None}), budget)
    except (ValueError, TypeError, RecursionError) as e:
        if isinstance(e, channel.Tampered):
            raise
        return False, f"malformed result: {e}"
    ok = _numeric_close(t, actual) if (t.tol is not None or t.rel_tol is not None) else plain_equal(t.expected, actual)
    return ok, ("ok" if ok else f"expected {short_repr(t.expected)}, got {short_repr(actual)}")


def grade(
    tests: Sequence[TestCase], records: dict[int, dict], budget: channel.Budget | None = None
) -> tuple[list[bool], list[str], bool]:
    """Judge each test on its own; (passed, details, tampered). Nothing counts once tampering is seen."""
    budget = budget or channel.Budget()
    passed, details = [], []
    try:
        for i, t in enumerate(tests):
            rec = records.get(i)
            if rec is None:
                ok, why = False, "no result"
            else:
                try:
                    ok, why = _grade_one(t, rec, budget)
                except channel.Tampered:
                    raise
                except Exception as e:  # noqa: BLE001 - whatever happens, it fails this test only
                    ok, why = False, f"cannot compare: {type(e).__name__}"
            passed.append(bool(ok))
            details.append(why)
            budget.check_time()
    except channel.Tampered as e:
        return [False] * len(tests), [f"result channel tampered with: {e}"] * len(tests), True
    return passed, details, False


def decoded_values(tests: Sequence[TestCase], records: dict[int, dict]) -> list[Any]:
    """The decoded value of each call test (None where missing or malformed); for probes and tests."""
    values = []
    budget = channel.Budget()
    for i in range(len(tests)):
        try:
            values.append(channel.decode(records[i]["v"], budget))
        except (KeyError, ValueError, TypeError, RecursionError):
            values.append(None)
    return values


def literal_test(call_src: str, expected_src: str) -> TestCase:
    """A call test from source text: `call_src` must be `name(literal, ...)`, expected a literal.

    Parsed with ast.literal_eval in the parent; nothing is evaluated.
    """
    tree = ast.parse(call_src.strip(), mode="eval").body
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name) or tree.keywords:
        raise ValueError(f"not a plain call: {call_src!r}")
    args = tuple(ast.literal_eval(a) for a in tree.args)
    return TestCase("call", fn=tree.func.id, args=args, expected=ast.literal_eval(expected_src))


__all__ = ["SandboxResult", "TestCase", "decoded_values", "encode_job", "grade", "literal_test", "parse_results"]
