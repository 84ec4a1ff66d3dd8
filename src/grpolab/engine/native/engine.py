"""grpolab's own decode loop as a rollout engine: it samples from the policy itself, so there is
nothing to sync and its sampling log-probs are the trainer's (up to float rounding between the
cached decoding and a full pass).

It owns what its callers used to decide: the lean decode step or the model's own forward
(grpolab.engine.native.decoder.lean_decodes), the rollout's autocast dtype, and FSDP's unsharding of the policy
for the whole rollout (grpolab.parallel.fsdp.gathered)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from grpolab.batch import Rollout
from grpolab.engine.base import Sampling, TurnLimits
from grpolab.engine.native.decoder import lean_decodes, model_type_of
from grpolab.engine.native.generate import generate
from grpolab.engine.native.turns import Respond, Trajectory, generate_turns
from grpolab.model.precision import NAMES
from grpolab.parallel.fsdp import gathered


class NativeEngine:
    name = "native"
    samples_from_trainer = True

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        *,
        device: torch.device,
        dtype: torch.dtype | None,
        decoder: str,
        eos_ids: set[int],
    ):
        self.policy, self.tokenizer, self.dtype, self.eos_ids = policy, tokenizer, dtype, eos_ids
        self.lean = lean_decodes(decoder, model_type_of(policy), dtype, device.type)
        self.version = 0

    def describe(self) -> str:
        how = "lean decode step" if self.lean else "the model's own forward"
        return f"native ({how}, {NAMES[self.dtype]})"

    def together(self) -> AbstractContextManager:
        """Nothing: each process decodes on its own policy."""
        return nullcontext()

    def generate(
        self, prompt_ids: list[list[int]], sampling: Sampling, *, G: int, generator: torch.Generator | None = None
    ) -> Rollout:
        with gathered(self.policy):  # FSDP: unsharded once, not all-gathered per token
            rollout = generate(
                self.policy,
                self.tokenizer,
                prompt_ids,
                G=G,
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                greedy=sampling.greedy,
                autocast_dtype=self.dtype,
                generator=generator,
                eos_ids=self.eos_ids,
                lean=self.lean,
                filters=sampling.filters,
            )
        rollout.version = self.version
        return rollout

    def generate_turns(
        self,
        prompt_ids: list[list[int]],
        respond: Respond,
        sampling: Sampling,
        limits: TurnLimits,
        *,
        G: int,
        generator: torch.Generator | None = None,
    ) -> tuple[Rollout, list[Trajectory]]:
        with gathered(self.policy):
            rollout, trajs = generate_turns(
                self.policy,
                self.tokenizer,
                prompt_ids,
                respond,
                G=G,
                max_turn_tokens=limits.max_turn_tokens,
                max_model_tokens=limits.max_model_tokens,
                max_env_tokens=limits.max_env_tokens,
                max_turns=limits.max_turns,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                greedy=sampling.greedy,
                autocast_dtype=self.dtype,
                generator=generator,
                eos_ids=self.eos_ids,
                lean=self.lean,
                filters=sampling.filters,
            )
        rollout.version = self.version
        return rollout, trajs

    def release(self) -> None:
        """Nothing held between rollouts: each rollout's KV cache and bf16 weights are freed when it ends."""

    def sync(self, policy: nn.Module, version: int) -> float:
        """Nothing to copy: the next rollout runs on the policy's weights as they are."""
        self.version = version
        return 0.0

    def close(self) -> None:
        pass
