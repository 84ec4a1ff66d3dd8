"""The math reward: extraction modes, hedging, equivalence, and bounded time on pathological input."""

from __future__ import annotations

import threading
import time

import pytest

from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.math_answer import extract_answer, math_score, shutdown_workers
from grpolab.util.fields import ConfigError


def score(completion: str, gold: str, **kw) -> float:
    return math_score(completion, gold, **kw)


@pytest.mark.parametrize(
    "completion,gold,expected",
    [
        ("<think>hm</think><answer>72</answer>", "72", 1.0),
        ("<answer>72.0</answer>", "72", 1.0),
        ("<answer>1,234</answer>", "1234", 1.0),
        ("<answer>71</answer>", "72", 0.0),
        ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
        ("<answer>1/2</answer>", "\\frac12", 1.0),
        ("<answer>\\boxed{\\sqrt{2}/2}</answer>", "\\frac{\\sqrt2}{2}", 1.0),
        ("<answer>2x+x^2</answer>", "x^2+2x", 1.0),
        ("<answer>7 cm</answer>", "7", 1.0),
        ("The answer is \\boxed{72}.", "72", 1.0),
        ("First \\boxed{3}.\n\nFinally \\boxed{72}", "72", 1.0),  # only the last answer counts
        ("reasoning\n#### 72", "72", 1.0),
        ("reasoning\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),
        ("<answer>70</answer> <answer>72</answer>", "72", 1.0),  # last tag counts
        ("<answer>72</answer> <answer>70</answer>", "72", 0.0),
    ],
)
def test_auto_extraction_and_equivalence(completion, gold, expected):
    assert score(completion, gold) == expected


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>3 or 72</answer>",
        "<answer>72 or 3</answer>",
        "<answer>either 72 or 3</answer>",
        "<answer>3, 72</answer>",
        "<answer>\\boxed{72}\\boxed{3}</answer>",
        "<answer>\\boxed{3} \\boxed{72}</answer>",
        "So \\boxed{3} or \\boxed{72}",
        "<answer></answer>",
        "<answer>   </answer>",
        "<answer>\\boxed{}</answer>",
        "no answer at all, 72",
        "",
    ],
)
def test_hedged_empty_and_missing_answers_score_zero(completion):
    assert score(completion, "72") == 0.0


def test_modes():
    assert score("<answer>5</answer> \\boxed{72}", "72", extract="boxed") == 1.0
    assert score("<answer>5</answer> \\boxed{72}", "72", extract="answer_tag") == 0.0
    assert score("\\boxed{72}", "72", extract="answer_tag") == 0.0
    assert score("#### 72", "72", extract="boxed") == 0.0
    assert score("#### 72\n", "72", extract="gsm8k") == 1.0
    assert extract_answer("<answer>x</answer>", "auto") == "x"
    assert extract_answer("#### 3", "answer_tag") is None


@pytest.mark.parametrize(
    "completion,gold,expected",
    [
        ("so she has 1,234 apples.", "1234", 1.0),
        ("the result: -3.50", "-3.5", 1.0),
        ("x-3 gives 4", "4", 1.0),
        ("answer 5 then 6", "5", 0.0),  # only the last number counts
        ("total 0.5", ".5", 1.0),
        ("no numbers", "1", 0.0),
        ("it is 72", "72.00", 1.0),
    ],
)
def test_last_number_mode_is_lenient_but_numeric(completion, gold, expected):
    assert score(completion, gold, extract="last_number") == expected


def test_last_number_mode_needs_numeric_gold():
    with pytest.raises(ValueError):
        score("42", "\\frac{1}{2}", extract="last_number")


def _timed_in_thread(fn):
    out = {}

    def run():
        t = time.monotonic()
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001
            out["error"] = e
        out["elapsed"] = time.monotonic() - t

    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    assert not th.is_alive()
    return out


