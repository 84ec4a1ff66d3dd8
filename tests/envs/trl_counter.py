"""Environments and reward functions written as a TRL user writes them for GRPOTrainer's
environment_factory (nothing here knows grpolab): public methods are tools, reset(**row) starts a
trajectory and may write the prompt, get_reward() is the environment's reward, and reward functions
read the trajectories' instances through `environments` along with the dataset's columns.

The sync tool limits itself with signal.alarm, as TRL's examples/scripts/grpo_agent.py limits its SQL
tool: that works only on the main thread, where TRL runs sync tools.
"""

import asyncio
import random
import signal
from contextlib import contextmanager


@contextmanager
def time_limit(seconds):
    def on_alarm(signum, frame):
        raise TimeoutError(f"timed out after {seconds} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)


def text_of(prompt):
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    return " ".join(m["content"] for m in prompt)


class CounterEnv:
    def __init__(self):
        self.count = 0.0
        self.reward = 0.0

    def reset(self, **kwargs):
        self.count = 0.0
        self.reward = 0.0
        self.level = kwargs.get("level")
        self.goal = random.randint(1, 3)
        if not text_of(kwargs.get("prompt")).strip():  # no prompt in the data: the environment writes it
            return f"Reach {self.goal} with the increment tool."
        return f" Reach {self.goal}."

    def increment(self, step: float) -> float:
        """
        Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter after the addition.
        """
        with time_limit(2):
            self.count += step
        self.reward = 1.0 if self.count == self.goal else 0.0
        return self.count

    async def peek(self) -> float:
        """
        Read the counter.

        Returns:
            The counter.
        """
        await asyncio.sleep(0)
        return self.count

    def get_reward(self) -> float:
        return self.count


class ParityEnv:
    def reset(self, **kwargs):
        self.level = kwargs.get("level")
        self.goal = random.randint(1, 3)
        self.reward = 0.0
        return f" Reach {self.goal}: is it even?"

    def is_even(self, n: int) -> bool:
        """
        Tell whether a number is even.

        Args:
            n: The number.
        """
        self.reward = 1.0
        return n % 2 == 0

    def get_reward(self) -> float:
        return self.reward


def reward_func(environments, **kwargs):
    return [env.reward for env in environments]


def level_seen(environments, prompts, level=None, **kwargs):
    """1 where the instance saw the row's `level` column in reset and the prompt holds what reset wrote."""
    return [
        float(env.level == lv and f"Reach {env.goal}" in text_of(p))
        for env, lv, p in zip(environments, level or [None] * len(environments), prompts)
    ]


def routed_right(environments, environment, **kwargs):
    """1 where the row's `environment` column picked the instance's class."""
    return [float(type(env).__name__.lower().startswith(name)) for env, name in zip(environments, environment)]
