"""The code reward: assert conversion (parent-side grading), code-block extraction, scoring."""

from __future__ import annotations

import pytest

from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.code import UnconvertibleTest, code_score, convert_assert, convert_tests
from grpolab.sandbox import SandboxConfig
from grpolab.util.fields import ConfigError

CFG = SandboxConfig(timeout_s=3.0)
EX = Example(
    prompt="",
    answer="",
    meta={
        "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"],
        "entry_point": "add",
    },
)


def test_convert_shapes():
    t = convert_assert("assert f([1, 2], 'x') == (1, {2})", "f")
    assert (t.kind, t.fn, t.args, t.expected) == ("call", "f", ([1, 2], "x"), (1, {2}))
    assert convert_assert("assert 3 == f(1)", "f").expected == 3
    assert convert_assert("assert f(1)", "f").expected is True
    assert convert_assert("assert not f(1)", "f").expected is False
    assert convert_assert("assert f(1) is None", "f").expected is None
    assert convert_assert("assert f(1) == 2, 'message'", "f").expected == 2
    t = convert_assert("assert abs(f(2) - 1.5) < 1e-6", "f")
    assert (t.expected, t.tol) == (1.5, 1e-6)
    t = convert_assert("assert math.isclose(f(2), 1.5, rel_tol=0.001)", "f")
    assert (t.expected, t.rel_tol) == (1.5, 0.001)


@pytest.mark.parametrize(
    "src",
    [
        "assert f(g(1)) == 2",
        "assert f(1) == g(2)",
        "assert f(x) == 1",
        "assert set(f(1)) == {1}",
        "f(1)",
        "assert f(1) == 1; import os",
        "assert f(1) > 0",
        "assert f(a=1) == 1",
        "assert h(1) == 1",
        "assert f(1) is 5",
        "assert f(__import__('os')) == 1",
        "def x(:",
    ],
)
def test_unconvertible(src):
    with pytest.raises(UnconvertibleTest):
        convert_assert(src, "f")


def test_assert_tests_only_when_allowed():
    tests = convert_tests(["assert f(1) == 1", "assert f(1) > 0"], "f", allow_assert_tests=True)
    assert [t.kind for t in tests] == ["call", "assert"]
    with pytest.raises(UnconvertibleTest):
        convert_tests(["assert f(1) > 0"], "f")


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("```python\ndef add(a, b):\n    return a + b\n```", 1.0),
        ("Here:\n```py\ndef add(a, b):\n    return a + b\n```", 1.0),
        ("```python\ndef add(a, b):\n    return 0\n```\nfixed:\n```python\ndef add(a, b):\n    return a + b\n```", 1.0),
        ("```python\ndef add(a, b):\n    return a + b\n```\n```python\ndef add(a, b):\n    return 4\n```", 0.25),
        ("def add(a, b):\n    return a + b", 0.0),  # no code block
        ("```\ndef add(a, b):\n    return a + b\n```", 0.0),  # untagged block (off by default)
        ("```python\n```", 0.0),
        ("```python\ndef add(a, b):\n    return 4\n```", 0.25),
    ],
)
def test_code_score(completion, expected):
    assert code_score(completion, EX, CFG) == pytest.approx(expected)


def test_untagged_and_size_options():
    assert code_score("```\ndef add(a, b):\n    return a + b\n```", EX, CFG, allow_untagged=True) == 1.0
    big = "```python\ndef add(a, b):\n    return a + b\n" + "#" * 30_000 + "\n```"
    assert code_score(big, EX, CFG) == 0.0


def test_setup_code_and_missing_meta():
    ex = Example(
        prompt="", answer="", meta={"tests": ["assert f(4) == 2.0"], "entry_point": "f", "setup": "import math"}
    )
    assert code_score("```python\ndef f(x):\n    return math.sqrt(x)\n```", ex, CFG) == 1.0
    with pytest.raises(ValueError):
        code_score("```python\n```", Example(prompt="", answer=""), CFG)


def test_build_code_reward():
    (rf,) = build_rewards([{"name": "code", "timeout_s": 3.0}])
    assert rf.fn("```python\ndef add(a, b):\n    return a + b\n```", EX) == 1.0
    with pytest.raises(ConfigError, match="isolation"):
        build_rewards([{"name": "code", "isolation": "none"}])
    with pytest.raises(ConfigError, match="timeout_s"):
        build_rewards([{"name": "code", "timeout_s": 0}])


