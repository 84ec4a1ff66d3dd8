"""One typed config: defaults here, a YAML recipe on top, then dotted KEY=VALUE overrides (read and merged
by grpolab.training.recipe).

Every field carries its documentation as a string literal right under it; `grpolab train --help`
reads those strings (`field_docs`), so the help and the code cannot drift apart.
"""

from __future__ import annotations

import copy
import dataclasses
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from grpolab.algo.presets import AlgoConfig, resolve_algo
from grpolab.algo.schedules import LrScheduler, schedule_options
from grpolab.engine.settings import Decoder, RolloutConfig, validate_rollout
from grpolab.env.settings import EnvConfig, validate_env
from grpolab.model.lora import LoraConfig, validate_lora
from grpolab.model.settings import CompileMode, DeviceSetting, PrecisionSetting
from grpolab.parallel.allocator import CpuMalloc
from grpolab.rewards.contract import RewardThread
from grpolab.training.config_checks import compile_checks, eval_checks
from grpolab.training.ranges import range_checks
from grpolab.training.recipe import deep_update, merge_into, parse_overrides
from grpolab.util.fields import ConfigError, choices, coerce_field, field_docs, field_types
from grpolab.util.fileio import atomic_write
from grpolab.util.threads import ThreadWait

Resume = Literal["never", "auto"]
"""The `resume` setting: whether the same command continues the run its `out` holds
(grpolab.training.metrics.check_out_dir reads it as `auto`)."""


