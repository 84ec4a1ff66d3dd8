"""The mapping table, part 1: the fields TRL's GRPOConfig inherits from transformers' TrainingArguments
(with TRL 1.16's own defaults for logging_steps, gradient_checkpointing, bf16), in TRL's order.
See grpolab.app.trl_compat.entries for the kinds of entry."""

from __future__ import annotations

from grpolab.app.trl_compat.entries import Entry, fail, ignore, refuse, same, to, value_of
from grpolab.app.trl_compat.fields_best import BEST_FIELDS
from grpolab.app.trl_compat.fields_fsdp import FSDP_FIELDS
from grpolab.app.trl_compat.fields_parallel import PARALLELISM_FIELD
from grpolab.app.trl_compat.fields_precision import (
    bf16_setting,
    fp16_setting,
    read_with_torch_compile,
    torch_compile_setting,
)
from grpolab.app.trl_compat.fields_run import (
    ENABLE_JIT_CHECKPOINT,
    EVAL_DELAY,
    FULL_DETERMINISM,
    IGNORE_DATA_SKIP,
    LABEL_SMOOTHING_FACTOR,
    OPTIM_ARGS,
    OPTIM_TARGET_MODULES,
    RESUME_FROM_CHECKPOINT,
    SAVE_ONLY_MODEL,
    TF32,
)
from grpolab.app.trl_compat.fields_schedule import scheduler, scheduler_kwargs
from grpolab.app.trl_compat.steps import generation_split, global_batch, to_steps, updates_per_step

HUB = "grpolab never contacts the Hugging Face Hub; upload output_dir (or save_model's directory) yourself"
LOGS = (
    "grpolab writes every step's metrics to output_dir/metrics.jsonl (and the trackers report_to names); "
    "this only formats or spaces transformers' log lines"
)
LOADER = "grpolab reads the rows in the main process, without a torch DataLoader; this changes no row or order"
DDP = (
    "tuning of transformers' DDP wrapper; grpolab's data parallelism (torchrun) sums gradients itself "
    "(docs/distributed.md)"
)
EVAL_LOOP = "a knob of transformers' prediction loop; grpolab's evaluation generates and scores (eval_dataset)"
NOT_TRAINING = "a flag read by example scripts, not by the trainer"


def _batch(v, a) -> dict:
    """TRL's optimizer batch is per_device_train_batch_size x processes x gradient_accumulation_steps
    completions and its generation batch per_device_train_batch_size x processes x steps_per_generation
    (processes: torchrun's WORLD_SIZE); grpolab's batch_size is completions per generation over all
    processes, algo.steps_per_generation its optimizer updates, and micro_batch each process's
    forward/backward slice."""
    spg, updates = generation_split(a)
    out = {"micro_batch": int(a["per_device_train_batch_size"]), "batch_size": global_batch(a) * spg}
    if updates != 1:
        out["algo.steps_per_generation"] = updates
    return out


def _max_steps(v, a) -> dict:
    return {"steps": -1 if int(v) < 0 else to_steps("max_steps", v, a)}


def _warmup(v, a) -> dict:
    if isinstance(v, float) and 0 < v < 1:  # transformers 5: a float below 1 is a ratio of the run
        return {"warmup_ratio": v}
    if v != int(v) or v < 0:
        raise fail("warmup_steps", v, "expected a whole number of optimizer steps >= 0, or a ratio in (0, 1)")
    return {"warmup_steps": to_steps("warmup_steps", v, a)}


def _betas(v, a) -> dict:
    return {"adam_betas": [float(a["adam_beta1"]), float(a["adam_beta2"])]}


def _only(name: str, allowed: tuple, why: str):
    def convert(v, a) -> dict:
        if value_of(v) not in allowed:
            raise fail(name, value_of(v), why)
        return {}

    return convert


def _report_to(v, a) -> dict:
    names = [] if v in (None, "none") else [v] if isinstance(v, str) else [x for x in v if x != "none"]
    return {"report_to": names or ["none"]}


