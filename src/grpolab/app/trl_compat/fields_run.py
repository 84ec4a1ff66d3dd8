"""The mapping table, the fields around the steps: how a run starts (tf32, full_determinism), evaluates
(eval_delay), saves (save_only_model, enable_jit_checkpoint) and resumes (ignore_data_skip,
resume_from_checkpoint), the loss and optimizer options GRPO does not read (label_smoothing_factor, optim_args,
optim_target_modules), and transformers' continuous batching for generation. Each entry is what transformers
5.x's TrainingArguments and Trainer, and TRL 1.16's GRPOTrainer, do with the field; grpolab.app.trl_compat.fields_hf
and grpolab.app.trl_compat.fields place them in TRL's order."""

from __future__ import annotations

import math

from grpolab.app.trl_compat.entries import Entry, fail, ignore, same, value_of
from grpolab.app.trl_compat.fields_model import NOTES
from grpolab.app.trl_compat.fields_precision import tf32_setting


def _eval_delay(v, a) -> dict:
    """eval_delay with eval_strategy='steps': transformers' DefaultFlowCallback evaluates at an optimizer step g
    only when eval_delay <= g; grpolab's step s ends at g = s x per (per: updates_per_step), so s >= eval_delay
    / per: eval_delay = ceil(eval_delay / per) steps (exact: evaluations only fall at whole steps). 0 or less,
    or another strategy ('no'; 'epoch' is refused by eval_strategy): nothing."""
    from grpolab.app.trl_compat.steps import updates_per_step

    if value_of(a["eval_strategy"]) != "steps" or not v or float(v) <= 0:
        return {}
    return {"eval_delay": math.ceil(float(v) / updates_per_step(a))}


def _optim_args(v, a) -> dict:
    """optim_args, read as transformers' _parse_optim_args reads it ("k1=v1,k2=v2", spaces dropped; an item
    without exactly one `=` is its ValueError, raised here as ConfigError before the run). The optimizers
    grpolab has (optim adamw_torch, adamw_torch_fused) take none of them in transformers: _get_adamw_torch
    builds AdamW from learning_rate, adam_beta1/2 and adam_epsilon alone."""
    if not v:
        return {}
    for item in str(v).replace(" ", "").split(","):
        if item.count("=") != 1:
            raise fail(
                "optim_args",
                v,
                f"transformers reads comma-separated key=value items and fails on {item!r}; "
                f"AdamW reads none of them, so leave it unset",
            )
    return {}


def _continuous_batching(v, a) -> dict:
    """use_transformers_continuous_batching (or use_transformers_paged, which TRL turns into it): TRL generates
    with transformers' generate_batch under the GenerationConfig model.generate gets (the same temperature,
    top_p, top_k, min_p, repetition_penalty, max_completion_length, generation_kwargs); with use_vllm, vLLM
    generates instead. transformers_continuous_batching_config is checked as TRL builds it:
    ContinuousBatchingConfig(max_memory_percent=0.5, **config). grpolab's rollout engine samples with those
    settings; TRL's path also casts the model's weights in place to bf16 (bf16, TRL's default) or fp16 before
    generating, so that TRL trains them in that dtype: grpolab keeps fp32 weights (a note says so)."""
    if not (v or a.get("use_transformers_paged")):
        return {}
    config = a.get("transformers_continuous_batching_config")
    if config is not None and not isinstance(config, dict):
        raise fail("transformers_continuous_batching_config", config, "expected a dict (TRL reads it with dict(...))")
    from transformers.generation import ContinuousBatchingConfig

    try:
        ContinuousBatchingConfig(**{"max_memory_percent": 0.5, **(config or {})})
    except (TypeError, ValueError) as e:
        raise fail(
            "transformers_continuous_batching_config", config, f"not transformers' ContinuousBatchingConfig ({e})"
        ) from e
    note = "use_transformers_continuous_batching=True: grpolab's rollout engine samples with the same settings"
    bf16 = a.get("bf16") if a.get("bf16") is not None else not a.get("fp16")
    cast = "bf16" if bf16 else "fp16" if a.get("fp16") else None
    if cast and not a.get("use_vllm"):
        note += (
            f"; TRL would also cast the model's weights to {cast} in place before its first generation and train "
            f"them so, where grpolab keeps fp32 weights and computes in {cast}"
        )
    return {NOTES: [note]}


