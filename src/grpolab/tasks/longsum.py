"""Long sums of one-digit numbers, for the aha miniature (`grpolab lab aha`): "3+5+7+2=" -> "17".

The prompt is the bare expression ending in "=" (the miniature's character-level model has no chat
template, so the rollout feeds the prompt text as it is). The verifier is `math` with
extract=last_number: the last number of the completion must equal the sum. Nothing rewards length,
format or the working: a direct "17" and a running sum "3+5=8,8+7=15,15+2=17" score the same 1.0.

Three ways of writing a solution, used to build the pre-training texts (`solution`):
    direct:   the sum guessed at once ("17"), right or wrong;
    steps:    the running sum, one addition at a time ("3+5=8,8+7=15,15+2=17"): the last number is the sum;
    reflect:  the same with one slip, then " wait " and the step redone ("3+5=8,8+7=14 wait 8+7=15,15+2=17").

Options (`task_args`):
    min_terms, max_terms: number of one-digit terms (1..9 each), drawn uniformly (default 4..6; 2..12).
    eval_size:            held-out problems (default 64).
"""

from __future__ import annotations

import random

from grpolab.batch import Example
from grpolab.tasks._args import check_int
from grpolab.util.fields import ConfigError

STYLES = ("direct", "steps", "reflect")
REFLECTION_MARKER = " wait "


def running_sums(terms: list[int]) -> list[int]:
    out, s = [], 0
    for t in terms:
        s += t
        out.append(s)
    return out[1:]  # the first "sum" is the first term itself: not written


def solution(terms: list[int], style: str, rng: random.Random, *, direct_accuracy: float = 1 / 3) -> str:
    """A completion for `terms` in `style` (see the module docstring). A direct guess is right with
    probability `direct_accuracy`, otherwise off by 1..3 either way (never negative)."""
    total = sum(terms)
    if style == "direct":
        if rng.random() < direct_accuracy:
            return str(total)
        return str(max(0, total + rng.choice([-3, -2, -1, 1, 2, 3])))
    sums = [terms[0]] + running_sums(terms)  # s_0 = t_0, s_k = s_(k-1) + t_k
    steps = [f"{sums[k - 1]}+{terms[k]}={sums[k]}" for k in range(1, len(terms))]
    if style == "steps":
        return ",".join(steps)
    if style == "reflect":
        k = rng.randrange(1, len(terms))
        slip = max(0, sums[k] + rng.choice([-2, -1, 1, 2]))
        steps[k - 1] = f"{sums[k - 1]}+{terms[k]}={slip}{REFLECTION_MARKER}{sums[k - 1]}+{terms[k]}={sums[k]}"
        return ",".join(steps)
    raise ValueError(f"style must be one of {STYLES}, got {style!r}")


def style_of(completion: str) -> str:
    """Which way a completion is written: reflect (has the marker), steps (several numbers), direct."""
    if REFLECTION_MARKER.strip() in completion:
        return "reflect"
    return "steps" if "=" in completion else "direct"


class LongSumTask:
    name = "longsum"
    system_prompt = None

    def __init__(self, seed: int, min_terms: int = 4, max_terms: int = 6, eval_size: int = 64):
        self.seed = seed
        self.min_terms = check_int("min_terms", min_terms, 2, 12)
        self.max_terms = check_int("max_terms", max_terms, 2, 12)
        if self.min_terms > self.max_terms:
            raise ConfigError(f"task_args.min_terms: must be <= max_terms, got {min_terms} > {max_terms}")
        self.eval_size = check_int("eval_size", eval_size, 0, 10_000)
        self.default_rewards = [{"name": "math", "weight": 1.0, "extract": "last_number"}]
        rng = random.Random(f"grpolab/longsum/eval/{seed}")
        seen: set[str] = set()
        self._eval = []
        while len(self._eval) < self.eval_size:
            ex = self._problem(rng, seen)
            seen.add(ex.meta["question"])
            self._eval.append(ex)
        self._eval_questions = frozenset(seen)

    def draw_terms(self, rng: random.Random) -> list[int]:
        return [rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms))]

    def _problem(self, rng: random.Random, exclude) -> Example:
        while True:
            terms = self.draw_terms(rng)
            question = "+".join(map(str, terms))
            if question not in exclude:
                return Example(
                    prompt=question + "=",
                    answer=str(sum(terms)),
                    meta={"question": question, "terms": terms},
                    id=f"longsum:{question}",
                )

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """`n` training problems (never a held-out one)."""
        return [self._problem(rng, self._eval_questions) for _ in range(n)]

    def eval_set(self) -> list[Example]:
        return list(self._eval)
