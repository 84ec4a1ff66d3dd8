"""Procedural arithmetic: "What is 23 + 48? Give the final answer as a number." -> "71".

The problem space is every expression with `n_operands` operands of the configured size joined by the
configured operators (standard precedence: `*` before `+`/`-`). A problem is identified by its
question text (`"23 + 48"`), so `3 + 4` and `4 + 3` are different problems.

Held-out split: `eval_set()` draws `eval_size` distinct problems with an RNG fixed by the task seed;
`sample()` never returns one of them (it redraws), so training and evaluation are disjoint. When the
space is small (single-digit sums have 100 problems) the default `eval_size` is lowered to half the
space, so that training keeps at least half; an explicit `eval_size` above half is a ConfigError.

Options (`task_args`):
    digits:          operand size in decimal digits (int >= 1; default 1). 1 means 0..9, d >= 2 means
                     10**(d-1) .. 10**d - 1.
    min_digits, max_digits: a range of operand sizes instead of `digits` (each operand draws its size
                     uniformly from the range, then its value uniformly among numbers of that size).
    operators:       a subset of "+-*" as a string ("+-") or a list (["+", "-"]); default "+".
    n_operands:      number of operands, 2..8 (default 2).
    allow_negative:  allow a negative final answer (default False: such problems are redrawn).
    eval_size:       size of the held-out set (default 64, lowered for small spaces as above).
    template:        the prompt: a preset name (see TEMPLATES) or a format string containing
                     {question}; default "short".
    system_prompt:   str, or None for the chat template's default system prompt (default None).
"""

from __future__ import annotations

import itertools
import random

from grpolab.batch import Example
from grpolab.tasks._args import check_bool, check_int, check_optional_str, parse_operators, resolve_template
from grpolab.util.fields import ConfigError

#: Prompt presets. `{question}` is the bare expression, e.g. "23 + 48".
TEMPLATES: dict[str, str] = {
    # Short, asks for the number: suits a last-number reward on a small instruct model.
    "short": "What is {question}? Give the final answer as a number.",
    # The bare question; lets the model phrase its reply freely.
    "plain": "What is {question}?",
    # Asks for only the number: shortest completions.
    "terse": "Compute {question}. Reply with only the number.",
    # Asks for a line of working before the number (longer completions, more room to improve).
    "steps": "What is {question}? Show your working briefly, then give the final answer as a number.",
    # The R1 / TinyZero structure, for use with a format reward.
    "tags": (
        "What is {question}? Think step by step inside <think></think>, then give the final answer "
        "as a number inside <answer></answer>."
    ),
}

OPERATORS = "+-*"
MAX_OPERANDS = 8
_EXACT_COUNT_LIMIT = 20_000  # enumerate spaces up to this many expressions to count them exactly


def evaluate(operands: list[int], operators: list[str]) -> int:
    """Exact value of `o0 op0 o1 op1 o2 ...` with `*` binding tighter than `+` and `-`."""
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def format_question(operands: list[int], operators: list[str]) -> str:
    parts = [str(operands[0])]
    for op, x in zip(operators, operands[1:]):
        parts += [op, str(x)]
    return " ".join(parts)