def test_setup_statements_are_not_tests():
    from grpolab.rewards.code import convert_test

    for src in (
        "import os",
        "assert True",
        "assert True, 'prints if it fails'",
        "x = f(1)",
        "print(f(2))",
        "import math\nassert math.pi > 3",
    ):
        with pytest.raises(UnconvertibleTest, match="not an assertion about f"):
            convert_test(src, "f", allow_assert_tests=True)
    t = convert_test("import math\nassert f(4) == 2.0", "f")
    assert (t.kind, t.fn, t.args, t.expected, t.prelude) == ("call", "f", (4,), 2.0, "import math")
    t = convert_test("assert candidate(4) == 2.0", "f")  # HumanEval's name for the entry point
    assert (t.kind, t.fn, t.args) == ("call", "f", (4,))
    t = convert_test("y = f(3)\nassert y > 2", "f", allow_assert_tests=True)  # about a value computed from f
    assert (t.kind, t.source, t.prelude) == ("assert", "assert y > 2", "y = f(3)")
    t = convert_test("for i in range(3):\n    r = f(i)\n    assert r == i", "f", allow_assert_tests=True)
    assert t.kind == "assert" and t.fn == "f"
    t = convert_test("assert math.floor(f(2.5)) == 2", "f", allow_assert_tests=True)
    assert t.prelude == "import math"  # MBPP-style tests use math without importing it


def test_stub_scores_zero_on_assert_style_problems():
    ex = Example(
        prompt="",
        answer="",
        meta={
            "tests": [
                "import random\nrng = random.Random(1)\nxs = [rng.randint(0, 9) for _ in range(4)]\n"
                "assert f(xs) == sorted(xs)",
                "assert f([2, 1]) == [1, 2]",
            ],
            "entry_point": "f",
            "allow_assert_tests": True,
        },
    )
    assert code_score("```python\ndef f(xs):\n    pass\n```", ex, CFG) == 0.0
    assert code_score("```python\ndef f(xs):\n    return sorted(xs)\n```", ex, CFG) == 1.0


def test_integer_expected_values_are_graded_exactly_through_the_sandbox():
    """Floats near an int expected value fail: no tolerance (a relative 1e-9 or absolute 1e-12 would pass them)."""
    big = Example(
        prompt="",
        answer="",
        meta={
            "entry_point": "add",
            "tests": [
                "assert add(100000000000000001, 3) == 100000000000000004",
                "assert add(1152921504606846976, 1) == 1152921504606846977",
                "assert add(1, 2) == 3",
            ],
        },
    )
    assert code_score("```python\ndef add(a, b):\n    return float(a) + float(b)\n```", big, CFG) == pytest.approx(
        1 / 3
    )
    assert code_score("```python\ndef add(a, b):\n    return a + b\n```", big, CFG) == 1.0
    fact = Example(
        prompt="",
        answer="",
        meta={"entry_point": "fact", "tests": ["assert fact(23) == 25852016738884976640000", "assert fact(5) == 120"]},
    )
    gamma = "```python\nimport math\ndef fact(n):\n    return math.gamma(n + 1)\n```"
    assert code_score(gamma, fact, CFG) == pytest.approx(0.5)  # 5! is exactly 120.0: that one passes
    assert code_score("```python\nimport math\ndef fact(n):\n    return math.factorial(n)\n```", fact, CFG) == 1.0
    zero = Example(prompt="", answer="", meta={"entry_point": "f", "tests": ["assert f(3) == 0", "assert f(0) == 0"]})
    assert code_score("```python\ndef f(x):\n    return 1e-13 * x\n```", zero, CFG) == pytest.approx(0.5)
    assert code_score("```python\ndef f(x):\n    return 0.0 * x\n```", zero, CFG) == 1.0  # 0.0 == 0 exactly
    # a float expected value keeps its tolerance, and an explicit tolerance is the test's own
    tol = Example(
        prompt="",
        answer="",
        meta={
            "entry_point": "f",
            "tests": ["assert f(3) == 0.3", "assert abs(f(3) - 0) < 1e-9", "assert math.isclose(f(10), 1)"],
        },
    )
    assert code_score("```python\ndef f(x):\n    return 0.1 * x\n```", tol, CFG) == pytest.approx(2 / 3)
