"""The estimate of a run: what its config makes one step hold (grpolab.training.plan.memory) and cost in
FLOPs, on a device with a given memory and rate (grpolab.training.plan.devices), before anything is loaded.

    p = plan(cfg, device=Device("RTX 5090", 32 GB, ...), prompt_tokens=256)
    p.peak                         the phase with the most bytes (grpolab.training.plan.memory.Phase)
    p.seconds                      seconds per phase: FLOPs / (rate x MATMUL_EFFICIENCY), generation
                                   also bounded by the bytes each decode step reads
    fitting(cfg, device, ...)      overrides (grad_checkpointing, micro_batch, lora.r, precision,
                                   max_new_tokens) whose plan fits, fewest changes first

The decisions are the run's own, by the functions the run calls: the reference of
grpolab.model.reference.reference_kind (none, a frozen copy, or the adapter switched off under LoRA),
the lean decoder where grpolab.engine.native.decoder.lean_decodes picks it; and as
grpolab.training.step computes: a critic for PPO, micro-batches of whole groups, every group computed
(the worst case: none has zero advantage), every completion as long as max_new_tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpolab.engine.native import decoder as lean_decoder
from grpolab.engine.native.decoder import lean_decodes
from grpolab.model.reference import reference_kind
from grpolab.training.config import Config, build_config
from grpolab.training.plan import reward_nets as rm
from grpolab.training.plan.devices import Device
from grpolab.training.plan.memory import Phase, Regime, Workload, phases
from grpolab.training.plan.shapes import LORA_TARGETS, SHAPES, Shape
from grpolab.util.fields import ConfigError

MATMUL_EFFICIENCY = 0.4
"""Share of the device's peak matmul rate the passes reach (an assumption: MFU of a dense PyTorch
forward+backward; grpolab's own update on a CPU: docs/performance.md, "What is still slow, and why")."""
BANDWIDTH_EFFICIENCY = 0.7
"""Share of the memory bandwidth a decode step reaches reading the weights and the KV cache (an assumption)."""
DECODE_LAYER_OVERHEAD_S = 4e-4
"""Seconds of kernel launches and Python per decoder layer per decode step on a GPU (an assumption, not
yet measured: benchmarks/gpu.sh measures decode tokens/s)."""


@dataclass
class Plan:
    """One config on one device: its phases, their seconds, and whether the peak fits."""

    cfg: Config
    shape: Shape
    workload: Workload
    regime: Regime
    device: Device
    phases: list[Phase]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.device.usable

    @property
    def step_seconds(self) -> float:
        return sum(self.seconds.values())


def shape_of(model: str) -> Shape:
    """The architecture of `model=`: a name of grpolab.training.plan.shapes.SHAPES (the bundled smollm2-135m
    included), or a local model directory's config.json (a LoRA checkpoint: its base's)."""
    if model in SHAPES:
        return SHAPES[model]
    from grpolab.model.load import adapter_base, is_adapter_dir, model_dir, resolve_model

    kind, path = resolve_model(model)  # ConfigError for a hub-style name
    if kind == "gguf":
        path = model_dir(model, log=lambda *_: None)
    if is_adapter_dir(path):
        path = adapter_base(path)
    try:
        return Shape.from_dir(path, Path(model).name)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from e