def _eval_strategy(v, a) -> dict:
    v = value_of(v)
    if v == "no":
        return {}
    if v == "steps":
        n = a.get("eval_steps") or a["logging_steps"]
        if isinstance(n, float) and n < 1:
            raise fail("eval_steps", n, "a ratio of the run is not available; give a whole number of steps")
        return {"eval_steps": to_steps("eval_steps", n, a)}
    raise fail(
        "eval_strategy", v, "grpolab evaluates every eval_steps steps; use eval_strategy='steps' and eval_steps=N"
    )


def _save_strategy(v, a) -> dict:
    v = value_of(v)
    steps = a["save_steps"]
    if v == "no":
        return {"save_every": 0}
    if v == "steps":
        if not isinstance(steps, int) and not float(steps).is_integer():
            raise fail("save_steps", steps, "grpolab saves every N steps; give a whole number")
        return {"save_every": to_steps("save_steps", steps, a)}
    if v == "best":  # the best model: read with load_best_model_at_end (grpolab.app.trl_compat.fields_best)
        return {}
    raise fail("save_strategy", v, "grpolab saves every save_steps steps and at the end; use 'steps' or 'no'")


def _sampling_strategy(v, a) -> dict:
    if v == "random":
        return {}
    if v == "sequential":
        return {"shuffle": False}
    raise fail(
        "train_sampling_strategy",
        v,
        "grpolab visits the rows in seeded random epochs ('random') or in order ('sequential')",
    )


