# ruff: noqa: UP045 -- written in the style of the project it imitates (typing.Optional)
"""Environments written the way OpenEnv's are (meta-pytorch/OpenEnv, server side): pydantic Action,
Observation and State types and an Environment with reset(seed, episode_id) -> Observation,
step(action) -> Observation (which carries .reward and .done) and a `state` property. OpenEnv is not
installed here, so its small base types are restated below in its shape; nothing here knows grpolab.
"""

import random
from abc import ABC, abstractmethod
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Observation(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class State(BaseModel):
    model_config = ConfigDict(extra="allow", validate_assignment=True)
    episode_id: Optional[str] = None
    step_count: int = Field(default=0, ge=0)


class Environment(ABC):
    SUPPORTS_CONCURRENT_SESSIONS: bool = False

    def __init__(self, transform=None, rubric=None):
        self.transform = transform
        self.rubric = rubric

    @abstractmethod
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        """Reset the environment and return its first observation."""

    @abstractmethod
    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        """Take a step."""

    @property
    @abstractmethod
    def state(self) -> State:
        """The current state."""

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ a text action: the turn is the guess

WORDS = ["done", "node", "tone", "bone"]


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""


class WordGuessEnvironment(Environment):
    """Guess a four-letter word; the reward is the share of letters in the right place."""

    def __init__(self):
        super().__init__()
        self._state = State()
        self.secret = ""
        self.seeds = []

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.seeds.append(seed)
        self.secret = random.Random(seed).choice(WORDS)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess the four-letter word.")

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        word = "".join(c for c in action.guess.lower() if c.isalpha())[-4:]
        right = sum(a == b for a, b in zip(word, self.secret)) / 4
        done = right == 1.0 or self._state.step_count >= 2
        return GuessObservation(feedback=f"{int(right * 4)} letters in place.", reward=right, done=done)

    @property
    def state(self) -> State:
        return self._state


# -------------------------------------------------------------- a structured action: offered as a tool


class MoveAction(Action):
    """Move on the grid."""

    direction: Literal["up", "down", "left", "right"]
    steps: int = 1


class GridObservation(Observation):
    x: int = 0
    y: int = 0


class GridEnvironment(Environment):
    """Walk from (0, 0) to (0, 2); reward 1 on arrival."""

    def __init__(self):
        super().__init__()
        self._state = State()
        self.x = self.y = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> GridObservation:
        self.x = self.y = 0
        self._state = State(episode_id=episode_id)
        return GridObservation(x=0, y=0)

    def step(self, action: MoveAction, timeout_s=None, **kwargs) -> GridObservation:
        self._state.step_count += 1
        dx, dy = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}[action.direction]
        self.x, self.y = self.x + dx * action.steps, self.y + dy * action.steps
        arrived = (self.x, self.y) == (0, 2)
        return GridObservation(x=self.x, y=self.y, reward=1.0 if arrived else 0.0, done=arrived)

    @property
    def state(self) -> State:
        return self._state


def steps_taken(environments, **kwargs):
    """A TRL-form reward that reads the OpenEnv instances: their state's step count."""
    return [float(env.state.step_count) for env in environments]