@dataclass
class Config:
    """Everything a run needs. Top-level keys `out`, `steps`, `seed`, `model`, `task`, `algo` are stable."""

    out: str = "runs/demo"
    """Run directory: metrics.jsonl, samples.jsonl, config.yaml, TensorBoard events, checkpoints/."""
    steps: int = 30
    """Number of training steps (one rollout batch + `algo.mu` x `algo.steps_per_generation` optimizer updates each); -1 with num_train_epochs set: as many steps as the epochs take."""
    seed: int = 0
    """Seed for prompts, sampling and initialisation; the same seed gives the same run on the same machine."""
    full_determinism: bool = False
    """torch's deterministic algorithms from the run's start on, as transformers' enable_full_determinism sets them (TRL's full_determinism; grpolab.model.numerics): torch.use_deterministic_algorithms(True) (an operation without a deterministic implementation raises), cuDNN deterministic and not benchmarking, CUBLAS_WORKSPACE_CONFIG=:16:8, CUDA_LAUNCH_BLOCKING=1 and FLASH_ATTENTION_DETERMINISTIC=1 in the environment, python's and numpy's random seeded too. Slower on a GPU; the process keeps them after the run."""
    tf32: bool | None = None
    """TF32 for fp32 matmuls and convolutions, set at the run's start as transformers sets it (TRL's tf32; grpolab.model.numerics): true on a CUDA GPU of the Ampere generation or newer, and refused (exit 2) anywhere else, as transformers refuses it; false: IEEE fp32 (nothing to switch off without such a GPU); null: torch's setting as it is. The process keeps it after the run."""
    model: str = "smollm2-135m"
    """Policy model: `smollm2-135m` (the bundled SmolLM2-135M-Instruct GGUF), a local Hugging Face model directory, or a local .gguf file. Never downloaded."""
    task: str = "arithmetic"
    """Task: arithmetic, countdown, qa (local JSONL/parquet), code, tools, dataset (your own files: JSONL, CSV, parquet, a datasets directory), longsum (the lab aha miniature)."""
    task_args: dict[str, Any] = field(default_factory=dict)
    """Options of the task, e.g. `task_args.digits=2` (see the Tasks section of README.md)."""
    rewards: list[dict[str, Any]] = field(default_factory=list)
    """Reward functions as a list of {name, weight, ...options}; empty = the task's default rewards."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Policy-gradient method and its options, e.g. `algo=grpo algo.beta=0.04` (see docs/algorithms.md)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapter (peft, the `lora` extra): lora.r=16 trains a rank-16 adapter instead of every weight; the reference is then the policy with its adapter off (see the LoRA section of README.md)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Multi-turn environment (docs/agents.md): env.name=retry_arithmetic, a TRL environment class `file.py:Name`, tools or a gym-style class; empty = single-turn."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine: rollout.engine=native|vllm|auto, its options, and the sampler/trainer correction (see the Rollout engines section of README.md)."""
    G: int = 8
    """Completions sampled per prompt (the group size; num_generations in TRL). G=1 gives GRPO no signal."""
    batch_size: int = 32
    """Completions per step (= prompts per step x G); G must divide it."""
    micro_batch: int = 16
    """Sequences per forward/backward pass (gradient accumulation), rounded to whole groups of G (at least one group); only memory and speed depend on it."""
    grad_checkpointing: bool = False
    """Activation checkpointing of the policy's decoder layers in the update: each layer keeps only its input and is recomputed in the backward, for less memory per micro-batch and one more forward pass of the layers (grpolab.model.checkpointing; `grpolab plan` shows what it saves)."""
    compile: bool = False
    """torch.compile the policy's decoder layers in the update's forward and backward (grpolab.model.compiling; TRL's torch_compile). The first update pays the compilation, and each new shape of a micro-batch another (docs/performance.md, "compile=true"; on a CPU inductor needs a C++ compiler); later updates run compiled. Same gradients within float rounding. Refused with grad_checkpointing (its replay restores the layer's KV-cache slot from Python, which dynamo cannot trace: the layers would run eager) and with fsdp."""
    compile_backend: str = "inductor"
    """torch.compile's backend (TRL's torch_compile_backend): inductor, or another name torch._dynamo.list_backends() gives."""
    compile_mode: CompileMode = "default"
    """torch.compile's mode (TRL's torch_compile_mode)."""
    max_new_tokens: int = 32
    """Completion length limit in tokens; a completion that reaches it is flagged truncated."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling threshold of rollouts, in (0, 1]."""
    # --- sampling and template options of TRL's GRPOConfig (grpolab.engine.native.sampling) ---------------------
    top_k: int = 0
    """Top-k filter of rollouts: sample among the top_k most likely tokens; 0 or -1: off (TRL's default)."""
    min_p: float = 0.0
    """Min-p filter of rollouts (Nguyen et al. 2024): drop tokens less likely than min_p x the most likely one, in [0, 1); 0: off."""
    repetition_penalty: float = 1.0
    """CTRL repetition penalty of rollouts (transformers' RepetitionPenaltyLogitsProcessor): the logit z of every token already in the prompt or completion becomes z / p if z > 0, z * p otherwise; > 1 discourages repeats, 1: off."""
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    """More sampling options, as TRL's generation_kwargs: the keys temperature, top_p, top_k, min_p, repetition_penalty override the options above (for sampling and for the policy's log-probs alike); any other key goes to vLLM's SamplingParams (rollout.engine=vllm), and the native engine refuses it by name."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the tokenizer's apply_chat_template for every prompt and conversation rendered (TRL's chat_template_kwargs), e.g. chat_template_kwargs.enable_thinking=false."""
    lr: float = 2e-5
    """Peak learning rate of AdamW."""
    warmup_steps: int = 2
    """Linear warm-up of the learning rate over the first warmup_steps * algo.mu * algo.steps_per_generation optimizer updates (an update whose groups all have zero advantage counts, as in TRL; a non-finite update skipped, or a step dynamic sampling left empty, does not); what follows is lr_scheduler's."""
    # --- learning-rate schedule of TRL's GRPOConfig (grpolab.model.optim) ------------------------
    lr_scheduler: LrScheduler = "warmup_constant"
    """Learning-rate schedule over the run's steps * algo.mu * algo.steps_per_generation optimizer updates: warmup_constant (grpolab's: update i gets lr * min(1, (i + 1) / warmup), so the first update already learns), or one of transformers' get_scheduler schedules with the same numbers: linear (TRL's default), cosine, constant (no warm-up), constant_with_warmup, cosine_with_restarts, polynomial, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, warmup_stable_decay (grpolab.algo.schedules)."""
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)
    """The schedule's options, as transformers' lr_scheduler_kwargs: num_cycles (cosine, cosine_with_restarts), lr_end and power (polynomial), timescale (inverse_sqrt), min_lr or min_lr_rate (cosine_with_min_lr and cosine_warmup_with_min_lr need one), warmup_lr_rate, and num_decay_steps, num_stable_steps, warmup_type, decay_type, min_lr_ratio (warmup_stable_decay; steps are optimizer updates). A key the schedule does not take is refused by name."""
    warmup_ratio: float = 0.0
    """Warm-up as a share of the optimizer updates, ceil(warmup_ratio x updates), as transformers computes it; > 0 replaces warmup_steps. In [0, 1)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW (beta1, beta2)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables it."""
    max_nonfinite_updates: int = 3
    """An optimizer update whose loss or gradient norm is NaN/inf is skipped (the weights stay as they were) and counted in update/nonfinite_skipped; this many in a row stop the run, keeping the last good checkpoint."""
    device: DeviceSetting = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda (the current GPU) or cuda:N (the GPU of index N)."""
    precision: PrecisionSetting = "auto"
    """auto (fp32 on a CPU without bf16 instructions, decided from the CPU in milliseconds; elsewhere per phase: bf16 autocast where it measured at least 10% faster than fp32 on this machine, timed for a few seconds at start, remembered per machine and model shape in $GRPOLAB_CACHE/precision and kept on resume; bf16 on a bf16-capable GPU; docs/performance.md, "precision=auto"), bf16, fp16 (a CUDA GPU only: fp16 autocast, the update's loss scaled by torch.amp.GradScaler, an overflowing update skipped and counted in update/overflow_skipped, the scale saved in each checkpoint; refused on a CPU, where bf16 is the low precision) or fp32. Weights and optimizer state stay fp32."""
    lm_head_fp32: bool = False
    """The LM head of the update's and the reference's passes in fp32 under a bf16 autocast (its input cast to fp32, the matmul and log-softmax in fp32): the log-probs and the ratio without bf16 rounding in the logits, as ScaleRL recommends (TRL's cast_lm_head_to_fp32). With precision fp32 every pass is fp32 already."""
    neftune_alpha: float | None = None
    """NEFTune (Jain et al. 2023; TRL's neftune_noise_alpha): uniform noise in [-1, 1] x alpha / sqrt(L d) added to the input embeddings of the update's passes (L the sequence's length, d the embedding width; grpolab.model.neftune), never to the rollout's, the reference's or the evaluation's; null: off. The paper used 5 to 15."""
    cpu_malloc: CpuMalloc = "keep"
    """On a CPU under glibc: keep (freed memory stays in the process and is reused, so a new tensor does not fault its pages in anew; grpolab.parallel.allocator) or system (malloc as it is)."""
    decoder: Decoder = "auto"
    """How rollouts run the model: auto (grpolab.engine.native.decoder's lean decode step where it was measured faster than the model's own forward: bf16 rollouts on a CPU, for Llama, Qwen2 and Mistral models; otherwise the model's forward), lean (the lean step wherever it supports the model) or hf (always the model's own forward)."""
    threads: int = 0
    """CPU threads for PyTorch. 0: the cores other processes leave idle, measured for a quarter of a second at start (every core on an idle machine, one fewer per busy core, at least 1; busy processes of the run's own scheduling group, such as jobs started with & from its shell, count for nothing where the threads wait briefly, since the kernel shares that group's time per thread: grpolab.util.load) and again over every step, the count moving when two steps in a row call for the same new one (load that arrives or leaves during the run), or OMP_NUM_THREADS where the environment sets it (torchrun does: then fixed); each step's count is the metric `threads`, the latest is recorded in OUT/threads.json and a resumed run starts from it; N: exactly N, whatever the load (the sampled tokens depend on the thread count: set N where two runs must match). Printed on the run's first line; docs/performance.md, "A machine doing something else"."""
    # --- how the CPU threads wait (grpolab.util.threads)
    thread_wait: ThreadWait = "auto"
    """How PyTorch's CPU threads wait for each other between parallel pieces of work (OpenMP's wait policy, set before torch starts): auto (a short spin of 10,000 rounds, then sleep, so that a machine running something else costs a fair share rather than many times the step; a brief spin of 1,000 rounds where other processes were busy at start; the user's own OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME win where set), short or brief (those spins, ignoring those variables), passive (sleep at once), active (spin) or openmp (the runtime's own default: libgomp spins 300,000 rounds). Printed on the run's first line; docs/performance.md, "A machine doing something else"."""
    fsdp: bool = False
    """Under torchrun, shard the policy (and the reference) over the processes with FSDP2 (torch.distributed.fsdp.fully_shard) instead of a full copy per process: for models whose weights, gradients and AdamW state do not fit one device. Same maths as plain data parallelism; checkpoints stay whole models (docs/distributed.md)."""
    eval_size: int = 64
    """Held-out prompts scored before and after training (and every eval_steps steps; greedy unless eval_num_generations > 0); 0 skips the evaluation."""
    eval_batch: int = 32
    """Prompts per generation batch during evaluation (with eval_num_generations = n: eval_batch // n prompts, at least one)."""
    # -- evaluation during the run: sampling, pass@k with intervals, the best checkpoint (docs/evaluation.md)
    eval_steps: int = 0
    """Score the held-out set every N steps too, logging eval/ metrics (accuracy, pass@k and their 95% intervals, the answer extraction shares) in metrics.jsonl at steps 0, N, 2N, ... and the last step; 0: only before and after training, in summary.json."""
    eval_delay: int = 0
    """No evaluation during the run before step eval_delay (TRL's eval_delay): of the evaluations every eval_steps steps and the one at the last step, only those at steps >= eval_delay happen; the evaluations before and after training (summary.json) are kept."""
    eval_num_generations: int = 0
    """Completions sampled per held-out prompt (at eval_temperature), for pass@k at k = 1, 2, 4, ..., n with bootstrap intervals over the prompts; 0: one greedy completion per prompt (accuracy with a Wilson interval)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation when eval_num_generations > 0 (the run's top_p and max_new_tokens apply)."""
    eval_pass_threshold: float = 1.0
    """A completion passes (counts as correct for pass@k and the extraction report) when its main reward is at least this."""
    save_best: str = ""
    """Keep the best model by an eval metric the run's evaluation logs (higher is better unless save_best_higher says otherwise or its name ends in loss), e.g. eval/accuracy, eval/reward, eval/pass@1 (eval/pass@K needs K <= eval_num_generations), eval/loss (the training loss of the evaluation's completions, measured where it needs no reference or critic), eval/length or eval/reward/NAME/mean: written to OUT/checkpoints/best (weights and tokenizer, with best.json) at each evaluation that improves it, never pruned; empty: off."""
    save_best_higher: bool | None = None
    """Whether a higher save_best metric is better (TRL's greater_is_better); null: higher unless the metric's name ends in loss, as transformers decides it."""
    eval_stop_at: float | None = None
    """Stop the run (checkpoint, summary, report) at the first evaluation whose save_best metric (eval/accuracy when save_best is empty) reaches this value (at or above it; at or below it where lower is better, save_best_higher); needs eval_steps > 0. None: off."""
    save_every: int = 20
    """Write a checkpoint every N steps and at the end (0: only at the end). `--resume` continues from the newest one; a checkpoint of the 135M model with its AdamW state is about 1.6 GB."""
    keep_checkpoints: int = 1
    """How many of the newest checkpoints to keep on disk (TRL's save_total_limit): 1 keeps the last, which `--resume` continues; 0 keeps every one. The best model (save_best, checkpoints/best) is kept besides."""
    save_only_model: bool = False
    """Checkpoints that hold the model (weights or adapter), its tokenizer and trainer_state.json only, without the optimizer, scheduler, RNG or component states (TRL's save_only_model): smaller, loadable with from_pretrained (or as model=), but no run continues from them: `--resume` refuses them (exit 2)."""
    resume: Resume = "never"
    """never (an `out` that already holds a run is refused; continue it with `grpolab train --resume OUT`) or auto: the same command starts a new run where `out` holds none, and otherwise continues the newest checkpoint that verifies, so that torchrun --max-restarts and requeued jobs recover by themselves; each continuation is recorded in OUT/restarts.jsonl (docs/distributed.md)."""
    samples_per_step: int = 4
    """Completions per step written to samples.jsonl."""
    reward_timeout_s: float = 10.0
    """Time budget of one reward call; over it the sample scores 0 and `reward/timeouts` counts it."""
    reward_workers: int = 4
    """Threads scoring completions in parallel."""
    reward_process: bool = False
    """Run reward functions of your own (`file.py:fn`, `module:fn`, functions given to grpolab.train or GRPOTrainer; not grpolab's verifiers, which bound their own time) in forked child processes, killed at reward_timeout_s with what they started, whatever they do: the one bound that holds for work the model's text drives into C code holding the GIL (a backtracking regex, `10 ** int(digits)`), which no thread can stop (off, such a call stops the whole trainer until it ends; `grpolab audit` warns). Up to reward_workers children per function; a TRL-form function's calls run one after another in a child's main thread (signal.alarm works), `async def` ones together on a child's event loop. Each child may add 2048 MiB of address space to what it inherits (an allocation past it fails the call). What a call changes in memory stays in the child (its score, raised errors and log_extra / log_metric come back), so it is off by default: a reward that keeps state between calls, records what it saw, or uses the trainer's GPU needs this process. Its cost: a fork of the trainer per function and chunk per step, and one per call past its timeout (docs/security.md)."""
    # --- reward calls: where they run, and when failing ones stop the run (docs/rewards.md) ---
    reward_thread: RewardThread = "auto"
    """Where synchronous reward functions run. auto: TRL-form functions (completions in, a list of scores out) in the training thread, one call after another, as TRL runs them (so signal.alarm works, as math-verify's timeouts need; reward_timeout_s does not apply there); functions with a `max_concurrency` attribute (the built-in math and code rewards) and grpolab's per-sample fn(completion, example) on reward_workers threads with the timeout. main: every one in the training thread. workers: every one on the threads, with the timeout. `async def` functions are always awaited together on an event loop, each within reward_timeout_s."""
    max_reward_error_steps: int = 3
    """A reward function that fails on every completion of a step is named with its first error (console, and reward/<name>/error_frac = 1 in metrics.jsonl); this many such steps in a row stop the run (exit 1) after writing a checkpoint. 0: never stop for it."""
    tensorboard: bool | None = None
    """The older switch for TensorBoard, folded into report_to when the config is read: true adds tensorboard to report_to, false removes it (tensorboard=false keeps meaning no OUT/tb); unset (null), report_to alone decides. Recorded as null in config.yaml, report_to holding the result."""
    # --- experiment trackers and run naming (grpolab.training.trackers; docs/metrics.md "Trackers") ---
    report_to: list[str] | str = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers that receive the config, every metric (evaluation rows included), the samples and the evaluation tables: tensorboard (OUT/tb), wandb (an offline W&B run in OUT/wandb; extra `wandb`), mlflow (MLflow's local SQLite store OUT/mlflow.db; extra `mlflow`), trackio (trackio's local store OUT/trackio; extra `trackio`); a name or a list, `none` for none, `all` for tensorboard and every other one installed. Nothing is sent over the network unless the tracker's own variable asks for it (WANDB_MODE=online, MLFLOW_TRACKING_URI, TRACKIO_SPACE_ID); docs/metrics.md, "Trackers"."""
    run_name: str = ""
    """The run's name in the trackers; empty: the name of the `out` directory."""
    project: str = "grpolab"
    """The W&B project, MLflow experiment and trackio project the run is logged under."""
    # --- end of experiment trackers ---
    progress: bool = True
    """Show a live progress bar on the console."""
    report: bool = True
    """Write OUT/report.html (plots, samples, the token-level credit view; see docs/report.md) at the end of the run; needs the `report` extra (matplotlib)."""
    sample_tokens: int = 64
    """Per-token values (advantage, log-prob, ratio and clip, entropy, KL) saved in samples.jsonl for the first sample_tokens tokens of each written sample; 0 saves none. Bounds samples.jsonl to about samples_per_step x (the texts + 70 bytes x sample_tokens) per step."""
    reflection_phrases: list[str] = field(default_factory=lambda: list(_default_reflection_phrases()))
    """Phrases counted as reflection in aha/reflection_count and aha/reflection_frac (whole words, ignoring case); the default holds English and Spanish ones (wait, let me check, verify, espera, revisemos, ...; grpolab.training.diagnostics)."""
    alert_entropy_min: float = 0.02
    """Collapse alert: warn (and count alert/entropy) when the mean policy entropy of a step falls below this (nats)."""
    alert_zero_var_steps: int = 5
    """Collapse alert: warn (alert/zero_variance) when every group has had equal rewards for this many consecutive steps."""
    alert_truncated_frac: float = 0.5
    """Collapse alert: warn (alert/truncated) when more than this share of a step's completions hit max_new_tokens."""
    alert_window: int = 10
    """Steps in the rolling window of aha/length_reward_corr_rolling and of the alert for a reward falling while the KL rises."""

    # --- data order: epochs over the training rows (TRL's num_train_epochs, shuffle_dataset, data_seed) ---
    num_train_epochs: float | None = None
    """Passes over the training rows of a task read from data (task=dataset, qa, code, ...): step s takes the next batch_size/G rows of seeded, shuffled epochs, so each row is trained on once per epoch (DAPO's refill rounds draw at random); with steps=-1 the run is ceil(num_train_epochs x rows / (batch_size/G)) steps (TRL's max_steps=-1). null: each step draws its prompts at random, without replacement within the step (grpolab's default)."""
    shuffle: bool = True
    """With num_train_epochs: each epoch visits the rows in a new seeded order (data_seed, else seed); false keeps the data's order (TRL's shuffle_dataset)."""
    data_seed: int | None = None
    """Seed of the epochs' row order (TRL's data_seed); null: seed."""
    ignore_data_skip: bool = False
    """With num_train_epochs, on a resume: the epoch the run was in starts again from its first row, instead of the run taking the rows it would have taken next (TRL's ignore_data_skip: that epoch's rows already trained on come again)."""

    @property
    def max_completion_tokens(self) -> int:
        """The most tokens the model may write for one sample: max_new_tokens, or in a multi-turn run the
        trajectory's budget env.max_model_tokens. The length constant of Dr. GRPO's normaliser and of
        the overlong penalty."""
        return self.env.max_model_tokens if self.env.enabled else self.max_new_tokens


# --- what the settings imply: the sampling options in force, the evaluation's checks ---------------

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""generation_kwargs keys that override the config's own sampling options (the native engine knows only these)."""


def sampling_values(cfg: Config) -> dict:
    """The sampling options a run uses: temperature, top_p, top_k, min_p, repetition_penalty from the
    config, each overridden by generation_kwargs where it names it (TRL: generation_kwargs win)."""
    out = {k: getattr(cfg, k) for k in SAMPLING_KEYS}
    out.update({k: v for k, v in cfg.generation_kwargs.items() if k in SAMPLING_KEYS})
    return out


def check_sampling_kwargs(cfg: Config) -> None:
    """generation_kwargs' sampling keys obey the same bounds as the options they override (its keys, and
    chat_template_kwargs', are strings by their type, dict[str, Any])."""
    v = sampling_values(cfg)
    checks = [
        (isinstance(v["temperature"], (int, float)) and v["temperature"] > 0, "temperature", "must be a number > 0"),
        (isinstance(v["top_p"], (int, float)) and 0 < v["top_p"] <= 1, "top_p", "must be in (0, 1]"),
        (isinstance(v["top_k"], int) and v["top_k"] >= -1, "top_k", "must be an integer >= 1, or 0 / -1 for off"),
        (isinstance(v["min_p"], (int, float)) and 0 <= v["min_p"] < 1, "min_p", "must be in [0, 1)"),
        (
            isinstance(v["repetition_penalty"], (int, float)) and v["repetition_penalty"] > 0,
            "repetition_penalty",
            "must be a number > 0",
        ),
    ]
    for ok, key, msg in checks:
        if not ok and key in cfg.generation_kwargs:
            raise ConfigError(f"generation_kwargs.{key}: {msg}, got {cfg.generation_kwargs[key]!r}")


def _default_reflection_phrases() -> list[str]:
    from grpolab.training.diagnostics import DEFAULT_REFLECTION_PHRASES

    return DEFAULT_REFLECTION_PHRASES


def algo_choices() -> dict[str, tuple[str, ...]]:
    """algo field -> the names its registry holds (the registries live with their maths)."""
    from grpolab.algo.advantages import ADV_SCALES, ADVANTAGES, REWARD_AGGREGATIONS
    from grpolab.algo.kl import KL_ESTIMATORS
    from grpolab.algo.losses import AGGREGATIONS, OBJECTIVES

    return {
        "advantage": (*ADVANTAGES, "gae"),
        "adv_scale": tuple(ADV_SCALES),
        "objective": tuple(OBJECTIVES),
        "aggregation": tuple(AGGREGATIONS),
        "kl_estimator": tuple(KL_ESTIMATORS),
        "reward_aggregation": tuple(REWARD_AGGREGATIONS),
    }


def thread_wait_of(recipe: dict | None, overrides: list[str] | None) -> str:
    """The `thread_wait` that recipe <- overrides give, read before torch is imported (build_config imports
    it, and OpenMP reads its wait policy once, at that import); an invalid value is ConfigError."""
    merged: dict = {}
    deep_update(merged, copy.deepcopy(recipe or {}))
    deep_update(merged, parse_overrides(overrides or []))
    return coerce_field(
        "thread_wait", merged.get("thread_wait", Config.thread_wait), field_types(Config)["thread_wait"]
    )


def build_config(recipe: dict | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- recipe <- overrides, validated. Raises ConfigError (exit code 2) on any problem."""
    merged: dict = {}
    deep_update(merged, copy.deepcopy(recipe or {}))  # never mutate the caller's recipe
    deep_update(merged, parse_overrides(overrides or []))
    algo_raw = merged.pop("algo", {}) or {}
    if isinstance(algo_raw, str):
        algo_raw = {"name": algo_raw}
    if not isinstance(algo_raw, dict):
        raise ConfigError(f"algo: expected a name or a mapping, got {algo_raw!r}")
    cfg = merge_into(Config, Config(), merged, "")
    algo_over = dict(algo_raw)
    name = algo_over.pop("name", "grpo")
    cfg.algo = resolve_algo(name, algo_over, choices=algo_choices())
    fold_report_to(cfg)
    validate(cfg)
    return cfg


def fold_report_to(cfg: Config) -> None:
    """report_to as a list of known tracker names, the older `tensorboard` switch folded in and then unset
    (grpolab.training.trackers.resolve_report_to); ConfigError names an unknown tracker."""
    from grpolab.training.trackers import resolve_report_to

    cfg.report_to = resolve_report_to(cfg.report_to, cfg.tensorboard)
    cfg.tensorboard = None
    if not cfg.project.strip():
        raise ConfigError("project: must be a name (the W&B project, MLflow experiment and trackio project)")


def validate(cfg: Config) -> None:
    """Impossible values, caught before anything is written."""
    checks = [
        (
            cfg.steps >= 1 or (cfg.steps == -1 and cfg.num_train_epochs is not None),
            "steps",
            "must be >= 1 (or -1 with num_train_epochs set: the epochs decide the number of steps)",
        ),
        (cfg.num_train_epochs is None or cfg.num_train_epochs > 0, "num_train_epochs", "must be > 0 or null"),
        (cfg.G >= 1, "G", "must be >= 1 (completions per prompt)"),
        (cfg.batch_size >= 1, "batch_size", "must be >= 1"),
        (
            cfg.batch_size % max(cfg.G, 1) == 0,
            "batch_size",
            f"{cfg.batch_size} is not divisible by G={cfg.G}; use a multiple of G, e.g. {max(cfg.G, 1) * max(1, cfg.batch_size // max(cfg.G, 1))}",
        ),
        (cfg.micro_batch >= 1, "micro_batch", "must be >= 1"),
        (
            (cfg.batch_size // max(cfg.G, 1)) % cfg.algo.steps_per_generation == 0,
            "algo.steps_per_generation",
            f"{cfg.algo.steps_per_generation} does not divide the {cfg.batch_size // max(cfg.G, 1)} prompt groups of a "
            f"step (batch_size / G); each update takes an equal share of them",
        ),
        (cfg.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
        (cfg.temperature > 0, "temperature", "must be > 0"),
        (0 < cfg.top_p <= 1, "top_p", "must be in (0, 1]"),
        (cfg.top_k >= -1, "top_k", "must be >= 1, or 0 / -1 for off"),
        (0 <= cfg.min_p < 1, "min_p", "must be in [0, 1) (0: off)"),
        (cfg.repetition_penalty > 0, "repetition_penalty", "must be > 0 (1: off)"),
        (0 <= cfg.warmup_ratio < 1, "warmup_ratio", "must be in [0, 1) (0: use warmup_steps)"),
        (cfg.lr > 0, "lr", "must be > 0"),
        (cfg.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
        (cfg.max_grad_norm >= 0, "max_grad_norm", "must be >= 0 (0 disables clipping)"),
        (cfg.max_nonfinite_updates >= 1, "max_nonfinite_updates", "must be >= 1"),
        (cfg.neftune_alpha is None or cfg.neftune_alpha >= 0, "neftune_alpha", "must be >= 0, or null for off"),
        (
            cfg.algo.overlong_buffer <= cfg.max_completion_tokens,
            "algo.overlong_buffer",
            f"{cfg.algo.overlong_buffer} tokens is longer than "
            f"{'env.max_model_tokens' if cfg.env.enabled else 'max_new_tokens'}={cfg.max_completion_tokens}: every completion "
            f"would be punished; lower it (DAPO used 20% of the limit)",
        ),
        *range_checks(cfg),
        (cfg.eval_size >= 0, "eval_size", "must be >= 0"),
        (cfg.eval_batch >= 1, "eval_batch", "must be >= 1"),
        *eval_checks(cfg),
        *compile_checks(cfg),
        (cfg.save_every >= 0, "save_every", "must be >= 0"),
        (cfg.keep_checkpoints >= 0, "keep_checkpoints", "must be >= 0 (0 keeps every checkpoint)"),
        (cfg.samples_per_step >= 0, "samples_per_step", "must be >= 0"),
        (cfg.reward_timeout_s > 0, "reward_timeout_s", "must be > 0"),
        (cfg.reward_workers >= 1, "reward_workers", "must be >= 1"),
        (cfg.threads >= 0, "threads", "must be >= 0"),
        (
            len(cfg.adam_betas) == 2 and all(0 <= b < 1 for b in cfg.adam_betas),
            "adam_betas",
            "must be two numbers in [0, 1)",
        ),
        (bool(cfg.out), "out", "must be a directory path"),
    ]
    checks += [  # reward calls
        (
            cfg.max_reward_error_steps >= 0,
            "max_reward_error_steps",
            "must be an integer >= 0 (0: never stop for failing rewards)",
        )
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
    check_sampling_kwargs(cfg)
    schedule_options(cfg.lr_scheduler, cfg.lr_scheduler_kwargs, cfg.lr)  # its options, before any model loads
    validate_lora(cfg.lora)
    validate_env(cfg.env)
    validate_rollout(cfg.rollout)
    from grpolab.tasks import TASKS

    if cfg.task not in TASKS:  # caught here, before any model is loaded
        raise ConfigError(f"task: unknown task {cfg.task!r}; known tasks: {', '.join(sorted(TASKS))}")
    for i, spec in enumerate(cfg.rewards):  # each a mapping: its type, list[dict[str, Any]]
        if "name" not in spec:
            raise ConfigError(f"rewards[{i}]: expected a mapping with a `name` (and optional `weight`), got {spec!r}")


def to_dict(cfg: Config) -> dict:
    """Plain-data view of the config (for config.yaml)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: Path) -> None:
    """Write config.yaml atomically (a resumed run rewrites it; a crash must not leave half a file)."""
    atomic_write(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_from_run(out_dir: Path) -> dict:
    """The resolved config.yaml of an existing run, as a recipe dict."""
    p = Path(out_dir) / "config.yaml"
    if not p.exists():
        raise ConfigError(not_a_run_message(Path(out_dir)))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(
            f"{p}: cannot be read as the run's settings ({type(e).__name__}: {str(e)[:300]}); "
            f"it is not a config.yaml grpolab wrote: restore it or start a new run"
        ) from e
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: expected a mapping of keys to values at the top level, got {type(data).__name__}; "
            f"it is not a config.yaml grpolab wrote: restore it or start a new run"
        )
    return data


def not_a_run_message(out_dir: Path) -> str:
    """What to do with a --resume target that holds no config.yaml."""
    if not out_dir.exists():
        return (
            f"--resume {out_dir}: no such directory. Start the run with "
            f"`grpolab train [RECIPE] out={out_dir} [KEY=VALUE ...]`"
        )
    return (
        f"--resume {out_dir}: it holds no config.yaml, so the run stopped before recording its settings and "
        f"trained no step: there is nothing to resume. Start it again with the same settings: "
        f"`grpolab train [RECIPE] out={out_dir} [KEY=VALUE ...]` (that directory is accepted as it is)"
    )


def help_text(cfg: Config | None = None) -> str:
    """Every option with the value a run would use and its documentation (for --help): the values of
    `cfg` (a recipe and overrides already applied), or of the defaults with the default algo preset."""
    cfg = cfg if cfg is not None else build_config()
    lines = [
        "Options (KEY=VALUE; nested with dots, e.g. algo.beta=0.04); the values shown are the ones this run would use:",
        "",
    ]
    docs, types = field_docs(Config), field_types(Config)
    for f in dataclasses.fields(Config):
        if f.name == "algo":
            continue
        value = getattr(cfg, f.name)
        shown = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        lines.append(_value_line(f.name, shown, types[f.name]))
        lines.append(textwrap.fill(docs.get(f.name, ""), 96, initial_indent="      ", subsequent_indent="      "))
    lines += ["", "  lora.* options (LoRA through peft; lora.r=0, the default, trains every weight):"]
    lines += _option_lines("lora.", cfg.lora)
    lines += ["", "  env.* options (multi-turn environments, docs/agents.md; env.name empty = single-turn):"]
    lines += _option_lines("env.", cfg.env)
    lines += ["", '  rollout.* options (the rollout engine, README.md "Rollout engines"):']
    lines += _option_lines("rollout.", cfg.rollout)
    lines += ["", f"  algo=NAME and algo.* options (algo={cfg.algo.name}: its preset's values):"]
    lines += _option_lines("algo.", cfg.algo)
    return "\n".join(lines)


def _option_lines(prefix: str, settings) -> list[str]:
    """`PREFIX.field=value` and its documentation, for each field of the nested settings object."""
    docs, types, lines = field_docs(type(settings)), field_types(type(settings)), []
    for f in dataclasses.fields(settings):
        lines.append(_value_line(f"{prefix}{f.name}", getattr(settings, f.name), types[f.name]))
        lines.append(textwrap.fill(docs.get(f.name, ""), 96, initial_indent="      ", subsequent_indent="      "))
    return lines


def _value_line(key: str, value, typ) -> str:
    """`  KEY=value`, and for a switch the values its type allows: `  precision='auto'  one of: auto, bf16, fp16, fp32`."""
    allowed = choices(typ)
    return f"  {key}={value!r}" + (f"  one of: {', '.join(allowed)}" if allowed else "")
