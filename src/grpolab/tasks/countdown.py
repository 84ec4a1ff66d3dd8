"""Countdown (TinyZero-style): reach the target using each given number exactly once with + - * /.

Generation builds a random expression tree over the drawn numbers with exact `Fraction` arithmetic
(repeatedly combine two of the remaining values with a random operator) and keeps it when the
result is an integer inside `target_range`. So every problem is solvable by construction and the
stored `answer` is one solution that uses every number once, e.g. numbers [3, 7, 25, 4], target 69,
answer "(25 - 7) * 4 - 3".

Held-out split: a problem is identified by (sorted numbers, target). `eval_set()` draws `eval_size`
distinct problems with an RNG fixed by the task seed; `sample()` redraws any of those.

Options (`task_args`):
    n_numbers:      how many numbers, an int (2..6) or a range [lo, hi]; default [3, 4].
    number_range:   [lo, hi] for each number (default [1, 99], lo >= 1).
    target_range:   [lo, hi] for the target (default [1, 100]).
    operators:      a subset of "+-*/" (default "+-*/").
    integer_steps:  keep every intermediate value a non-negative integer (default True): division
                    only when exact, subtraction only when not negative. False allows any Fraction.
    eval_size:      size of the held-out set (default 64).
    template:       a preset name (see TEMPLATES) or a format string with {numbers} and {target}.
    system_prompt:  str, or None for the chat template's default (default None).

meta = {"numbers": [...], "target": int}; the countdown reward checks a completion against it.
"""

from __future__ import annotations

import random
from fractions import Fraction

from grpolab.batch import Example
from grpolab.tasks._args import (
    check_bool,
    check_int,
    check_optional_str,
    check_range,
    parse_operators,
    resolve_template,
)
from grpolab.util.fields import ConfigError

TEMPLATES: dict[str, str] = {
    # TinyZero's prompt, reworded slightly.
    "tinyzero": (
        "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
        "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your "
        "reasoning in <think> </think> tags. And return the final equation in <answer> </answer> "
        "tags, for example <answer> (1 + 2) / 3 </answer>."
    ),
    # Shorter, for small models and short completions.
    "short": (
        "Use each of the numbers {numbers} exactly once, with + - * / and parentheses, to make "
        "{target}. Think inside <think></think>, then write only the equation inside "
        "<answer></answer>."
    ),
}

OPERATORS = "+-*/"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _combine(a: Fraction, b: Fraction, op: str) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _wrap(expr: str, prec: int, parent: int, right: bool, parent_op: str) -> str:
    """Parenthesise a child expression where precedence (or - and / on the right) needs it."""
    if prec == 3:  # a bare number
        return expr
    if prec < parent or (right and prec == parent and parent_op in "-/"):
        return f"({expr})"
    return expr


class CountdownTask:
    name = "countdown"

    def __init__(
        self,
        seed: int,
        n_numbers=(3, 4),
        number_range=(1, 99),
        target_range=(1, 100),
        operators: str = OPERATORS,
        integer_steps: bool = True,
        eval_size: int = 64,
        template: str = "tinyzero",
        system_prompt: str | None = None,
    ):
        self.seed = seed
        self.n_numbers = check_range("n_numbers", n_numbers, 2, 6)
        self.number_range = check_range("number_range", number_range, 1)
        self.target_range = check_range("target_range", target_range, 0)
        self.operators = parse_operators(operators, OPERATORS)
        self.integer_steps = check_bool("integer_steps", integer_steps)
        self.eval_size = check_int("eval_size", eval_size, 0, 100_000)
        self.template = resolve_template(template, TEMPLATES, fields=("numbers", "target"))
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.default_rewards = [{"name": "format", "weight": 0.1}, {"name": "countdown", "weight": 1.0}]

        # Fail early (ConfigError, not a hang) when the options admit (almost) no problem.
        probe = random.Random(0)
        if self._try_problem(probe, frozenset(), attempts=5000) is None:
            raise ConfigError(
                "task_args: could not generate a countdown problem with these options; widen "
                "target_range or number_range, or allow more operators"
            )
        self._eval = self._make_eval_set()
        self._eval_keys = frozenset(self._key(ex.meta["numbers"], ex.meta["target"]) for ex in self._eval)
        if self._try_problem(random.Random(1), self._eval_keys, attempts=20_000) is None:
            raise ConfigError(
                f"task_args.eval_size: holding out {self.eval_size} problems leaves (almost) none for "
                "training with these options; lower eval_size or widen the ranges"
            )

    @staticmethod
    def _key(numbers: list[int], target: int) -> tuple:
        return (tuple(sorted(numbers)), target)

    def _try_problem(self, rng: random.Random, exclude, attempts: int) -> Example | None:
        lo_t, hi_t = self.target_range
        for _ in range(attempts):
            k = rng.randint(*self.n_numbers)
            numbers = [rng.randint(*self.number_range) for _ in range(k)]
            # Items: (value, expression text, precedence of its top operator; 3 for a number).
            items = [(Fraction(x), str(x), 3) for x in numbers]
            ok = True
            while len(items) > 1:
                i, j = rng.sample(range(len(items)), 2)
                (a, ea, pa), (b, eb, pb) = items[i], items[j]
                op = rng.choice(self.operators)
                value = _combine(a, b, op)
                if value is None or (self.integer_steps and (value.denominator != 1 or value < 0)):
                    ok = False
                    break
                p = _PREC[op]
                expr = f"{_wrap(ea, pa, p, False, op)} {op} {_wrap(eb, pb, p, True, op)}"
                items = [it for n, it in enumerate(items) if n not in (i, j)] + [(value, expr, p)]
            if not ok:
                continue
            value, expr, _ = items[0]
            if value.denominator != 1 or not lo_t <= value <= hi_t:
                continue
            target = int(value)
            if self._key(numbers, target) in exclude:
                continue
            shown = list(numbers)
            rng.shuffle(shown)  # the order in the prompt says nothing about the solution
            return Example(
                prompt=self.template.format(numbers=shown, target=target),
                answer=expr,
                meta={"numbers": shown, "target": target},
                id=f"countdown:{','.join(map(str, sorted(numbers)))}={target}",
            )
        return None

    def _problem(self, rng: random.Random, exclude) -> Example:
        ex = self._try_problem(rng, exclude, attempts=1_000_000)
        if ex is None:  # pragma: no cover - the constructor's probe makes this unreachable in practice
            raise RuntimeError("countdown: could not generate a problem")
        return ex

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """`n` training problems drawn with `rng` (never one of the held-out problems)."""
        return [self._problem(rng, self._eval_keys) for _ in range(n)]

    def _make_eval_set(self) -> list[Example]:
        rng = random.Random(f"grpolab/countdown/eval/{self.seed}")
        seen: set = set()
        out = []
        misses = 0
        while len(out) < self.eval_size:
            ex = self._try_problem(rng, seen, attempts=10_000)
            if ex is None:
                misses += 1
            else:
                seen.add(self._key(ex.meta["numbers"], ex.meta["target"]))
                out.append(ex)
            if misses > 10:
                raise ConfigError(
                    f"task_args.eval_size: could not find {self.eval_size} distinct problems "
                    f"with these options (found {len(out)}); lower eval_size or widen the ranges"
                )
        return out

    def eval_set(self) -> list[Example]:
        """The fixed held-out problems (same list for the same seed and options)."""
        return list(self._eval)