@pytest.mark.parametrize(
    "answer",
    [
        "1" * 100_000,
        "9^{9^{9^9}}",
        "10^{10^{10}}",
        "2**3**4**5",
        "{" * 200 + "7" + "}" * 200,
        "\\frac{" * 50 + "1",
        "(" * 30 + "7" + ")" * 30,
    ],
)
def test_pathological_answers_are_fast_zero_from_a_worker_thread(answer):
    out = _timed_in_thread(lambda: score(f"<answer>{answer}</answer>", "7", timeout_s=2.0))
    assert out.get("value", 0.0) == 0.0
    assert out["elapsed"] < 4.0


def test_hard_timeout_kills_a_slow_comparison_and_next_call_works():
    # Not caught by the cheap pre-filter: sympy grinds on a huge factorial until the worker is killed.
    out = _timed_in_thread(lambda: score("<answer>(10^{6})!</answer>", "7", timeout_s=1.0))
    assert isinstance(out.get("error"), TimeoutError)
    assert out["elapsed"] < 4.0
    assert score("<answer>\\frac{14}{2}</answer>", "7") == 1.0


def test_huge_completion_is_capped():
    t = time.monotonic()
    assert score("x" * 5_000_000 + "<answer>7</answer>", "7") == 1.0
    assert time.monotonic() - t < 2.0


def test_build_math_options():
    (fn,) = build_rewards([{"name": "math", "extract": "boxed"}])
    assert fn.fn("\\boxed{4}", Example(prompt="", answer="4")) == 1.0
    with pytest.raises(ConfigError, match="extract"):
        build_rewards([{"name": "math", "extract": "first"}])
    with pytest.raises(ConfigError, match="timeout_s"):
        build_rewards([{"name": "math", "timeout_s": 0}])


def test_workers_restart_after_shutdown():
    shutdown_workers()
    assert score("<answer>\\frac{6}{3}</answer>", "2") == 1.0


# ---------------------------------------------------------------- decimals and fractions are exact


@pytest.mark.parametrize(
    "answer,gold,expected",
    [
        ("3.0000001", "3.0", 0.0),  # math-verify alone rounds floats to 6 decimals: it scored 1 (the hack)
        ("3.0000001", "3", 0.0),
        ("0.0000001", "0.0000002", 0.0),  # scored 1 the same way
        ("0.0000001", "0.0000001", 1.0),
        ("3.0", "3", 1.0),  # 3.0 = 30/10 = 3
        ("2.50", "\\frac{5}{2}", 1.0),
        ("0.333333", "\\frac{1}{3}", 0.0),  # 333333/1000000 != 1/3
        ("-\\frac{3}{4}", "-0.75", 1.0),
        ("3/4", "\\dfrac{3}{4}", 1.0),
        ("6/8", "0.75", 1.0),
        ("\\frac12", "0.5", 1.0),
        ("1,234.5", "\\frac{2469}{2}", 1.0),
        ("-3/4", "3/4", 0.0),
    ],
)
def test_plain_decimals_and_fractions_compare_exactly_as_rationals(answer, gold, expected, monkeypatch):
    from grpolab.rewards import math_answer

    def no_worker(*a, **k):
        raise AssertionError("a pair of plain rationals must not reach math-verify")

    monkeypatch.setattr(math_answer._POOL, "verify", no_worker)
    assert score(f"<answer>{answer}</answer>", gold) == expected


@pytest.mark.parametrize(
    "answer,gold,expected",
    [
        ("3.0000001 cm", "3.0", 0.0),  # units stripped by math-verify: one number each, compared exactly
        ("3.0 cm", "3", 1.0),
        ("0.333333 m", "\\frac{1}{3}", 0.0),
        ("0.5 cm", "\\frac{1}{2}", 1.0),
        ("3.0000001\\pi", "3\\pi", 0.0),  # symbolic: the difference 1e-7*pi is not zero
        ("1.5\\pi", "\\frac{3\\pi}{2}", 1.0),
    ],
)
def test_numbers_math_verify_parses_are_exact_too(answer, gold, expected):
    assert score(f"<answer>{answer}</answer>", gold) == expected


