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
