"""MCP environments built on OpenEnv itself (openenv-core: MCPEnvironment, FastMCP tools), in the shape of
OpenEnv's echo_env, plus an environment that walks through its own questions on each reset(). Nothing here
knows grpolab."""

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment(MCPEnvironment):
    """echo_env's shape: two MCP tools on a FastMCP server, EchoObservation from reset."""

    def __init__(self):
        mcp = FastMCP("echo_env")

        @mcp.tool
        def echo_message(message: str) -> str:
            """Echo back the provided message."""
            return message

        @mcp.tool
        def echo_with_length(message: str) -> dict:
            """Echo back the message with its length."""
            return {"message": message, "length": len(message)}

        @mcp.tool
        def split_words(message: str) -> list[str]:
            """The message's words, as a list."""
            return message.split()

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.resets = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.resets += 1
        return EchoObservation(echoed_message="Echo environment ready!", done=False, reward=0.0)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return EchoObservation(echoed_message="Unknown action type", done=False, reward=0.0)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


class NoToolsEnvironment(MCPEnvironment):
    """An MCP environment whose server has no tool."""

    def __init__(self):
        super().__init__(FastMCP("empty"))

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        return Observation()

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()


QUESTIONS = ["What is 1+1?", "What is 2+2?", "What is 3+3?"]
ANSWERS = ["2", "4", "6"]


class AnswerAction(Action):
    answer: str


class QuestionObservation(Observation):
    question: str = ""


class QuizEnvironment(MCPEnvironment):
    """Serves its questions in order: each reset() moves to the next one (OpenEnv environments that own
    their dataset do this). The `submit` tool scores the answer and ends the episode."""

    def __init__(self):
        mcp = FastMCP("quiz")

        @mcp.tool
        def submit(answer: str) -> str:
            """Submit the final answer."""
            self.correct = answer.strip() == ANSWERS[self.index % len(ANSWERS)]
            return "correct" if self.correct else "wrong"

        super().__init__(mcp)
        self.index = -1
        self.correct = False

    def reset(self, seed=None, episode_id=None, **kwargs) -> QuestionObservation:
        self.index += 1
        self.correct = False
        return QuestionObservation(question=QUESTIONS[self.index % len(QUESTIONS)])

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation()

    def step(self, action: Action, timeout_s=None, **kwargs) -> Observation:
        obs = super().step(action, timeout_s=timeout_s, **kwargs)
        if getattr(obs, "tool_name", None) == "submit" and obs.error is None:
            obs.reward, obs.done = (1.0 if self.correct else 0.0), True
        return obs

    @property
    def state(self) -> State:
        return State(step_count=max(self.index, 0))


def questions_seen(environments, **kwargs):
    """A TRL-form reward reading the instances: the index of the question each one served."""
    return [float(env.index) for env in environments]


unused = Field  # pydantic's Field, imported as OpenEnv's own environments do
