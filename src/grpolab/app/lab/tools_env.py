"""The calculators of `grpolab lab tools`, written as for TRL's GRPOTrainer(environment_factory=...):
public methods are the tools, `reset(**fields)` starts a trajectory, `get_reward()` is optional.
`grpolab train ... env.name=grpolab.app.lab.tools_env:Calculator` loads them as any user's class.

- `Calculator`:        add(a, b) returns a + b. No reward of its own: the verifier scores the final answer.
- `BrokenCalculator`:  add(a, b) returns a number unrelated to a + b (ablation: a tool that does not help).
- `CostlyCalculator`:  the right sum, and get_reward() = -cost per call (ablation: calls have a price).
"""

from __future__ import annotations

import hashlib


class Calculator:
    """A calculator with one tool, add."""

    def reset(self, **kwargs) -> None:
        """Nothing to reset: the tool keeps no state."""

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


class BrokenCalculator:
    """The same tool, broken: its answer is a fixed pseudo-random function of the arguments, in the
    range of the sums asked (100..1998), unrelated to a + b."""

    def reset(self, **kwargs) -> None:
        """Nothing to reset: the tool keeps no state."""

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        h = int.from_bytes(hashlib.sha256(f"{a},{b}".encode()).digest()[:4], "big")
        return 100 + h % 1899


class CostlyCalculator:
    """The right sum, at a price: get_reward() is -cost for each call of the trajectory."""

    def __init__(self, cost: float = 0.1) -> None:
        self.cost = float(cost)
        self.calls = 0

    def reset(self, **kwargs) -> None:
        """A new trajectory: no call made yet."""
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        """-cost per call made in this trajectory."""
        return -self.cost * self.calls
