"""The countdown reward: exact evaluation, every number once, no eval."""

from __future__ import annotations

import pytest

from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.countdown import ExprError, countdown_score, evaluate

NUMS, TARGET = [3, 5, 7, 2], 24


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("<answer>(7 - 3) * (5 + 2) - 4</answer>", 0.0),  # 4 is not given
        ("<answer>(7 + 5) * 2 * (3 - 3)</answer>", 0.0),
        ("<answer>(7 + 5) * (2 + 3 - 3)</answer>", 0.0),
        ("<answer>3 * (5 + 7) / 2 + 3</answer>", 0.0),
        ("<answer>(7 + 5) * 2 * 3 / 3</answer>", 0.0),
        ("<answer>3 * 7 + 5 - 2</answer>", 1.0),
        ("<answer>3 × 7 + 5 − 2</answer>", 1.0),
        ("<answer>3 * 7 + 5 - 2 = 24</answer>", 1.0),
        ("<answer>3 * 7 + 5 - 2 = 25</answer>", 0.0),
        ("<answer>3 * 7 + 5 - 2 = 24 = 24</answer>", 0.0),
        ("<answer>3 * 7 + 5</answer>", 0.0),  # not every number used
        ("<answer>3 * 7 + 5 - 2 + 0</answer>", 0.0),  # extra number
        ("<answer>37 + 5 - 2</answer>", 0.0),  # concatenated digits
        ("<answer>3 * 7 + 5 - 2 ** 1</answer>", 0.0),
        ("<answer>__import__('os')</answer>", 0.0),
        ("<answer>-2 + 3 * 7 + 5</answer>", 1.0),  # a minus directly on a given number
        ("<answer>-(2 - 3 * 7) + 5</answer>", 0.0),  # ... but not on a parenthesised expression
        ("<answer>--2 + 3 * 7 + 5</answer>", 0.0),  # nor doubled
        ("<answer>+2 + 3 * 7 - 5</answer>", 0.0),  # no unary plus
        ("<answer>5 / (7 - 7) + 3 + 2</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("some reasoning\nAnswer: 3 * 7 + 5 - 2", 1.0),  # last line fallback
        ("some reasoning\n3 * 7 + 5 - 2.", 1.0),
        ("3 * 7 + 5 - 2\nI think that's it", 0.0),
    ],
)
def test_countdown(completion, expected):
    assert countdown_score(completion, NUMS, TARGET) == expected


def test_exact_fractions():
    # 8 / (3 - 8/3) = 24 needs exact division
    assert countdown_score("<answer>8 / (3 - 8 / 3)</answer>", [8, 3, 8, 3], 24) == 1.0
    value, used = evaluate("1/3 + 1/3 + 1/3")
    assert value == 1 and used == [1, 3, 1, 3, 1, 3]


def test_parser_limits():
    with pytest.raises(ExprError):
        evaluate("(" * 40 + "1" + ")" * 40)
    with pytest.raises(ExprError):
        evaluate("1+" * 200 + "1")
    with pytest.raises(ExprError):
        evaluate("(1+2")


def test_partial_and_answer_tag_mode():
    assert countdown_score("<answer>3 * 7 + 5 + 2</answer>", NUMS, TARGET, partial=0.1) == 0.1
    assert countdown_score("3 * 7 + 5 - 2", NUMS, TARGET, extract="answer_tag") == 0.0
    (rf,) = build_rewards([{"name": "countdown"}])
    ex = Example(prompt="", answer="", meta={"numbers": NUMS, "target": TARGET})
    assert rf.fn("<answer>3*7+5-2</answer>", ex) == 1.0


@pytest.mark.parametrize(
    "expr,numbers,target",
    [  # gold answers of a public countdown generator that start with (or contain) a unary minus
        ("-1 + 72*(89 - 77)/1", [1, 72, 89, 77, 1], 863),
        ("27*(-2 + (5 - 55 + 62)/2)", [27, 2, 5, 55, 62, 2], 108),
        ("3 * 7 - -2 + 5 - 4", [3, 7, 2, 5, 4], 24),
        ("5 * -2 + 7 * 3 + 13", [5, 2, 7, 3, 13], 24),
    ],
)
def test_unary_minus_on_a_given_number(expr, numbers, target):
    assert countdown_score(f"<answer>{expr}</answer>", numbers, target) == 1.0
    assert countdown_score(f"<answer>{expr} = {target}</answer>", numbers, target) == 1.0
    assert countdown_score(f"<answer>{expr}</answer>", numbers, target + 1) == 0.0  # still exact
    value, used = evaluate(expr)
    assert value == target and sorted(used) == sorted(numbers)  # -2 uses the given 2


def test_unary_minus_keeps_the_other_guarantees():
    assert evaluate("-2 * 3") == (-6, [2, 3])
    assert evaluate("4 / -2") == (-2, [4, 2])
    for bad in ("-(1 + 2)", "--1", "- -1", "-", "1 -", "-x", "+1", "(-)1", "-1e3", "2 ** -1"):
        with pytest.raises(ExprError):
            evaluate(bad)
    assert countdown_score("<answer>-3 * 7 + 5 - 2</answer>", NUMS, TARGET) == 0.0  # -18 != 24
    assert countdown_score("<answer>-37 + 5 - 2</answer>", NUMS, TARGET) == 0.0  # concatenated digits
    assert countdown_score("<answer>-(3 * 7 + 5 - 2) * -1</answer>", NUMS + [1], TARGET) == 0.0
