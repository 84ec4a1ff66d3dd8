"""task=env: no dataset; the environment writes every prompt (TRL's GRPOTrainer with
`train_dataset=None` and an `environment_factory` whose reset returns the task).

Each example is an empty prompt with an id: the trajectory's reset(**fields) returns the text that
becomes the user message. Training ids are drawn from the step's random stream, so each step asks for
new tasks; the held-out ids are fixed by the seed (`eval_size` of them). The environment's reset runs
with Python's `random` seeded from the id (grpolab.env.base.seeded), so the G trajectories of one
example get one task and a run is reproducible. No reference answers: the default rewards are none
but the environment's own.
"""

from __future__ import annotations

import random

from grpolab.batch import Example
from grpolab.tasks._args import check_optional_int, check_optional_str
from grpolab.util.fields import ConfigError


class EnvironmentTask:
    name = "env"

    def __init__(
        self, seed: int, eval_size: int | None = 16, system_prompt: str | None = None, environment: bool = False
    ):
        if not environment:
            raise ConfigError(
                "task=env: the environment writes the prompts, so it needs one: set env.name "
                "(or env.factories), e.g. env.name=envs.py:MyEnv, whose reset() returns the task"
            )
        check_optional_int("eval_size", eval_size, 0)
        self.seed = seed
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.default_rewards: list[dict] = []
        self.eval_size = 16 if eval_size is None else eval_size

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """`n` empty prompts with new ids from the step's stream."""
        return [Example(prompt="", answer="", id=f"env-{rng.getrandbits(48):012x}") for _ in range(n)]

    def eval_set(self) -> list[Example]:
        """`eval_size` empty prompts with ids fixed by the seed."""
        return [Example(prompt="", answer="", id=f"env-eval-{self.seed}-{i}") for i in range(self.eval_size)]
