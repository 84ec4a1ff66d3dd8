"""The `rollout.*` keys of a recipe: which engine samples the rollouts, its options, and the correction
of the gap between the engine that samples and the policy that trains. The sampling keys a recipe
already has (max_new_tokens, temperature, top_p, decoder) stay where they were, at the top level."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from grpolab.util.fields import ConfigError

RolloutEngine = Literal["auto", "native", "vllm"]
"""The `rollout.engine` setting (grpolab.engine.choose decides auto)."""
ENGINE_NAMES: tuple[str, ...] = typing.get_args(RolloutEngine)
Correction = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"]
"""The `rollout.correction` setting: a mode of grpolab.algo.sampler.CORRECTIONS."""
CORRECTIONS: tuple[str, ...] = typing.get_args(Correction)
VllmModelImpl = Literal["auto", "vllm", "transformers"]
"""The `rollout.vllm_model_impl` setting: vLLM's model_impl."""
Decoder = Literal["auto", "lean", "hf"]
"""The top-level `decoder` setting: how the native engine runs the model in a rollout (auto, the lean
decode step of grpolab.engine.native.decoder, or the model's own forward)."""


class EngineError(RuntimeError):
    """The engine failed to start or to take the new weights: the run stops, its last checkpoint intact."""


@dataclass
class RolloutConfig:
    """How rollouts are sampled (docs/performance.md, "Rollout engines")."""

    engine: RolloutEngine = "auto"
    """native (grpolab's own decode loop, on the policy itself), vllm (vLLM in this process, the `vllm` extra; weights synced after every optimizer step) or auto (vLLM where it is installed, supports the model and the run is long enough to repay its start-up; the first line of a run says which and why)."""
    vllm_eager: bool = False
    """vLLM: skip torch.compile and CUDA graphs (enforce_eager): a shorter start-up, slower tokens; docs/performance.md measures both."""
    vllm_kv_cache_gb: float = 0.0
    """vLLM on a CPU: memory for its KV cache in GiB; 0 (the default) sizes it to the run: the most sequences one generate call holds x (the completion budget + PROMPT_ALLOWANCE tokens), and at least one sequence of the model's full context (grpolab.engine.kv_cache)."""
    vllm_model_impl: VllmModelImpl = "auto"
    """vLLM: which implementation of the model it runs (LLM(model_impl=...)): vllm (its own), transformers (its Transformers backend: transformers' modeling code with vLLM's attention and KV cache, for an architecture vLLM lacks; TRL's vllm_model_impl) or auto (vLLM's own where it has one, else the Transformers backend). The trainer's models stay transformers' own whichever runs (grpolab.engine.vllm_classes)."""
    vllm_tensor_parallel_size: int = 1
    """vLLM under torchrun: the processes of the launch in groups of this many consecutive ranks, each group one vLLM with the model's weights sharded over its members (tensor parallelism; distributed_executor_backend="external_launcher", every member's prompts gathered and generated together, each keeping its own completions, as TRL's colocate mode with vllm_tensor_parallel_size). Must divide the number of processes; 1: each process its own vLLM (grpolab.engine.vllm_group)."""
    vllm_gpu_memory: float = 0.3
    """vLLM on a GPU: the share of the GPU's memory it may take (gpu_memory_utilization); the trainer shares the card."""
    structured_outputs_regex: str | None = None
    """vLLM only: every completion constrained to match this regular expression (vLLM's structured outputs, SamplingParams(structured_outputs=StructuredOutputsParams(regex=...)), as TRL's vllm_structured_outputs_regex), in training and evaluation rollouts alike; the native engine refuses it. The update's log-probs stay the policy's own, unconstrained: the correction below weighs the gap, as in TRL. null: off."""
    correction: Correction = "token_truncate"
    """Importance-sampling correction of the sampler/trainer mismatch when the engine is not the trainer (vllm): token_truncate (w_t = min(pi_old/pi_sampler, C), as verl's default), token_mask, sequence_truncate, sequence_mask (TRL 1.16's default) or none. The native engine samples from the trainer's own weights and needs none."""
    correction_clip: float = 2.0
    """C of the correction: the largest importance weight kept (truncate) or allowed (mask); verl uses 2, TRL 3."""
    correction_clip_min: float | None = None
    """C_min of the correction: the smallest importance weight kept (truncate: clipped up to it) or allowed (mask: a weight below it is 0); None: no lower bound (TRL's vllm_importance_sampling_clip_min)."""


def validate_rollout(r: RolloutConfig) -> None:
    """ConfigError (exit 2) naming the key for an impossible value."""
    checks = [
        (r.correction_clip >= 1.0, "rollout.correction_clip", "must be >= 1 (a weight of 1 is on-policy)"),
        (
            r.correction_clip_min is None or 0 <= r.correction_clip_min < r.correction_clip,
            "rollout.correction_clip_min",
            f"must be null or in [0, rollout.correction_clip = {r.correction_clip})",
        ),
        (r.vllm_kv_cache_gb >= 0, "rollout.vllm_kv_cache_gb", "must be >= 0 GiB (0: sized to the run)"),
        (0 < r.vllm_gpu_memory < 1, "rollout.vllm_gpu_memory", "must be in (0, 1)"),
        (r.vllm_tensor_parallel_size >= 1, "rollout.vllm_tensor_parallel_size", "must be >= 1 (1: a vLLM per process)"),
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
