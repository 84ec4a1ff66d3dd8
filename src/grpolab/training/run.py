"""What one training run holds: the models, their optimiser, the task and the verifiers.

Built by grpolab.training.trainer.setup; read by every stage of grpolab.training.step. It is the only state a step
touches, and everything in it that changes during training is saved by the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from grpolab.algo.kl import AdaptiveKL
from grpolab.engine.base import RolloutEngine, Sampling
from grpolab.engine.native.sampling import is_plain
from grpolab.model.compiling import Compiler, check_compiler
from grpolab.model.moe import RouterAux
from grpolab.model.passes import PassSpec
from grpolab.model.precision import Precision
from grpolab.parallel.distributed import SINGLE, Dist
from grpolab.rewards.scoring import RewardFn
from grpolab.training.components import AdvantageComponent
from grpolab.training.config import Config, sampling_values
from grpolab.training.options import extra_generation_kwargs
from grpolab.util.fields import ConfigError

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not by this module
    from transformers import PreTrainedTokenizerBase

    from grpolab.batch import Example
    from grpolab.env.rollout import Environments


class Task(Protocol):
    """What a step reads of a task (the interface every task class follows: grpolab.tasks)."""

    name: str
    system_prompt: str | None

    def sample(self, n: int, rng: random.Random) -> list[Example]: ...

    def eval_set(self) -> list[Example]: ...


class Reference(Protocol):
    """pi_ref (grpolab.model.reference: FrozenCopy, AdapterOff; sharded: grpolab.parallel.fsdp's wrapper):
    `with ref.model() as m:` gives the network to run without gradients."""

    def model(self) -> contextlib.AbstractContextManager[nn.Module]: ...


class Component(Protocol):
    """A stateful part of a run besides the policy, saved in each checkpoint (grpolab.training.checkpoint)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def main_reward(reward_fns: Sequence[RewardFn]) -> str:
    """The name of the main reward: the one with the largest weight (the first of equals). Evaluation
    accuracy, the audit's gold check and the aha diagnostics read it."""
    return max(reward_fns, key=lambda f: f.weight).name


@dataclass
class Run:
    """One training (or evaluation) run."""

    cfg: Config
    out: Path
    device: torch.device
    amp_dtype: torch.dtype | None
    """Autocast dtype of the scoring passes (update, reference, critic), None for plain fp32 (grpolab.model.precision)."""
    tokenizer: PreTrainedTokenizerBase
    policy: nn.Module
    """The policy: a transformers causal LM, or under LoRA its peft wrapper (grpolab.model.lora)."""
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    task: Task
    reward_fns: list[RewardFn]
    eos_ids: set[int]
    advantage: AdvantageComponent
    """The advantage component: grpolab.training.components.GroupBaseline, or grpolab.model.critic.Critic for PPO."""
    kl: AdaptiveKL
    """The current beta (fixed unless algo.adaptive_kl)."""
    sampling: Sampling
    """How the rollouts draw tokens (`rollout_sampling`). Greedy decoding is dataclasses.replace(run.sampling,
    greedy=True) (grpolab.app.chat); the evaluation draws with its own temperature and top_p, at this
    max_new_tokens (grpolab.training.evaluation)."""
    pass_spec: PassSpec
    """What the model passes (grpolab.model.passes) need of the run (`pass_spec_of`)."""
    plain_sampling: bool
    """True when the rollouts sample from softmax(z / T) itself (no top-p, top-k, min-p or penalty), so a
    token's sampling log-prob is the policy's own (grpolab.engine.native.sampling.is_plain)."""
    ref: Reference | None = None
    """The reference pi_ref (grpolab.model.reference: a frozen copy, or under LoRA the policy with its adapter
    off; `with ref.model() as m:` gives the network), or None when beta = 0 (no KL term, no reference pass)."""
    log: Callable[[str], None] = print
    components: dict[str, Component] = field(default_factory=dict)
    """Stateful parts besides the policy (e.g. {"critic": Critic}), saved as NAME.pt in each checkpoint."""
    dist: Dist | None = None
    """This process's rank and the world size (None: one process); read it as `ranks`."""
    precision: Precision | None = None
    """The autocast dtype of each phase and why (None: fp32 everywhere)."""
    nonfinite_streak: int = 0
    """Optimizer updates skipped in a row for a non-finite loss or gradient norm (reset by a good one)."""
    environments: Environments | None = None
    """The multi-turn environments (grpolab.env.rollout.Environments, loaded by grpolab.training.agents), None
    for single-turn rollouts (env.name empty)."""
    engine: RolloutEngine | None = None
    """What samples the rollouts (grpolab.engine: the native decode loop or vLLM), set by setup."""
    trainer_state: object | None = None
    """transformers' TrainerState the reward functions receive (TRL's `trainer_state`), advanced by each step."""
    updates: list[dict] = field(default_factory=list)
    """The last step's optimizer updates, in order (grpolab.training.update.update_record): the learning rate
    each used, its gradient norm and loss; what TRL logs once per optimizer step."""
    reward_error_streak: dict[str, int] = field(default_factory=dict)
    """Per reward function: steps in a row on which it failed on every completion (cfg.max_reward_error_steps)."""
    data_shift: int = 0
    """Rows the epochs' sequence is moved back by (a continuation with ignore_data_skip: grpolab.training.resume),
    saved in each checkpoint."""

    @property
    def ranks(self) -> Dist:
        """This process's place among the data-parallel ranks (one process: grpolab.parallel.distributed.SINGLE)."""
        return self.dist or SINGLE

    @property
    def main_reward(self) -> str:
        """The name of the reward with the largest weight (`main_reward`)."""
        return main_reward(self.reward_fns)

    @property
    def rollout_dtype(self) -> torch.dtype | None:
        """Autocast dtype of the rollout (generation), None for fp32."""
        return self.precision.rollout if self.precision is not None else self.amp_dtype

    def trained_params(self) -> int:
        """Parameters with gradients: the policy's and the advantage component's (a critic's)."""
        own = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        return own + self.advantage.trained_params()


def choose_engine(cfg: Config, path: Path | None, device: torch.device, dist) -> tuple[str, str]:
    """The rollout engine's name and why (grpolab.engine.choose); rollout.engine=vllm where it cannot run
    is a usage error (exit 2), raised before anything is loaded or written. path None (a model object with
    no directory on this machine): grpolab's decode loop, vLLM (which loads a directory) a ConfigError."""
    from grpolab.engine import EngineError, choose

    if path is None:
        if cfg.rollout.engine == "vllm":
            raise ConfigError(
                "rollout.engine=vllm: vLLM loads the model from a directory, and this model object has none "
                "(save it with model.save_pretrained(DIR) and pass model=DIR)"
            )
        return "native", "a model object: grpolab's decode loop samples from it"
    try:
        return choose(cfg.rollout, model_path=path, device=device, distributed=dist is not None and dist.active)
    except EngineError as e:
        raise ConfigError(str(e)) from None


def check_same_lora(out: Path, cfg: Config) -> None:
    """A resumed run keeps its LoRA settings: its checkpoints hold an adapter of that shape (or a whole model)."""
    from grpolab.training.config import config_from_run

    before = (config_from_run(out) or {}).get("lora") or {}
    now = dataclasses.asdict(cfg.lora)
    changed = [k for k in now if k in before and before[k] != now[k]] + (
        ["r"] if not before and now["r"] else []
    )  # a run from before LoRA existed trained every weight
    if changed:
        raise ConfigError(
            f"lora.{changed[0]}: cannot change when resuming (the run was trained with "
            f"lora.{changed[0]}={before.get(changed[0], 0)!r}); continue with the same settings, "
            f"or start a new run"
        )


def rollout_sampling(cfg: Config) -> Sampling:
    """How the rollouts draw tokens: the run's max_new_tokens and sampling options (temperature, top_p,
    top_k, min_p, repetition_penalty, generation_kwargs over them; grpolab.training.config.sampling_values),
    the other generation_kwargs for the engine. Built once, by grpolab.training.trainer.setup."""
    v = sampling_values(cfg)
    return Sampling(
        cfg.max_new_tokens,
        float(v["temperature"]),
        float(v["top_p"]),
        False,
        top_k=int(v["top_k"]),
        min_p=float(v["min_p"]),
        repetition_penalty=float(v["repetition_penalty"]),
        extra=extra_generation_kwargs(cfg),
    )


def samples_plainly(sampling: Sampling) -> bool:
    """Run.plain_sampling of a run that samples with `sampling` (grpolab.engine.native.sampling.is_plain)."""
    return is_plain(sampling.top_p, sampling.filters)


def pass_spec_of(
    cfg: Config, device: torch.device, amp_dtype: torch.dtype | None, router: RouterAux | None = None
) -> PassSpec:
    """What the model passes (grpolab.model.passes) need of the run: device, autocast dtype of the
    scoring passes, sampling temperature, micro-batch size, activation checkpointing and torch.compile of the
    update (a backend that cannot compile on `device`: ConfigError, grpolab.model.compiling.check_compiler),
    and an MoE's router load-balancing term (grpolab.model.moe.router_aux_of)."""
    compiler = Compiler(cfg.compile_backend, cfg.compile_mode) if cfg.compile else None
    check_compiler(compiler, device)
    return PassSpec(
        device,
        amp_dtype,
        float(sampling_values(cfg)["temperature"]),
        cfg.micro_batch,
        checkpoint=cfg.grad_checkpointing,
        head_fp32=cfg.lm_head_fp32,
        compiler=compiler,
        router=router,
    )


def step_rng(seed: int, step: int, device: torch.device, rank: int = 0) -> tuple[random.Random, torch.Generator]:
    """Per-step generators derived from (seed, step): a resumed run draws exactly what it would have.

    The python generator (prompts) is the same on every data-parallel rank: each rank draws the global
    step's prompts and keeps its slice. The torch generator (sampling) lives on `device` and differs per
    rank (rank 0 is the single-process stream); it is made once per step, so every rollout call of the
    step (DAPO's refill rounds included) continues its stream instead of restarting it.
    """
    s = (seed * 1_000_003 + step) % (2**63)
    g = torch.Generator(device=device)
    g.manual_seed((s + rank * 0x9E3779B97F4A7C15) % (2**63))
    return random.Random(s), g


def check_epochs(cfg: Config, task, log: Callable[[str], None]) -> None:
    """num_train_epochs orders the rows of a task with a finite list of them (a task that generates its
    prompts draws them as before; with steps=-1 that is a ConfigError); steps=-1 becomes the number of steps
    the epochs take: ceil(num_train_epochs x rows / prompts per step)."""
    if cfg.num_train_epochs is None:
        return
    if not hasattr(task, "epoch_rows"):
        if cfg.steps == -1:
            raise ConfigError(
                f"num_train_epochs: task {cfg.task!r} generates its prompts and has no rows to pass "
                f"over; set steps=N (max_steps=N)"
            )
        log(f"num_train_epochs: task {cfg.task!r} generates its prompts: each step draws new ones")
        return
    if cfg.steps == -1:
        per_step = cfg.batch_size // cfg.G
        cfg.steps = max(1, math.ceil(cfg.num_train_epochs * len(task) / per_step))
        log(f"{cfg.num_train_epochs:g} epochs of {len(task)} rows at {per_step} prompts per step: {cfg.steps} steps")


__all__ = [
    "Component",
    "Reference",
    "Run",
    "Task",
    "check_epochs",
    "check_same_lora",
    "choose_engine",
    "main_reward",
    "pass_spec_of",
    "rollout_sampling",
    "samples_plainly",
    "step_rng",
]