TRAINING_ARGUMENTS: list[Entry] = [
    Entry(
        "output_dir",
        None,
        "map",
        "out",
        to("out", lambda v: str(v) if v is not None else "trainer_output"),
        "The run directory (metrics.jsonl, config.yaml, checkpoints/); TRL's None is trainer_output.",
    ),
    Entry(
        "per_device_train_batch_size",
        8,
        "map",
        "micro_batch, batch_size",
        _batch,
        "Completions per forward/backward pass; batch_size = this x steps_per_generation (TRL's "
        "generation_batch_size; by default x gradient_accumulation_steps).",
    ),
    same("num_train_epochs", "num_train_epochs", 3.0, "Seeded, shuffled epochs over every training row."),
    Entry(
        "max_steps",
        -1,
        "map",
        "steps",
        _max_steps,
        "-1: the epochs decide the number of steps, as in TRL. TRL counts optimizer steps, grpolab "
        "generations: steps = max_steps / (num_iterations x steps_per_generation / gradient_accumulation_steps).",
    ),
    same("learning_rate", "lr", 1e-06),
    Entry(
        "lr_scheduler_type",
        "linear",
        "map",
        "lr_scheduler",
        scheduler,
        "linear: decay to 0 at the last optimizer step; cosine, constant, constant_with_warmup, "
        "cosine_with_restarts, polynomial, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, "
        "warmup_stable_decay: transformers' schedules, the same numbers; reduce_lr_on_plateau and greedy are refused.",
    ),
    Entry(
        "lr_scheduler_kwargs",
        None,
        "map",
        "lr_scheduler_kwargs",
        scheduler_kwargs,
        "The schedule's options, as transformers names them (cosine_with_min_lr: min_lr or min_lr_rate; "
        "num_cycles, lr_end, power, timescale, warmup_lr_rate, num_decay_steps, ...); a dict or its JSON text.",
    ),
    Entry(
        "warmup_steps",
        0,
        "map",
        "warmup_steps (warmup_ratio below 1)",
        _warmup,
        "Optimizer steps of linear warm-up (grpolab's warmup_steps counts generations: divided by "
        "num_iterations x steps_per_generation / gradient_accumulation_steps); a float in (0, 1) is a "
        "ratio of the optimizer steps (transformers 5).",
    ),
    Entry(
        "optim",
        "adamw_torch_fused",
        "map",
        "(AdamW)",
        _only(
            "optim",
            ("adamw_torch_fused", "adamw_torch"),
            "grpolab trains with torch's AdamW (fused where it applies); other optimizers are not available",
        ),
        "adamw_torch_fused and adamw_torch are grpolab's AdamW; other optimizers are refused.",
    ),
    OPTIM_ARGS,
    same("weight_decay", "weight_decay", 0.0),
    Entry("adam_beta1", 0.9, "map", "adam_betas[0]", _betas),
    Entry("adam_beta2", 0.999, "map", "adam_betas[1]", _betas),
    Entry(
        "adam_epsilon",
        1e-08,
        "map",
        "(AdamW eps 1e-8)",
        _only("adam_epsilon", (1e-08,), "grpolab's AdamW uses torch's eps 1e-8 and has no setting for it"),
        "Only 1e-8 (torch's AdamW default, which grpolab uses) is accepted.",
    ),
    OPTIM_TARGET_MODULES,
    Entry(
        "gradient_accumulation_steps",
        1,
        "map",
        "batch_size",
        _batch,
        "Micro-batches per optimizer step (with steps_per_generation: algo.steps_per_generation = "
        "steps_per_generation / this).",
    ),
    ignore(
        "average_tokens_across_devices",
        True,
        "grpolab's token-level losses already divide by the tokens of the whole batch over every process",
    ),
    same("max_grad_norm", "max_grad_norm", 1.0),
    LABEL_SMOOTHING_FACTOR,
    Entry(
        "bf16",
        None,
        "map",
        "precision",
        bf16_setting,
        "None (TRL: bf16 unless fp16) -> precision=auto: bf16 autocast on a bf16 GPU, on a CPU only where "
        "measured faster; True -> bf16; False -> fp32. Weights stay fp32, as in TRL.",
    ),
    Entry(
        "fp16",
        False,
        "map",
        "precision",
        fp16_setting,
        "True on a CUDA GPU -> precision=fp16: fp16 autocast, the loss scaled by torch.amp.GradScaler (an "
        "overflowing update skipped, the scale kept in checkpoints), weights fp32, as TRL; on a CPU (use_cpu=True, "
        "or no GPU) -> precision=fp32, as TRL trains it there (accelerate has no fp16 autocast on a CPU); on MPS "
        "refused (use bf16=True).",
    ),
    ignore("bf16_full_eval", False, EVAL_LOOP),
    ignore("fp16_full_eval", False, EVAL_LOOP),
    TF32,
    same("gradient_checkpointing", "grad_checkpointing", True, "TRL's default is on."),
    ignore(
        "gradient_checkpointing_kwargs",
        None,
        "grpolab checkpoints each decoder layer (non-reentrant); "
        "the kwargs choose a torch.utils.checkpoint variant, same gradients",
    ),
    Entry(
        "torch_compile",
        False,
        "map",
        "compile",
        torch_compile_setting,
        "True (or a backend or mode given) -> compile=true: torch.compile of the policy's decoder layers in the "
        "update (the first update compiles; on a CPU inductor needs a C++ compiler); refused with "
        "gradient_checkpointing=True, TRL's default (grpolab's checkpointed layers cannot be compiled): set it False.",
    ),
    Entry("torch_compile_backend", None, "map", "compile_backend", read_with_torch_compile, "None -> inductor."),
    Entry("torch_compile_mode", None, "map", "compile_mode", read_with_torch_compile, "None -> default."),
    refuse("use_liger_kernel", False, "grpolab has no Liger kernels (its own lm_head pass is chunked)"),
    refuse("liger_kernel_config", None, "grpolab has no Liger kernels"),
    ignore("use_cache", False, "the rollout always decodes with a KV cache and the training pass never keeps one"),
    same(
        "neftune_noise_alpha",
        "neftune_alpha",
        None,
        "NEFTune: U(-1, 1) x alpha / sqrt(L d) on the input embeddings of the update's passes, as transformers' "
        "hook; not on rollouts (TRL's transformers-generate rollouts are noised, its vLLM ones are not).",
    ),
    ignore("torch_empty_cache_steps", None, "only when the CUDA cache is emptied; no value changes"),
    refuse("auto_find_batch_size", False, "TRL refuses it for GRPO too (the batch must hold whole groups)"),
    ignore("logging_strategy", "steps", LOGS),
    ignore("logging_steps", 10, LOGS + " (also eval_steps' default, read there)"),
    ignore("logging_first_step", False, LOGS),
    ignore("log_on_each_node", True, LOGS),
    ignore(
        "logging_nan_inf_filter", True, LOGS + "; a non-finite update is skipped and counted (update/nonfinite_skipped)"
    ),
    ignore("include_num_input_tokens_seen", "no", LOGS + " (tokens/generated is logged every step)"),
    ignore("log_level", "passive", LOGS),
    ignore("log_level_replica", "warning", LOGS),
    Entry(
        "disable_tqdm",
        None,
        "map",
        "progress",
        to("progress", lambda v: not (tqdm_disabled_by_logging() if v is None else v)),
        "True: no progress bar; None (TRL's default): off when transformers' logging is quieter than warnings.",
    ),
    Entry(
        "report_to",
        "none",
        "map",
        "report_to",
        _report_to,
        "Trackers (tensorboard, wandb, mlflow, trackio, all; grpolab's run offline/locally unless the "
        "tracker's variable says otherwise); TRL's default 'none' writes no TensorBoard events.",
    ),
    Entry(
        "run_name",
        None,
        "map",
        "run_name",
        to("run_name", lambda v: "" if v is None else str(v)),
        "The run's name in the trackers; None: the output_dir's name.",
    ),
    same("project", "project", "huggingface", "The W&B project, MLflow experiment and trackio project."),
    refuse("trackio_space_id", None, HUB),
    refuse("trackio_bucket_id", None, HUB),
    refuse("trackio_static_space_id", None, HUB),
    Entry(
        "eval_strategy",
        "no",
        "map",
        "eval_steps",
        _eval_strategy,
        "steps: evaluate eval_dataset every eval_steps (default logging_steps) steps.",
    ),
    Entry(
        "eval_steps",
        None,
        "map",
        "eval_steps",
        lambda v, a: {},
        "Read with eval_strategy (optimizer steps, converted to generations as max_steps).",
    ),
    EVAL_DELAY,
    Entry("per_device_eval_batch_size", 8, "map", "eval_batch", to("eval_batch", int)),
    ignore("prediction_loss_only", False, EVAL_LOOP),
    ignore("eval_on_start", False, "grpolab scores eval_dataset before the first step whenever one is given"),
    ignore("eval_do_concat_batches", True, EVAL_LOOP),
    ignore("eval_use_gather_object", False, EVAL_LOOP),
    ignore("eval_accumulation_steps", None, EVAL_LOOP),
    ignore("include_for_metrics", [], EVAL_LOOP),
    ignore("batch_eval_metrics", False, EVAL_LOOP),
    SAVE_ONLY_MODEL,
    Entry(
        "save_strategy",
        "steps",
        "map",
        "save_every (save_best)",
        _save_strategy,
        "steps: a checkpoint every save_steps steps; no: only the final one (grpolab always writes it); "
        "best: the best model by metric_for_best_model (save_best; see load_best_model_at_end).",
    ),
    Entry(
        "save_steps",
        500,
        "map",
        "save_every",
        lambda v, a: {},
        "Read with save_strategy (optimizer steps, converted to generations as max_steps).",
    ),
    ignore("save_on_each_node", False, "only rank 0 writes checkpoints, to output_dir"),
    Entry(
        "save_total_limit",
        None,
        "map",
        "keep_checkpoints",
        to("keep_checkpoints", lambda v: 0 if v is None or int(v) <= 0 else int(v)),
        "None (TRL's default) or <= 0 keeps every checkpoint (keep_checkpoints=0), as transformers' Trainer does; "
        "grpolab's own default keeps the last (keep_checkpoints=1). The best model is kept besides.",
    ),
    ENABLE_JIT_CHECKPOINT,
    refuse("push_to_hub", False, HUB),
    refuse("hub_token", None, HUB),
    refuse("hub_private_repo", None, HUB),
    refuse("hub_model_id", None, HUB),
    refuse("hub_strategy", "every_save", HUB),
    refuse("hub_always_push", False, HUB),
    refuse("hub_revision", None, HUB),
    *BEST_FIELDS,  # load_best_model_at_end, metric_for_best_model, greater_is_better
    IGNORE_DATA_SKIP,
    ignore("restore_callback_states_from_checkpoint", False, "callbacks keep no state in grpolab's checkpoints"),
    FULL_DETERMINISM,
    same("seed", "seed", 42),
    same("data_seed", "data_seed", None, "Seeds the epochs' row order; None: seed."),
    Entry("use_cpu", False, "map", "device", to("device", lambda v: "cpu" if v else "auto")),
    ignore("accelerator_config", None, "grpolab does not run under accelerate"),
    PARALLELISM_FIELD,  # parallelism_config
    ignore("dataloader_drop_last", False, LOADER),
    ignore("dataloader_num_workers", 0, LOADER),
    ignore("dataloader_pin_memory", True, LOADER),
    ignore("dataloader_persistent_workers", False, LOADER),
    ignore("dataloader_prefetch_factor", None, LOADER),
    ignore("dataloader_multiprocessing_context", None, LOADER),
    ignore("dataloader_in_order", True, LOADER),
    Entry(
        "remove_unused_columns",
        False,
        "map",
        "(every column)",
        _only(
            "remove_unused_columns",
            (False, None),
            "grpolab passes every column of a row to the reward "
            "functions as keyword arguments, as TRL's GRPO does with the default False",
        ),
        "Every column reaches the reward functions as keyword arguments.",
    ),
    ignore("label_names", None, "GRPO has no labels"),
    Entry(
        "train_sampling_strategy",
        "random",
        "map",
        "shuffle",
        _sampling_strategy,
        "random: seeded shuffled epochs; sequential: the data's order.",
    ),
    ignore("length_column_name", "length", "only for group_by_length sampling, which grpolab does not use"),
    ignore("ddp_find_unused_parameters", None, DDP),
    ignore("ddp_bucket_cap_mb", None, DDP),
    ignore("ddp_broadcast_buffers", None, DDP),
    ignore("ddp_static_graph", None, DDP),
    ignore("ddp_backend", None, DDP + "; the backend is nccl on CUDA, gloo on a CPU"),
    ignore("ddp_timeout", 1800, DDP),
    *FSDP_FIELDS,  # fsdp, fsdp_config
    refuse("deepspeed", None, "grpolab has no DeepSpeed integration; use fsdp=true under torchrun"),
    ignore("debug", "", "transformers' debugging switches (underflow detection, TPU metrics)"),
    ignore("skip_memory_metrics", True, "grpolab logs memory/peak_mb every step"),
    ignore("do_train", False, NOT_TRAINING),
    ignore("do_eval", False, NOT_TRAINING),
    ignore("do_predict", False, NOT_TRAINING),
    RESUME_FROM_CHECKPOINT,
    ignore("local_rank", -1, "set by the launcher; grpolab reads torchrun's environment"),
]

__all__ = ["TRAINING_ARGUMENTS", "generation_split", "to_steps", "updates_per_step"]


def tqdm_disabled_by_logging() -> bool:
    """transformers' TrainingArguments.disable_tqdm when left None: logger.getEffectiveLevel() > logging.WARN,
    read from the transformers.training_args logger (the standard library's, so transformers need not be loaded)."""
    import logging

    return logging.getLogger("transformers.training_args").getEffectiveLevel() > logging.WARN