def test_plain_rational_parses_exactly_or_refuses():
    from fractions import Fraction

    from grpolab.rewards.extract import plain_rational

    assert plain_rational("3.0000001") == Fraction(30000001, 10_000_000)
    assert plain_rational("$\\frac{1}{3}$") == Fraction(1, 3)
    assert plain_rational("-\\tfrac{1.5}{3}") == Fraction(-1, 2)
    assert plain_rational(" 3 / 4 ") == Fraction(3, 4)
    for text in ("1/0", "--3/4", "3/-4", "1/2/3", "\\frac{x}{2}", "\\frac{\\sqrt2}{2}", "\\frac{1}{2}cm", "x"):
        assert plain_rational(text) is None, text


# ---------------------------------------------------------------- products, scientific notation, sets and tuples


@pytest.mark.parametrize(
    "answer,gold,expected",
    [
        ("3.0000001 \\cdot 1", "3.0", 0.0),  # a product of numbers is one number: compared exactly (scored 1)
        ("0 \\cdot 1", "1.6 \\times 10^{-19}", 0.0),  # scored 1: 1.6e-19 rounds to 0
        ("1 \\times 10^{-7}", "0.0000002", 0.0),  # scored 1
        ("1.6 \\times 10^{-19}", "0.00000000000000000016", 1.0),
        ("2 \\times 10^{-7}", "0.0000002", 1.0),
        ("3.0 \\cdot 1", "3", 1.0),
        ("3", "3.0000001 \\cdot 1", 0.0),  # the gold written as a product
        ("\\frac{3}{4} \\cdot 2", "1.5", 1.0),
        ("-3.5 \\cdot 2", "-7", 1.0),
        ("3.0000001\\%", "3\\%", 0.0),
        ("2^{10}", "1024", 1.0),
        ("\\{3.0000001, 2\\}", "\\{2, 3\\}", 0.0),  # numbers inside a set are exact
        ("\\{3, 2\\}", "\\{2, 3.0\\}", 1.0),
        ("(3.0000001, 2)", "(3, 2)", 0.0),  # and inside a tuple
        ("(3, 2 \\cdot 1)", "(3, 2)", 1.0),
        ("(2, 3)", "(3, 2)", 0.0),  # a tuple keeps its order
        ("[1, 2.0000001]", "[1, 2]", 0.0),  # an interval's ends
        ("x = 3.0000001", "3", 0.0),
        ("x = 3", "3", 1.0),
    ],
)
def test_products_scientific_notation_sets_and_tuples_are_exact(answer, gold, expected):
    assert score(f"<answer>{answer}</answer>", gold) == expected


@pytest.mark.parametrize(
    "pred,gold,expected",
    [
        # an irrational answer within 5e-7 of a decimal gold scored 1 (math-verify rounds to 6 decimals)
        (r"3 + 10^{-7}\sqrt{2}", "3.0", 0.0),
        (r"\sqrt{2}\times10^{-20}", r"1.6\times10^{-19}", 0.0),
        (r"\pi\times10^{-30}", r"6.6\times10^{-34}", 0.0),
        (r"\pi", "3.14159265", 0.0),
        # equal answers still score 1: rational values sympy leaves unsimplified, irrationals written two ways
        (r"\frac{\log(8)}{\log(2)}", "3", 1.0),
        (r"\sin(\pi/6)", "0.5", 1.0),
        (r"\sqrt{4}", "2", 1.0),
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", 1.0),
        (r"2\sqrt{2}", r"\sqrt{8}", 1.0),
        (r"\pi \times 10^{-30}", r"\pi \times 10^{-30}", 1.0),
    ],
)
def test_irrational_against_exact_numbers_at_the_precision_the_digits_need(pred, gold, expected):
    assert score(rf"\boxed{{{pred}}}", gold) == expected