def update_bytes_of(cfg: Config, device_kind: str) -> tuple[int, int]:
    """(update, rollout) bytes per value: bf16 = 2, fp32 = 4; precision=auto is bf16 on a GPU and, on a
    CPU where it is measured at start, planned as fp32 (the larger of the two)."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device_kind == "cuda")
    return (2, 2) if bf16 else (4, 4)


def workload_of(cfg: Config, prompt_tokens: int) -> Workload:
    G = cfg.G
    width = cfg.max_completion_tokens + (cfg.env.max_env_tokens if cfg.env.enabled else 0)
    return Workload(
        prompts=cfg.batch_size // G,
        G=G,
        prompt_tokens=prompt_tokens,
        completion_tokens=width,
        max_new_tokens=width,
        seqs_per_pass=max(1, cfg.micro_batch // G) * G,
        mu=cfg.algo.mu,
    )


def regime_of(
    cfg: Config,
    shape: Shape,
    device_kind: str,
    *,
    update_bytes: int | None = None,
    rollout_bytes: int | None = None,
    engine_share: int = 0,
    rows_leave: bool = True,
) -> Regime:
    """How `cfg` computes on a device of `device_kind` (see the module docstring)."""
    u, ro = update_bytes_of(cfg, device_kind)
    u, ro = update_bytes or u, rollout_bytes or ro
    lean = lean_decodes(cfg.decoder, shape.model_type, torch.bfloat16 if ro == 2 else None, device_kind)
    lora = cfg.lora.r
    targets = cfg.lora.targets()
    targets = LORA_TARGETS if targets == "all-linear" else tuple(t for t in targets if t in LORA_TARGETS)
    return Regime(
        device=device_kind,
        update_bytes=u,
        rollout_bytes=ro,
        lean=lean,
        lean_fp32_layout=lean_decoder.FP32_LAYOUT,
        lora_r=lora,
        lora_targets=targets,
        lora_dropout=cfg.lora.dropout,
        reference=reference_kind(cfg.algo.beta, cfg.algo.adaptive_kl, lora),
        critic=cfg.algo.uses_critic,
        checkpointing=cfg.grad_checkpointing,
        rows_leave=rows_leave,
        engine_share=engine_share,
        reward_nets=tuple(rm.reward_nets(cfg.rewards)[0]),
    )


def step_flops(s: Shape, w: Workload, r: Regime) -> dict[str, float]:
    """FLOPs of each phase of one step (grpolab.training.plan.shapes.Shape.forward_flops per pass)."""
    B, N, P, C = w.prompts, w.rows, w.prompt_tokens, w.completion_tokens
    fwd = s.forward_flops(B * P + N * C, P / 2 + C / 2, N * C)  # a grouped pass: the prompt once per group
    body = fwd - 2 * s.vocab * s.hidden * N * C
    out = {"generation": s.forward_flops(B * P, P / 2, B) + s.forward_flops(N * C, P + C / 2, N * C)}
    if r.reference != "none":
        out["reference"] = fwd
    factor = 2 if r.lora_r else 3  # frozen weights: no weight gradients
    out["update"] = w.mu * (factor * fwd + (body if r.checkpointing else 0))
    for net in r.reward_nets:
        out[net.phase] = rm.flops(net, N, P + C)
    if r.critic:
        crit = s.forward_flops(N * (P + C), (P + C) / 2, 0)
        out["critic values"] = crit
        out["update"] += w.mu * 3 * crit
    return out


def decode_bytes(s: Shape, w: Workload, r: Regime) -> float:
    """Bytes all decode steps read: the weights in the compute dtype and the KV cache, once per step."""
    weights = r.rollout_bytes * (s.layers * s.layer_linear + s.vocab * s.hidden)
    kv = (
        2
        * s.layers
        * w.rows
        * s.kv_dim
        * (w.prompt_tokens + w.completion_tokens / 2)
        * (4 if r.lean else r.rollout_bytes)
    )
    return w.completion_tokens * (weights + kv)


def seconds(s: Shape, w: Workload, r: Regime, d: Device) -> dict[str, float]:
    """Seconds per phase on `d` (see the module docstring and the constants above)."""
    flops = step_flops(s, w, r)
    rate = (d.bf16_flops if r.update_bytes == 2 else d.fp32_flops) * MATMUL_EFFICIENCY
    if rate <= 0:  # a device known by its memory alone (the check before step 1)
        return {}
    out = {k: v / rate for k, v in flops.items()}
    for net in r.reward_nets:  # at its own compute dtype's rate
        c = rm.compute_bytes(net, r.update_bytes)
        out[net.phase] = flops[net.phase] / ((d.bf16_flops if c == 2 else d.fp32_flops) * MATMUL_EFFICIENCY)
    gen_rate = (d.bf16_flops if r.rollout_bytes == 2 else d.fp32_flops) * MATMUL_EFFICIENCY
    memory_bound = decode_bytes(s, w, r) / (d.bandwidth * BANDWIDTH_EFFICIENCY)
    overhead = w.completion_tokens * s.layers * DECODE_LAYER_OVERHEAD_S if d.kind == "cuda" else 0.0
    out["generation"] = max(flops["generation"] / gen_rate, memory_bound) + overhead
    return out


def plan(
    cfg: Config,
    device: Device,
    *,
    prompt_tokens: int,
    shape: Shape | None = None,
    engine_share: float = 0.0,
    update_bytes: int | None = None,
    rollout_bytes: int | None = None,
    rows_leave: bool = True,
) -> Plan:
    """The plan of `cfg` on `device`; engine_share: the fraction of the device an inference engine reserves."""
    shape = shape or shape_of(cfg.model)
    w = workload_of(cfg, prompt_tokens)
    r = regime_of(
        cfg,
        shape,
        device.kind,
        update_bytes=update_bytes,
        rollout_bytes=rollout_bytes,
        engine_share=int(engine_share * device.memory),
        rows_leave=rows_leave,
    )
    notes = []
    if cfg.precision == "auto" and device.kind == "cpu":
        notes.append("precision=auto is measured at start on a CPU; planned as fp32 (pass precision=bf16 to plan that)")
    if cfg.algo.kl_in_reward and cfg.top_p < 1:
        notes.append("with top_p < 1 and the KL in the reward, a no-grad policy pass is added (not in the table)")
    if cfg.fsdp:
        notes.append("fsdp=true shards weights, gradients and AdamW over the ranks; planned as one unsharded process")
    notes += rm.reward_nets(cfg.rewards)[1]
    if r.reward_nets:
        notes.append("a reward model reads prompt + completion in its own tokens: planned at the policy's counts")
    return Plan(cfg, shape, w, r, device, phases(shape, w, r), seconds(shape, w, r, device), notes)


CANDIDATES: list[list[str]] = [
    ["grad_checkpointing=true"],
    ["micro_batch=HALF"],
    ["micro_batch=G"],
    ["precision=bf16"],
    ["lora.r=16"],
    ["grad_checkpointing=true", "micro_batch=G"],
    ["lora.r=16", "grad_checkpointing=true"],
    ["lora.r=16", "micro_batch=G"],
    ["lora.r=16", "grad_checkpointing=true", "micro_batch=G"],
    ["lora.r=16", "grad_checkpointing=true", "micro_batch=G", "max_new_tokens=HALF"],
]
"""Changes tried in this order by `fitting` (HALF and G are read off the config); the last one shortens
completions, which changes the run itself, not only its memory."""


def _resolve(change: str, cfg: Config) -> str | None:
    key, value = change.split("=", 1)
    current = {"micro_batch": cfg.micro_batch, "max_new_tokens": cfg.max_new_tokens}.get(key)
    if value == "HALF":
        value = str(max(cfg.G if key == "micro_batch" else 1, current // 2))
    elif value == "G":
        value = str(cfg.G)
    now = {
        "grad_checkpointing": str(cfg.grad_checkpointing).lower(),
        "precision": cfg.precision,
        "lora.r": str(cfg.lora.r),
        "micro_batch": str(cfg.micro_batch),
        "max_new_tokens": str(cfg.max_new_tokens),
    }
    if (
        now.get(key) == value
        or (key == "lora.r" and cfg.lora.r > 0)
        or (key == "precision" and cfg.precision == "bf16")
    ):
        return None
    return f"{key}={value}"


def fitting(
    cfg: Config, overrides: list[str], device: Device, recipe: dict | None = None, limit: int = 5, **plan_kw
) -> list[tuple[list[str], Plan]]:
    """Up to `limit` sets of changes (from CANDIDATES, fewest first) whose plan fits `device`."""
    out, seen = [], set()
    for combo in CANDIDATES:
        changes = [c for c in (_resolve(x, cfg) for x in combo) if c]
        if not changes or tuple(changes) in seen or (out and any(c.startswith("max_new_tokens=") for c in changes)):
            continue  # shorter completions only when nothing that keeps the run as it is fits
        seen.add(tuple(changes))
        p = plan(build_config(recipe, [*overrides, *changes]), device, **plan_kw)
        if p.fits:
            out.append((changes, p))
        if len(out) >= limit:
            break
    return out


def prompt_tokens_of(cfg: Config, tokenizer, task=None, samples: int = 64) -> int:
    """The longest of `samples` prompts of the task in the model's chat template, in tokens."""
    from grpolab.model.template import chat_prompts
    from grpolab.tasks import build_task

    task = task or build_task(cfg.task, cfg.seed, cfg.task_args)
    examples = task.sample(samples, random.Random(cfg.seed))
    return max(
        len(ids)
        for ids in chat_prompts(
            tokenizer,
            [e.prompt for e in examples],
            task.system_prompt,
            raw_strings=getattr(task, "raw_string_prompts", False),
        )
    )


def planned_prompt_tokens(cfg: Config, given: int | None) -> tuple[int, str]:
    """The prompt length to plan for and where it came from: `given` (--prompt-tokens), else the task's
    longest prompt in the model's (or, for a published shape, the bundled SmolLM2's) chat template."""
    if given:
        return given, "--prompt-tokens"
    from grpolab.model.load import load_tokenizer, model_dir

    name = cfg.model if cfg.model not in SHAPES or cfg.model == "smollm2-135m" else "smollm2-135m"
    tok = load_tokenizer(model_dir(name, log=lambda *_: None))
    n = prompt_tokens_of(cfg, tok)
    return n, f"the longest of 64 prompts of task={cfg.task}" + ("" if name == cfg.model else " (SmolLM2's tokenizer)")


__all__ = [
    "BANDWIDTH_EFFICIENCY",
    "MATMUL_EFFICIENCY",
    "Plan",
    "fitting",
    "plan",
    "planned_prompt_tokens",
    "prompt_tokens_of",
    "regime_of",
    "seconds",
    "shape_of",
    "step_flops",
    "workload_of",
]
