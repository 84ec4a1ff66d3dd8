"""Plain data passed between the pieces of a training step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A usage error: a bad key, type or value. The CLI turns it into exit code 2."""


@dataclass(frozen=True)
class Example:
    """One task item.

    prompt: the user message shown to the model (the chat template is applied by the rollout).
    answer: the reference answer as a string (what a verifier compares against).
    meta:   task-specific data for verifiers (countdown numbers/target, code tests, tool spec...).
    id:     a stable identifier, for samples.jsonl.
    """

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = ""
