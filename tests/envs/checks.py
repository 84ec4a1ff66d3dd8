"""Reward functions in TRL's form that only check what grpolab hands them (not part of any environment)."""


def system_first(prompts, **kwargs):
    """1 where the prompt starts with the system message a SkyRL environment's init() put there."""
    return [float(p[0]["role"] == "system" and p[0]["content"] == "Answer with one word.") for p in prompts]


def varied(completions, **kwargs):
    """A reward that varies with the conversation, so that groups are not all equal."""
    return [float(sum(len(m["content"]) for m in c) % 3) for c in completions]
