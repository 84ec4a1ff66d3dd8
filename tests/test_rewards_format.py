"""The format reward."""

from __future__ import annotations

import pytest

from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.format import format_checks, format_score
from grpolab.util.fields import ConfigError

GOOD = "<think>a</think>\n<answer>42</answer>\n"


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD, 1.0),
        ("  <think></think><answer>x</answer>", 1.0),
        ("<think>a</think><answer>42</answer> trailing", 0.0),
        ("hello <think>a</think><answer>42</answer>", 0.0),
        ("<answer>42</answer><think>a</think>", 0.0),
        ("<think>a</think><think>b</think><answer>42</answer>", 0.0),
        ("<think>a</think><answer>1</answer><answer>2</answer>", 0.0),
        ("<think>a<answer>1</answer></think><answer>2</answer>", 0.0),
        ("<think>a</think><answer> </answer>", 0.0),
        ("<think>a</think>", 0.0),
        ("", 0.0),
    ],
)
def test_strict_format(text, expected):
    assert format_score(text) == expected


def test_partial_credit_and_value():
    bad = "<think>a</think><answer>42</answer> trailing"
    assert format_checks(bad)["nothing_after"] is False
    assert format_score(bad, partial=0.5) == pytest.approx(0.5 * 4 / 5)
    assert format_score("", partial=0.5) == 0.0
    assert format_score(GOOD, value=2.0, partial=0.5) == 2.0


def test_custom_tags_and_prefix():
    text = "<reasoning>r</reasoning><final>1</final>"
    assert format_score(text, think_tag="reasoning", answer_tag="final") == 1.0
    assert format_score("a</think><answer>1</answer>", prefix="<think>") == 1.0


def test_build_format():
    (rf,) = build_rewards([{"name": "format", "weight": 0.1, "partial": 0.2}])
    assert rf.weight == 0.1
    assert rf.fn(GOOD, Example(prompt="", answer="")) == 1.0
    with pytest.raises(ConfigError, match="think_tag"):
        build_rewards([{"name": "format", "think_tag": "<think>"}])
    with pytest.raises(ConfigError, match="partial"):
        build_rewards([{"name": "format", "partial": 2.0}])
