"""Reward functions in TRL's form that only check what grpolab hands them, and an environment grpolab refuses."""

import random


def system_first(prompts, **kwargs):
    """1 where the prompt starts with the system message a SkyRL environment's init() put there."""
    return [float(p[0]["role"] == "system" and p[0]["content"] == "Answer with one word.") for p in prompts]


def varied(completions, **kwargs):
    """A reward that varies with the conversation, so that groups are not all equal."""
    return [float(sum(len(m["content"]) for m in c) % 3) for c in completions]


class OwnGeneratorEnv:
    """Draws its task from a generator of its own: the G trajectories of a group get different tasks."""

    def __init__(self):
        self.rng = random.Random()

    def reset(self, **kwargs):
        return f"What is {self.rng.randint(0, 10**9)} + 1?"

    def get_reward(self) -> float:
        return 0.0
