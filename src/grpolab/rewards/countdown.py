"""The `countdown` reward: an arithmetic expression that uses each given number once and hits the target.

example.meta must hold `numbers` (list of ints) and `target` (int).

Where the expression is read from (extract="auto", the default): the content of the last
`<answer>...</answer>` block if there is one, otherwise the last non-empty line of the completion
(after its last ':' if any, with surrounding `$` and a final '.' dropped).
extract="answer_tag" requires the tag. The expression may be written as `expr` or `expr = target`
(the right-hand side must then be the target itself). Allowed: integer literals, + - * /, parentheses,
whitespace; `x` and `×` are read as `*`, `÷` as `/`, `−` as `-`. A minus sign directly on a given
number is accepted (`-1 + 72*(89 - 77)/1`, `27*(-2 + (5 - 55 + 62)/2)`: public countdown generators'
gold answers have them, and TinyZero's checker accepts them); the number still counts as the given
one (`-2` uses 2). A sign on a parenthesised expression (`-(1+2)`), a doubled sign (`--2`) and a
unary plus are refused. No other characters.

The expression is parsed by the small recursive-descent parser of grpolab.rewards.arith (never eval)
and evaluated exactly with fractions; division by zero scores 0. Each given number must be used
exactly once (as a multiset).
"""

from __future__ import annotations

from fractions import Fraction

from grpolab.batch import Example
from grpolab.rewards import arith
from grpolab.rewards.arith import Syntax
from grpolab.rewards.extract import last_tag_content
from grpolab.util.fields import ConfigError

MAX_EXPR_CHARS = 200
MAX_DEPTH = 32
_TRANSLATE = str.maketrans({"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "–": "-"})


class ExprError(ValueError):
    """The expression is not a well-formed countdown expression."""


def tokenize(expr: str) -> list[str]:
    """Split into integer literals, operators and parentheses; reject anything else."""
    tokens: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "+-*/()":
            tokens.append(c)
            i += 1
        elif c in "0123456789":
            j = i
            while j < len(expr) and expr[j] in "0123456789":
                j += 1
            if j - i > 12:
                raise ExprError("number too long")
            tokens.append(expr[i:j])
            i = j
        else:
            raise ExprError(f"character {c!r} not allowed")
    return tokens


def _tokenize(expr: str) -> list[str]:
    return tokenize(expr.translate(_TRANSLATE))


# Integer literals (a minus allowed directly on one), + - * / and parentheses; no powers, no
# magnitude limit.
SYNTAX = Syntax(
    tokenize=_tokenize,
    error=ExprError,
    max_chars=MAX_EXPR_CHARS,
    max_depth=MAX_DEPTH,
    depth_message="too deeply nested",
    negative_literals=True,
)


def evaluate(expr: str) -> tuple[Fraction, list[int]]:
    """Exact value of `expr` and the integer literals it uses, in order, without their signs (raises
    ExprError)."""
    numbers: list[int] = []
    value = arith.evaluate(expr, SYNTAX, on_number=lambda v: numbers.append(int(v)))
    return value, numbers


def extract_expression(completion: str, mode: str = "auto") -> str | None:
    """The candidate expression: last <answer> block, else (auto) the last non-empty line."""
    ans = last_tag_content(completion, "answer")
    if ans is not None or mode == "answer_tag":
        return ans
    lines = [ln.strip() for ln in completion[-4000:].splitlines() if ln.strip()]
    if not lines:
        return None
    line = lines[-1].rsplit(":", 1)[-1]  # "Answer: (1+2)*3" -> "(1+2)*3"
    return line.strip().strip("$").rstrip(".").strip()


def countdown_score(
    completion: str, numbers: list[int], target: int, *, extract: str = "auto", partial: float = 0.0
) -> float:
    """1.0 for a correct expression; `partial` for a well-formed one using the numbers that misses."""
    expr = extract_expression(completion, extract)
    if not expr:
        return 0.0
    if "=" in expr:
        parts = expr.split("=")
        if len(parts) != 2:
            return 0.0
        expr, rhs = parts
        try:
            rhs_value, rhs_numbers = evaluate(rhs)
        except ExprError:
            return 0.0
        if len(rhs_numbers) != 1 or rhs_value != target:
            return 0.0
    try:
        value, used = evaluate(expr)
    except ExprError:
        return 0.0
    if sorted(used) != sorted(int(n) for n in numbers):
        return 0.0
    return 1.0 if value == target else partial


def countdown_answer_found(completion: str, extract: str = "auto") -> bool:
    """Whether `completion` holds a well-formed expression (`expr` or `expr = number`) under `extract`:
    False is "no parsable answer" in the evaluation's extraction report; a well-formed expression that
    misses the target or the numbers is "wrong"."""
    expr = extract_expression(completion, extract)
    if not expr:
        return False
    try:
        for part in expr.split("="):
            evaluate(part)
    except ExprError:
        return False
    return expr.count("=") <= 1


def make_countdown(extract: str = "auto", partial: float = 0.0):
    """Build the `countdown` reward.

    extract: "auto" (answer tag, else last non-empty line) or "answer_tag" (tag required).
    partial: score for a well-formed expression that uses exactly the given numbers but misses the
    target (default 0).
    """
    if extract not in ("auto", "answer_tag"):
        raise ConfigError(f"countdown: extract must be 'auto' or 'answer_tag', got {extract!r}")
    if not isinstance(partial, (int, float)) or isinstance(partial, bool) or not 0 <= partial <= 1:
        raise ConfigError(f"countdown: partial must be a number in [0, 1], got {partial!r}")

    def countdown_reward(completion: str, example: Example) -> float:
        meta = example.meta
        if "numbers" not in meta or "target" not in meta:
            raise ValueError("countdown reward needs example.meta['numbers'] and ['target']")
        return countdown_score(
            completion, list(meta["numbers"]), int(meta["target"]), extract=extract, partial=float(partial)
        )

    countdown_reward.answer_found = lambda completion, example: countdown_answer_found(completion, extract)  # type: ignore[attr-defined]
    return countdown_reward
