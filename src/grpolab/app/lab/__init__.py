"""grpolab lab: each claim of the lesson as a command that measures it.

    grpolab lab                 # list the claims
    grpolab lab CLAIM --help    # a claim's options
    grpolab lab baseline        # measure it: a short table of numbers and a one-line verdict

LABS maps a claim's name to (the claim in one line, run function). A run function takes the claim's
argv, prints its table (grpolab.app.lab.tables) and verdict, and returns a dict of the measured numbers (with "verdict").
"""

from __future__ import annotations

from collections.abc import Callable

from grpolab.app.lab import aha, baseline, critic_claim, curves, g1, kl_claim, memory, passk, scale, tools

LABS: dict[str, tuple[str, Callable[[list[str]], dict]]] = {
    "baseline": (baseline.CLAIM, baseline.run),
    "g1": (g1.CLAIM, g1.run),
    "scale": (scale.CLAIM, scale.run),
    "memory": (memory.CLAIM, memory.run),
    "curves": (curves.CLAIM, curves.run),
    "aha": (aha.CLAIM, aha.run),
    "critic": (critic_claim.CLAIM, critic_claim.run),
    "kl": (kl_claim.CLAIM, kl_claim.run),
    "tools": (tools.CLAIM, tools.run),
    "passk": (passk.CLAIM, passk.run),
}

last_result: dict = {}
"""The numbers of the most recent lab run through the CLI (for tests and notebooks)."""
