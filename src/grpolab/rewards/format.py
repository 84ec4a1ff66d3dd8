"""The `format` reward: exactly one think block, then exactly one answer block, nothing after.

A completion matches when, after optional leading whitespace, it is

    <think>...</think> (whitespace) <answer>...</answer> (whitespace)

with exactly one opening and one closing tag of each kind and a non-empty answer. A match scores
`value` (default 1.0; the recipe's weight scales it). A non-match scores
`partial * (criteria met / 5)`, with partial defaulting to 0 (no partial credit).
"""

from __future__ import annotations

import re

from grpolab.batch import Example
from grpolab.util.fields import ConfigError

_TAG_RE = re.compile(r"[A-Za-z_][\w\-]*")


def format_checks(text: str, think_tag: str = "think", answer_tag: str = "answer") -> dict[str, bool]:
    """The five criteria of a well-formed completion, each True/False.

    one_think: one <think> and one </think>, in that order.  one_answer: the same for the answer
    (with non-empty content).  order: the think block closes before the answer opens.
    nothing_before: only whitespace before <think>.  nothing_after: only whitespace after </answer>.
    """
    to, tc = f"<{think_tag}>", f"</{think_tag}>"
    ao, ac = f"<{answer_tag}>", f"</{answer_tag}>"
    n = {t: text.count(t) for t in (to, tc, ao, ac)}
    i_to, i_tc, i_ao, i_ac = (text.find(t) for t in (to, tc, ao, ac))
    one_think = n[to] == 1 and n[tc] == 1 and i_to < i_tc
    one_answer = n[ao] == 1 and n[ac] == 1 and i_ao < i_ac and bool(text[i_ao + len(ao) : i_ac].strip())
    order = one_think and one_answer and i_tc < i_ao
    nothing_before = i_to >= 0 and not text[:i_to].strip()
    nothing_after = i_ac >= 0 and n[ac] == 1 and not text[i_ac + len(ac) :].strip()
    return {
        "one_think": one_think,
        "one_answer": one_answer,
        "order": order,
        "nothing_before": nothing_before,
        "nothing_after": nothing_after,
    }


def format_score(
    text: str,
    *,
    think_tag: str = "think",
    answer_tag: str = "answer",
    value: float = 1.0,
    partial: float = 0.0,
    prefix: str = "",
) -> float:
    """`value` for a well-formed completion, else `partial` times the fraction of criteria met."""
    checks = format_checks(prefix + text, think_tag, answer_tag)
    if all(checks.values()):
        return value
    return partial * sum(checks.values()) / len(checks)


def make_format(
    think_tag: str = "think", answer_tag: str = "answer", value: float = 1.0, partial: float = 0.0, prefix: str = ""
):
    """Build the `format` reward.

    think_tag / answer_tag: tag names.  value: score of a match.  partial: the most a non-match can
    earn (scaled by the fraction of the 5 criteria it meets; 0 disables partial credit).
    prefix: text the prompt already put in the assistant turn (e.g. "<think>"), checked as if the
    completion started with it.
    """
    for key, tag in (("think_tag", think_tag), ("answer_tag", answer_tag)):
        if not (isinstance(tag, str) and _TAG_RE.fullmatch(tag)):
            raise ConfigError(f"format: {key} must be a tag name like 'think', got {tag!r}")
    if think_tag == answer_tag:
        raise ConfigError("format: think_tag and answer_tag must differ")
    for key, val in (("value", value), ("partial", partial)):
        if not isinstance(val, (int, float)) or isinstance(val, bool):
            raise ConfigError(f"format: {key} must be a number, got {val!r}")
    if not 0 <= partial <= value:
        raise ConfigError(f"format: partial must be between 0 and value ({value}), got {partial}")
    if not isinstance(prefix, str):
        raise ConfigError(f"format: prefix must be a string, got {prefix!r}")

    def format_reward(completion: str, example: Example) -> float:
        return format_score(
            completion,
            think_tag=think_tag,
            answer_tag=answer_tag,
            value=float(value),
            partial=float(partial),
            prefix=prefix,
        )

    return format_reward