TF32 = Entry(
    "tf32",
    None,
    "map",
    "tf32",
    tf32_setting,
    "Set at the run's start as transformers sets it: True -> TF32 matmuls and convolutions on a CUDA GPU of the "
    "Ampere generation or newer, refused elsewhere (a CPU) with transformers' error; False -> off; None -> torch's "
    "setting as it is, but on such a GPU torch_compile (fp16 off) turns it on, as transformers does.",
)
EVAL_DELAY = Entry(
    "eval_delay",
    0,
    "map",
    "eval_delay",
    _eval_delay,
    "With eval_strategy='steps': no evaluation before this many optimizer steps (transformers: eval_delay <= "
    "global_step), in grpolab's steps ceil(eval_delay / (num_iterations x steps_per_generation / "
    "gradient_accumulation_steps)); grpolab's evaluations before and after training stay.",
)
SAVE_ONLY_MODEL = same(
    "save_only_model",
    "save_only_model",
    False,
    "True: checkpoints (and OUT/checkpoint-N) without the optimizer, scheduler and RNG states, as transformers "
    "writes them; from_pretrained loads them. Resuming from one is refused (exit 2), where transformers' Trainer "
    "goes on silently with a fresh optimizer, schedule and RNG.",
)
ENABLE_JIT_CHECKPOINT = ignore(
    "enable_jit_checkpoint",
    False,
    "grpolab always does what True does: on SIGTERM (and SIGINT) the running step finishes, a checkpoint is "
    "written and the run stops, exit 143 (grpolab.training.stops); TRL checkpoints 3 s after the signal at the "
    "next step boundary",
)
IGNORE_DATA_SKIP = same(
    "ignore_data_skip",
    "ignore_data_skip",
    False,
    "True: a resumed run (train(resume_from_checkpoint=...)) over epochs starts the epoch it was in again from its "
    "first row, as transformers' Trainer does; False: it takes the rows it would have taken.",
)
FULL_DETERMINISM = same(
    "full_determinism",
    "full_determinism",
    False,
    "True: transformers' enable_full_determinism(seed) at the run's start: torch.use_deterministic_algorithms, "
    "cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:16:8 and the other variables it sets.",
)
RESUME_FROM_CHECKPOINT = ignore(
    "resume_from_checkpoint",
    None,
    "stored only, as in TRL, whose Trainer never reads it: scripts pass it on, "
    "trainer.train(resume_from_checkpoint=args.resume_from_checkpoint), which grpolab's GRPOTrainer takes "
    "(on the command line: grpolab train --resume OUTPUT_DIR)",
)
LABEL_SMOOTHING_FACTOR = ignore(
    "label_smoothing_factor",
    0.0,
    "TRL's GRPOTrainer.compute_loss (its own GRPO loss) never calls the label smoother the Trainer makes for it",
)
OPTIM_ARGS = Entry(
    "optim_args",
    None,
    "map",
    "(not read by AdamW)",
    _optim_args,
    "Parsed as transformers parses it (key=value items, a malformed one refused); transformers' AdamW "
    "(adamw_torch, adamw_torch_fused: the optimizers grpolab has) reads none of its keys.",
)
OPTIM_TARGET_MODULES = ignore(
    "optim_target_modules",
    None,
    "read only by the GaLore and APOLLO optimizers (their projected layers); with AdamW, the one grpolab has "
    "(optim refuses the others), TRL reads it neither",
)
CONTINUOUS_BATCHING = Entry(
    "use_transformers_continuous_batching",
    False,
    "map",
    "(the rollout engine)",
    _continuous_batching,
    "True: TRL samples with transformers' generate_batch, the same sampling settings as generate; grpolab's rollout "
    "engine samples with them. TRL's path also casts the model's weights to bf16 (bf16) or fp16 in place before "
    "generating, so TRL goes on training them in that dtype; grpolab keeps fp32 weights (a note says so).",
)
CONTINUOUS_BATCHING_CONFIG = Entry(
    "transformers_continuous_batching_config",
    None,
    "map",
    "(the rollout engine)",
    lambda v, a: {},
    "Read with use_transformers_continuous_batching and checked as TRL builds transformers' "
    "ContinuousBatchingConfig; its knobs (cache pages, memory share, CUDA graphs, compilation) are that engine's.",
)
TRANSFORMERS_PAGED = Entry(
    "use_transformers_paged",
    False,
    "map",
    "(the rollout engine)",
    lambda v, a: {},
    "Deprecated in TRL, which turns it into use_transformers_continuous_batching=True (read there).",
)

__all__ = [
    "CONTINUOUS_BATCHING",
    "CONTINUOUS_BATCHING_CONFIG",
    "ENABLE_JIT_CHECKPOINT",
    "EVAL_DELAY",
    "FULL_DETERMINISM",
    "IGNORE_DATA_SKIP",
    "LABEL_SMOOTHING_FACTOR",
    "OPTIM_ARGS",
    "OPTIM_TARGET_MODULES",
    "RESUME_FROM_CHECKPOINT",
    "SAVE_ONLY_MODEL",
    "TF32",
    "TRANSFORMERS_PAGED",
]
