"""The seam between a training step and whatever samples its rollouts.

    engine.generate(prompt_ids, sampling, G=G, generator=g)          -> Rollout (N = B*G rows)
    engine.generate_turns(prompt_ids, respond, sampling, limits, ...) -> (Rollout, trajectories)
    engine.release()               after a step's rollouts: memory the update does not need, freed until sync
    engine.sync(policy, version)   after every optimizer step: the engine samples from these weights
    with engine.together(): ...    an operation some of the processes sharing an engine make alone
    engine.close()

Token ids in, token ids out: grpolab renders the chat template and tokenises; an engine never decodes
and re-encodes the model's tokens. Every Rollout carries the log-prob of each sampled token under the
engine's sampling distribution (after the repetition penalty, temperature, top-k, top-p and min-p) and
the policy version that sampled it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from grpolab.batch import Rollout
from grpolab.engine.native.sampling import Filters
from grpolab.engine.native.turns import Respond, Trajectory


@dataclass(frozen=True)
class Sampling:
    """How to draw tokens: the same for every engine."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    top_k: int = 0
    """0 or -1: off."""
    min_p: float = 0.0
    """0: off."""
    repetition_penalty: float = 1.0
    """1: off."""
    extra: dict = field(default_factory=dict)
    """Further engine options (generation_kwargs beyond the keys above): vLLM's SamplingParams fields;
    the native engine takes none (grpolab.engine.settings.check_generation_kwargs refuses them first)."""

    @property
    def filters(self) -> Filters:
        """top_k, min_p and repetition_penalty as the native sampler's Filters."""
        return Filters(self.top_k, self.min_p, self.repetition_penalty)


@dataclass(frozen=True)
class TurnLimits:
    """The limits of one multi-turn trajectory (env.* keys; grpolab.engine.native.turns.generate_turns)."""

    max_turn_tokens: int
    max_model_tokens: int
    max_env_tokens: int
    max_turns: int


class RolloutEngine(Protocol):
    name: str
    samples_from_trainer: bool
    """True when the sampled log-probs are the trainer's own (the same weights, the same code): the
    KL-in-reward shortcut may read them, and no importance correction applies."""
    version: int
    """Optimizer steps taken by the weights it samples from."""

    def generate(
        self, prompt_ids: list[list[int]], sampling: Sampling, *, G: int, generator: torch.Generator | None = None
    ) -> Rollout: ...

    def generate_turns(
        self,
        prompt_ids: list[list[int]],
        respond: Respond,
        sampling: Sampling,
        limits: TurnLimits,
        *,
        G: int,
        generator: torch.Generator | None = None,
    ) -> tuple[Rollout, list[Trajectory]]: ...

    def release(self) -> None:
        """Free what the engine holds only for sampling (vLLM's KV cache on a CPU) until the next sync or
        rollout, which restore it: the update, where a step's memory peaks, runs without it."""
        ...

    def sync(self, policy: nn.Module, version: int) -> float: ...

    def together(self) -> AbstractContextManager:
        """One operation whose generate calls the processes sharing this engine make in different numbers
        (an evaluation rank 0 alone runs): every process enters it, and on leaving serves the others' calls
        until all have left (grpolab.engine.vllm_group). An engine of this process alone: nothing."""
        ...

    def close(self) -> None: ...
