"""The contract between the multi-turn rollout loop and an environment: one object per trajectory.

The loop drives each trajectory's environment like this:

    env = make_env()                     # a zero-argument factory (see loading.load_environment)
    extra = env.reset(example_fields)    # text appended to the last user message, the whole prompt
                                         # as a list of messages (SkyRL-gym's init), or None
    render the prompt, with env.tools as the tool schemas shown to the model
    loop:
        the model writes a turn
        reply = env.step(turn_text)      # what the environment adds after the model's turn
        append reply.messages; count reply.events and reply.calls
        if reply.done (or max_turns / the token budget is spent): stop
    r = env.reward()                     # the environment's own reward, or None
    env.close()                          # optional: hands pooled resources back

`reset` may be called again on the same object for a new example: an environment must not carry
state from one trajectory to the next. The loop calls every trajectory's reset in the calling thread,
with Python's `random` (and numpy's global generator, when numpy is loaded) seeded by `seeded(
example_seed(fields))`, so that the G trajectories of one example draw the same task from an
environment that makes its own (as TRL's "the environment writes the prompt" form does).

An optional attribute `user_env` names the object a TRL-form reward function receives in its
`environments` argument for this trajectory (the user's instance inside an adapter; None for plain
tool functions); without it, the environment itself. Many trajectories' `step` calls run concurrently (in
threads, see runner.run_turns), each on its own object.

`Reply.messages` are chat messages in the usual form: `{"role": "tool", "name": ..., "content": ...}`
for tool results, `{"role": "user", "content": ...}` for feedback. When `done` is True no model turn
follows; messages given with it belong to the conversation's record (the report shows them) and
the loop need not render them for the model.
"""

from __future__ import annotations

import contextlib
import random
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ERROR_KINDS = ("parse", "unknown_tool", "bad_arguments", "exception", "timeout", "truncated")
"""The kinds counted in Reply.events when a call or an environment step goes wrong."""


class EnvConfigError(ValueError):
    """Base of this package's configuration errors: an environment that cannot be found or used."""


class EnvironmentShapeError(EnvConfigError):
    """An object that is not any of the environment shapes accepted, or breaks one of them."""


@dataclass
class Reply:
    """What an environment adds after one model turn.

    messages: chat messages to append after the model's turn (tool results, user feedback).
    done: True when the trajectory ends here (no further model turn).
    events: error kinds counted this step (see ERROR_KINDS; environments may add their own).
    calls: calls per tool name this step (only names of tools the environment offers).
    parsed: the tool calls parsed from the turn (ToolCall / ParseError), for the record and
        for rendering the assistant message's tool_calls; empty for environments without tools.
    values: index in `messages` -> the value a tool returned, where it returned a list: the reward
        functions read it as the message's content (TRL passes a list through), the model the text.
    """

    messages: list[dict] = field(default_factory=list)
    done: bool = False
    events: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    parsed: list = field(default_factory=list)
    values: dict = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One trajectory's environment, as the rollout loop sees it (see the module docstring)."""

    tools: list[dict]
    """OpenAI function schemas shown to the model (may be empty)."""

    def reset(self, fields: dict) -> str | list[dict] | None:
        """Start a trajectory for an example (its fields); text to append to the user message, or the
        whole prompt as chat messages."""
        ...

    def step(self, turn_text: str) -> Reply:
        """The model's turn in; what the environment adds, and whether the trajectory ends."""
        ...

    def reward(self) -> float | None:
        """The environment's own reward for the trajectory so far (None: it gives none)."""
        ...


def is_environment(obj: Any) -> bool:
    """True if `obj` (an instance or a class) already has the Environment interface.

    Checked by shape: callable reset, step and reward, and a `tools` attribute. A gym-style
    environment has no `reward` method and no `tools`, so the two are not confused.
    """
    has_tools = hasattr(obj, "tools") or "tools" in getattr(obj, "__annotations__", {})
    return all(callable(getattr(obj, m, None)) for m in ("reset", "step", "reward")) and has_tools


def close_environment(env: Any) -> None:
    """Call env.close() if it has one (optional in the contract)."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def user_env(env: Any) -> Any:
    """What a TRL-form reward function's `environments` holds for this trajectory (see the module docstring)."""
    return getattr(env, "user_env", env)


def example_seed(fields: dict) -> int:
    """A seed for one example, the same for each of its G trajectories: its `seed` field if it is an
    int, else the CRC-32 of its id (an example without either gets 0)."""
    seed = fields.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed & 0x7FFFFFFF
    return zlib.crc32(str(fields.get("id", "")).encode("utf-8")) & 0x7FFFFFFF


@contextlib.contextmanager
def seeded(seed: int):
    """Python's `random` (and numpy's global generator, if numpy is already imported) seeded with `seed`
    inside the block, and put back as they were after it: the caller's streams are not disturbed."""
    state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)
        if np is not None:
            np.random.set_state(np_state)