class ArithmeticTask:
    name = "arithmetic"

    def __init__(
        self,
        seed: int,
        digits: int = 1,
        min_digits: int | None = None,
        max_digits: int | None = None,
        operators="+",
        n_operands: int = 2,
        allow_negative: bool = False,
        eval_size: int | None = None,
        template: str = "short",
        system_prompt: str | None = None,
    ):
        self.seed = seed
        check_int("digits", digits, 1, 18)
        lo_d = digits if min_digits is None else check_int("min_digits", min_digits, 1, 18)
        hi_d = digits if max_digits is None else check_int("max_digits", max_digits, 1, 18)
        if min_digits is not None and max_digits is None:
            hi_d = max(lo_d, digits)
        if max_digits is not None and min_digits is None:
            lo_d = min(hi_d, digits)
        if lo_d > hi_d:
            raise ConfigError(f"task_args.min_digits: must be <= max_digits, got {lo_d} > {hi_d}")
        self.min_digits, self.max_digits = lo_d, hi_d
        self.operators = parse_operators(operators, OPERATORS)
        self.n_operands = check_int("n_operands", n_operands, 2, MAX_OPERANDS)
        self.allow_negative = check_bool("allow_negative", allow_negative)
        self.template = resolve_template(template, TEMPLATES)
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.default_rewards = [{"name": "math", "weight": 1.0, "extract": "last_number"}]

        self.space_size = self._count_space()  # exact when small, else a lower bound
        if self.space_size == 0:
            raise ConfigError(
                "task_args: no problem satisfies these options (every result is negative); "
                "set allow_negative: true or add '+' to operators"
            )
        max_eval = self.space_size // 2
        if eval_size is None:
            eval_size = min(64, max_eval)
        else:
            check_int("eval_size", eval_size, 0)
            if eval_size > max_eval:
                raise ConfigError(
                    f"task_args.eval_size: at most {max_eval} for these options (the problem space has "
                    f"{self.space_size} problems and training keeps at least half), got {eval_size}; "
                    "lower eval_size or widen digits / operators / n_operands"
                )
        self.eval_size = eval_size
        self._eval = self._make_eval_set()
        self._eval_questions = frozenset(ex.meta["question"] for ex in self._eval)

    # -- problem space -------------------------------------------------------------------------
    def _operand_values(self) -> range:
        lo = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        return range(lo, 10**self.max_digits)

    def _count_space(self) -> int:
        n_vals = len(self._operand_values())
        total = n_vals**self.n_operands * len(self.operators) ** (self.n_operands - 1)
        if self.allow_negative:
            return total
        if total > _EXACT_COUNT_LIMIT:
            # Large space: estimate the non-negative share by sampling (fixed RNG), a lower bound.
            rng = random.Random(0)
            hits = sum(evaluate(*self._draw(rng)) >= 0 for _ in range(2000))
            return total * hits // 4000  # half the estimate: a safe lower bound
        vals = self._operand_values()
        count = 0
        for ops in itertools.product(self.operators, repeat=self.n_operands - 1):
            for xs in itertools.product(vals, repeat=self.n_operands):
                count += evaluate(list(xs), list(ops)) >= 0
        return count

    def _draw(self, rng: random.Random) -> tuple[list[int], list[str]]:
        operands = []
        for _ in range(self.n_operands):
            d = rng.randint(self.min_digits, self.max_digits)
            lo = 0 if d == 1 else 10 ** (d - 1)
            operands.append(rng.randint(lo, 10**d - 1))
        ops = [rng.choice(self.operators) for _ in range(self.n_operands - 1)]
        return operands, ops

    def _problem(self, rng: random.Random, exclude: frozenset[str] | set[str]) -> Example:
        for _ in range(100_000):
            operands, ops = self._draw(rng)
            value = evaluate(operands, ops)
            if value < 0 and not self.allow_negative:
                continue
            question = format_question(operands, ops)
            if question in exclude:
                continue
            return Example(
                prompt=self.template.format(question=question),
                answer=str(value),
                meta={"question": question, "operands": operands, "operators": ops},
                id=f"arithmetic:{question.replace(' ', '')}",
            )
        raise ConfigError("task_args: could not draw a problem with these options; widen the problem space")

    # -- interface -----------------------------------------------------------------------------
    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """`n` training problems drawn with `rng` (never one of the held-out problems)."""
        return [self._problem(rng, self._eval_questions) for _ in range(n)]

    def _make_eval_set(self) -> list[Example]:
        rng = random.Random(f"grpolab/arithmetic/eval/{self.seed}")
        seen: set[str] = set()
        out = []
        while len(out) < self.eval_size:
            ex = self._problem(rng, seen)
            seen.add(ex.meta["question"])
            out.append(ex)
        return out

    def eval_set(self) -> list[Example]:
        """The fixed held-out problems (same list for the same seed and options)."""
        return list(self._eval)
