"""Tools and reward functions written as TRL's examples/scripts/grpo_agent.py writes them (nothing here
knows grpolab): standalone tool functions passed as tools=[...] with no environment class, the sync one
limiting itself with signal.alarm, and reward functions that walk each completion's turns for parsed
`tool_calls`, their arguments and `tool` messages, and read the last turn's content.
"""

import asyncio
import signal
from contextlib import contextmanager


class TimeoutError(Exception):
    """Raised when a function call times out."""


@contextmanager
def timeout(seconds):
    def timeout_handler(signum, frame):
        raise TimeoutError(f"Operation timed out after {seconds} seconds")

    signal.signal(signal.SIGALRM, timeout_handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)


def increment(step: float) -> float:
    """
    Add one to a number.

    Args:
        step: The number.

    Returns:
        The number plus one.
    """
    with timeout(5):
        return step + 1


async def peek() -> str:
    """
    Say what the increment tool does.

    Returns:
        A description.
    """
    await asyncio.sleep(0)
    return "it adds one"


TOOLS = [increment, peek]


def structure_reward(completions, **kwargs):
    rewards = []
    for completion in completions:
        has_call = has_response = False
        for turn in completion:
            if turn.get("role") == "assistant" and turn.get("tool_calls"):
                has_call = True
            elif turn.get("role") == "tool":
                has_response = True
        rewards.append(0.1 if has_call and has_response else -0.15 if has_call else 0.0)
    return rewards


def argument_reward(completions, **kwargs):
    rewards = []
    for completion in completions:
        steps = []
        for turn in completion:
            if turn.get("tool_calls"):
                for call in turn["tool_calls"]:
                    steps.append(call["function"]["arguments"].get("step", 0))
        rewards.append(float(sum(steps)))
    return rewards


def correctness_reward(completions, answer, **kwargs):
    return [float(completion[-1]["content"].strip() == ans) for completion, ans in zip(completions, answer)]
