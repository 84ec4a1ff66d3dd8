"""The `code` reward: fraction of the task's tests that the last ```python block passes, in the sandbox.

example.meta (made by grpolab.tasks.code):
    tests:        list of tests; each is Python source whose *last* statement is the test (an
                  assertion about the function) and whose earlier statements are setup, e.g.
                  "assert add(1, 2) == 3" or "import random\nxs = [1, 2]\nassert add(*xs) == 3"
    entry_point:  the function under test (HumanEval's `candidate` means the same function)
    setup:        optional code run before the candidate's code (imports the prompt already showed)
    check_setup:  optional trusted code of the task (helpers its tests use, e.g. HumanEval's prompt),
                  run in the checker before the first test
    allow_assert_tests: optional bool, see below

A test is an assertion about the candidate: an `assert` (or a loop, `with`, `if` holding one) that
mentions the entry point or `candidate`, or a name computed from it in the setup before it. Setup
statements (imports, helper data, `assert True`) are not tests and never count.

Each assert of the shape below is turned, in the parent and without evaluating anything, into a
*call test*: the sandbox only receives the function name and literal arguments, the parent keeps
the expected value and compares type-strictly (grpolab.util.values.plain_equal):

    assert f(<literals>) == <literal>        (either side; an assert message is ignored)
    assert f(<literals>) is True / False / None,  assert f(...),  assert not f(...)
    assert math.isclose(f(...), <literal>[, rel_tol=.., abs_tol=..])
    assert abs(f(...) - <literal>) < <literal>  (or <=)

Any other test is an *assert test*: the sandbox's checker process runs it, after its setup, in one
namespace shared by all tests of the run, where the entry point and `candidate` call into the
candidate's process (which cannot reach the checker, so it cannot forge the verdict; see
docs/security.md). Such tests are refused unless meta["allow_assert_tests"] is True, because they
execute the task's test code (trusted data) inside the sandbox and depend on its fidelity.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from functools import lru_cache

from grpolab.batch import Example
from grpolab.rewards.extract import last_python_block
from grpolab.sandbox import ISOLATION_MODES, MAX_PARALLEL, SandboxConfig, TestCase, check_isolation, run_tests
from grpolab.util.fields import ConfigError


class UnconvertibleTest(ValueError):
    """An assert that is not a call compared with a literal."""


def _is_call_to(node: ast.AST, fn: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == fn
        and not node.keywords
        and not any(isinstance(a, ast.Starred) for a in node.args)
    )


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise UnconvertibleTest(f"not a literal: {ast.unparse(node)[:80]}") from e


def _call_test(call: ast.Call, expected, tol: float | None = None, rel: float | None = None) -> TestCase:
    args = tuple(_literal(a) for a in call.args)
    return TestCase("call", fn=call.func.id, args=args, expected=expected, tol=tol, rel_tol=rel)


def convert_assert(source: str, entry_point: str) -> TestCase:
    """One assert statement -> a call TestCase graded in the parent (raises UnconvertibleTest)."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError as e:
        raise UnconvertibleTest(f"syntax error in test: {e}") from e
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise UnconvertibleTest("not a single assert statement")
    test = tree.body[0].test
    fn = entry_point
    if _is_call_to(test, fn):
        return _call_test(test, True)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_call_to(test.operand, fn):
        return _call_test(test.operand, False)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            if not _is_call_to(left, fn) and _is_call_to(right, fn):
                left, right = right, left
            if _is_call_to(left, fn):
                expected = _literal(right)
                if isinstance(op, ast.Is) and expected not in (True, False, None):
                    raise UnconvertibleTest("`is` with a non-singleton")
                return _call_test(left, expected)
        if (
            isinstance(op, (ast.Lt, ast.LtE))
            and isinstance(left, ast.Call)
            and isinstance(left.func, ast.Name)
            and left.func.id == "abs"
            and len(left.args) == 1
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            a, b = left.args[0].left, left.args[0].right
            if not _is_call_to(a, fn):
                a, b = b, a
            if _is_call_to(a, fn):
                return _call_test(a, _number(_literal(b)), tol=float(_number(_literal(right))))
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Attribute)
        and test.func.attr == "isclose"
        and isinstance(test.func.value, ast.Name)
        and test.func.value.id == "math"
        and len(test.args) == 2
    ):
        a, b = test.args
        if not _is_call_to(a, fn):
            a, b = b, a
        if _is_call_to(a, fn):
            kw = {k.arg: float(_number(_literal(k.value))) for k in test.keywords}
            if set(kw) - {"rel_tol", "abs_tol"}:
                raise UnconvertibleTest("unknown isclose option")
            return _call_test(a, _number(_literal(b)), tol=kw.get("abs_tol", 0.0), rel=kw.get("rel_tol", 1e-9))
    raise UnconvertibleTest(f"unsupported assert shape: {source.strip()[:100]}")


def _number(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise UnconvertibleTest(f"expected a number, got {x!r}")
    return x


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _targets(stmt: ast.stmt) -> set[str]:
    """Names a setup statement binds (assignment targets, loop variables, with-as, imports)."""
    out: set[str] = set()
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.With)):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


def is_test(stmt: ast.stmt, about: set[str]) -> bool:
    """True if `stmt` asserts something about one of the names in `about` (the candidate or values
    computed from it): an `assert`, or a compound statement containing one, that mentions them
    (inside a loop, names assigned from the candidate count too: `y = f(x); assert g(y)`)."""
    inner = set(about)
    for _ in range(3):  # short chains of assignments inside the statement
        for node in ast.walk(stmt):
            if (
                isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                and node.value is not None
                and _names(node.value) & inner
            ):
                inner |= _targets(node)
    return any(isinstance(n, ast.Assert) and _names(n.test) & inner for n in ast.walk(stmt))


def taint(stmt: ast.stmt, about: set[str]) -> set[str]:
    """`about` plus the names a setup statement binds from an expression that mentions it."""
    return about | _targets(stmt) if _names(stmt) & about else about


def _stdlib_imports(node: ast.AST) -> str:
    """`import m` lines for standard-library modules a test uses without importing (MBPP's `math`)."""
    mods = getattr(sys, "stdlib_module_names", frozenset({"math", "re", "collections", "heapq", "itertools"}))
    used = sorted(n for n in _names(node) if n in mods)
    return "\n".join(f"import {m}" for m in used)


def convert_test(source: str, entry_point: str, allow_assert_tests: bool = False) -> TestCase:
    """One test (setup statements, then the test statement) -> a TestCase (raises UnconvertibleTest)."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError as e:
        raise UnconvertibleTest(f"syntax error in test: {e}") from e
    if not tree.body:
        raise UnconvertibleTest("empty test")
    about = {entry_point, "candidate"}
    for stmt in tree.body[:-1]:
        about = taint(stmt, about)
    last = tree.body[-1]
    if not is_test(last, about):
        raise UnconvertibleTest(f"not an assertion about {entry_point}: {ast.unparse(last)[:100]}")
    prelude = "\n".join(ast.unparse(stmt) for stmt in tree.body[:-1])
    for name in (entry_point, "candidate"):
        try:
            return replace(convert_assert(ast.unparse(last), name), fn=entry_point, prelude=prelude)
        except UnconvertibleTest:
            if name == "candidate" and not allow_assert_tests:
                raise
    imports = _stdlib_imports(tree)
    prelude = "\n".join(x for x in (imports, prelude) if x)
    return TestCase("assert", fn=entry_point, source=ast.unparse(last), prelude=prelude)


def convert_tests(asserts: list[str], entry_point: str, allow_assert_tests: bool = False) -> list[TestCase]:
    """All tests of a problem as TestCases; unconvertible ones become checker asserts if allowed."""
    return [convert_test(src, entry_point, allow_assert_tests) for src in asserts]


@lru_cache(maxsize=4096)
def _cached_tests(asserts: tuple[str, ...], entry_point: str, allow: bool) -> tuple[TestCase, ...]:
    return tuple(convert_tests(list(asserts), entry_point, allow))


def code_score(
    completion: str, example: Example, cfg: SandboxConfig, *, allow_untagged: bool = False, max_code_chars: int = 20_000
) -> float:
    """Fraction of example.meta['tests'] passed by the completion's last python block."""
    meta = example.meta
    asserts = meta.get("tests")
    if not asserts or "entry_point" not in meta:
        raise ValueError("code reward needs example.meta['tests'] and ['entry_point']")
    tests = _cached_tests(tuple(asserts), str(meta["entry_point"]), bool(meta.get("allow_assert_tests", False)))
    code = last_python_block(completion, allow_untagged=allow_untagged)
    if code is None or not code.strip() or len(code) > max_code_chars:
        return 0.0
    result = run_tests(
        code, list(tests), cfg, setup=str(meta.get("setup", "")), check_setup=str(meta.get("check_setup", ""))
    )
    return result.fraction


def make_code(
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    nproc: int = 8,
    isolation: str = "best_effort",
    allow_untagged: bool = False,
    max_code_chars: int = 20_000,
    slot_memory_mb: int = 1024,
):
    """Build the `code` reward (fraction of tests passed; see the module docstring).

    timeout_s: wall clock per candidate (all its tests).  cpu_s, memory_mb, nproc: rlimits.
    slot_memory_mb: memory of a whole run (all its processes), where a cgroup per slot is available.
    isolation: "require" refuses to run without namespaces; "best_effort" warns once and runs.
    allow_untagged: also accept a ``` block without a language tag.  max_code_chars: longer code
    scores 0.
    """
    if isolation not in ISOLATION_MODES:
        raise ConfigError(f"code: isolation must be require or best_effort, got {isolation!r}")
    cfg = SandboxConfig(
        timeout_s=timeout_s,
        cpu_s=cpu_s,
        memory_mb=memory_mb,
        nproc=nproc,
        slot_memory_mb=slot_memory_mb,
        isolation=isolation,
    ).validate()
    if not isinstance(max_code_chars, int) or max_code_chars <= 0:
        raise ConfigError(f"code: max_code_chars must be a positive integer, got {max_code_chars!r}")
    check_isolation(isolation)  # probe now: refuse at config time, or warn once, before training

    def code_reward(completion: str, example: Example) -> float:
        return code_score(completion, example, cfg, allow_untagged=bool(allow_untagged), max_code_chars=max_code_chars)

    code_reward.max_concurrency = MAX_PARALLEL  # type: ignore[attr-defined]
    return code_reward
