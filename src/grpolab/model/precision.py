"""`precision=auto`: bf16 autocast or fp32, decided per phase (rollout, update) on the machine at hand.

On a CPU without bf16 instructions (most laptops) bf16 cannot pay: `auto` says fp32 in milliseconds from
what the CPU has (grpolab.model.cpu_bf16.bf16_can_pay), without timing anything. Where the CPU has them,
whether bf16 autocast pays still depends on the machine: on one 2-core AVX512-BF16 CPU it was slower than
fp32 for both generation and forward+backward, on another of the same kind faster for both
(benchmarks/bench_cpu.py; docs/performance.md, "precision=auto"), so no fixed rule is right. There
`auto` times both precisions on the policy itself, alternating after a warm-up of each on one row: a
rollout of the run's width (its rows, at most MAX_PROBE_ROWS), a few decode steps scaled to the run's
length, and one small forward+backward, repeated while PROBE_BUDGET_S lasts, and keeps bf16 for a phase
only where it was at least `BF16_MARGIN` faster; a line says when it starts and another each phase's
ratio as it is measured. The answer is remembered per machine and model shape in grpolab's cache
($GRPOLAB_CACHE/precision, grpolab.model.precision_cache), so the next run with that shape reads it. A rollout engine with its own kernels (vLLM) is not timed through grpolab's
decoder: its rollout precision is the engine's rule (grpolab.engine.rollout_precision). On a CUDA GPU
with bf16 support `auto` is bf16 (not measured: there it is the standard choice). The choice is
printed, written to OUT/precision.json and reused on resume, so a resumed run computes in the same
precision as the run it continues.

`precision=fp16` (a CUDA GPU only) is fp16 autocast for both phases, the update's loss scaled
(grpolab.model.loss_scale); it is never chosen by `auto`.

Weights and optimizer state stay fp32 in every case; autocast supplies the low precision.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from grpolab.model import precision_cache
from grpolab.model.cpu_bf16 import bf16_can_pay, cpu_facts

BF16_MARGIN = 0.9  # bf16 is kept for a phase when its time is at most this fraction of fp32's
PROBE_STEPS = 6  # decode steps the rollout probe times; a rollout's further tokens are scaled from them
MAX_PROBE_ROWS = 16  # the rollout probe decodes the run's rows, at most this many
UPDATE_PROBE_ROWS = 4  # sequences of the update probe's forward+backward
PROBE_BUDGET_S = 4.0  # the probe repeats its timings while this lasts (its first pair of each phase always runs)
WARMUP_UPDATE = {"rows": 1, "prompt": 4, "completion": 4}  # the update's warm-up: every weight's gradient, few tokens
SLOW_WARMUP = 3.0  # a bf16 warm-up this many times fp32's ends the phase: bf16 cannot pay there
SMALL_MODEL_PARAMS = 10_000_000  # below this a matmul is too small for bf16 to pay: fp32, not measured
FILE = "precision.json"
NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
DTYPES = {v: k for k, v in NAMES.items()}
RolloutProbe = Callable[..., float]
"""(model, dtype, *, rows, tokens) -> seconds of one rollout: the rollout engine's own timing."""


@dataclass(frozen=True)
class Precision:
    """Autocast dtype per phase (None = fp32) and why."""

    rollout: torch.dtype | None
    update: torch.dtype | None
    reason: str
    seconds: dict = field(default_factory=dict)  # what was measured: {"rollout": {"fp32": s, "bf16": s}, ...}

    def describe(self) -> str:
        return f"precision: rollout {NAMES[self.rollout]}, update {NAMES[self.update]} ({self.reason})"

    def to_json(self) -> dict:
        return {**asdict(self), "rollout": NAMES[self.rollout], "update": NAMES[self.update]}

    @classmethod
    def from_json(cls, data: dict) -> Precision:
        return cls(DTYPES[data["rollout"]], DTYPES[data["update"]], data.get("reason", ""), data.get("seconds", {}))


def faster(seconds: dict[str, float], margin: float = BF16_MARGIN) -> torch.dtype | None:
    """bf16 when t_bf16 <= margin * t_fp32, else None (fp32)."""
    return torch.bfloat16 if seconds["bf16"] <= margin * seconds["fp32"] else None


def probe_ids(model, rows: int, length: int, device) -> torch.Tensor:
    """Fixed token ids (rows, length) inside the vocabulary: no random draw, so the run's RNG is untouched."""
    vocab = int(model.config.vocab_size)
    return (torch.arange(rows * length, device=device).view(rows, length) * 7919 % (vocab - 1)) + 1


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def update_seconds(model, dtype, *, rows: int = UPDATE_PROBE_ROWS, prompt: int = 16, completion: int = 32) -> float:
    """Seconds for one forward+backward of the completion log-probs of `rows` sequences under autocast
    in `dtype` (None: fp32), as the update runs it. The gradients are discarded."""
    from grpolab.model.logprobs import completion_logp

    device = next(model.parameters()).device
    p_ids = probe_ids(model, rows, prompt, device)
    c_ids = probe_ids(model, rows, completion, device).flip(-1)
    sync(device)
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        logp, _ = completion_logp(model, p_ids, torch.ones_like(p_ids), c_ids, torch.ones(c_ids.shape, device=device))
    logp.float().mean().backward()
    sync(device)
    dt = time.perf_counter() - t0
    for p in model.parameters():
        p.grad = None
    return dt


def time_both(fn, reps: int = 2, *, deadline: float | None = None, warmup=None) -> dict[str, float]:
    """Best of up to `reps` timings of fn(dtype) for fp32 and bf16, alternating, after one warm-up of each
    (warmup(dtype), by default fn(dtype): a smaller call that pays the same first-call costs will do).
    After the first pair no further pair starts past `deadline` (time.perf_counter()); a bf16 warm-up
    SLOW_WARMUP times fp32's ends it at once (bf16 cannot pay; its time is that warm-up's)."""
    warm = {name: (warmup or fn)(DTYPES[name]) for name in ("fp32", "bf16")}  # kernels, allocator, autocast
    if warm["bf16"] > SLOW_WARMUP * warm["fp32"]:
        return warm
    best = {"fp32": float("inf"), "bf16": float("inf")}
    for i in range(reps):
        if i and deadline is not None and time.perf_counter() >= deadline:
            break
        for name in best:
            best[name] = min(best[name], fn(DTYPES[name]))
    return best


def measure(
    model,
    *,
    training: bool = True,
    rollout_probe: RolloutProbe | None = None,
    rows: int = 8,
    tokens: int = PROBE_STEPS,
    engine_rollout: tuple[torch.dtype | None, str] | None = None,
    budget: float = PROBE_BUDGET_S,
    log: Callable[[str], None] | None = None,
) -> Precision:
    """Time both precisions on `model` for the rollout (and the update when training) and choose, each
    phase repeating its timings within its share of `budget` seconds (time_both) after a warm-up of each
    precision on one row (WARMUP: what a first call pays once, the weights' copies and their pages, the
    kernels' set-up, is the same for one row as for many; the timed calls are the run's shape). `log` is
    told each phase's ratio as it is measured, before the next phase starts. `rows`,
    `tokens`: the shape of the run's rollouts (sequences per generate call, at most MAX_PROBE_ROWS, and
    new tokens): the lean step's gain over fp32 differs with both. `rollout_probe`: the rollout engine's
    timing of one rollout (grpolab.engine.native.probe.decode_seconds for grpolab's own decoder);
    `engine_rollout`: (dtype, why) of an engine that samples with its own kernels; the rollout is then not
    timed here. One of the two is given."""
    if engine_rollout is None and rollout_probe is None:
        raise TypeError("precision.measure: give the rollout engine's rollout_probe or its engine_rollout rule")
    rows = max(1, min(rows, MAX_PROBE_ROWS))
    was_training = model.training
    seconds = {}
    start = time.perf_counter()
    phases = (engine_rollout is None) + training
    with torch.random.fork_rng(devices=[]):  # dropout (a LoRA adapter's) must not move the run's stream
        try:
            if engine_rollout is None:
                model.eval()
                seconds["rollout"] = time_both(
                    lambda dt: rollout_probe(model, dt, rows=rows, tokens=tokens),
                    warmup=lambda dt: rollout_probe(model, dt, rows=1, tokens=PROBE_STEPS),
                    deadline=start + budget / phases,
                )
                if training and log is not None:
                    r = seconds["rollout"]["bf16"] / seconds["rollout"]["fp32"]
                    log(
                        f"precision=auto: rollout bf16/fp32 time x{r:.2f} ({time.perf_counter() - start:.1f} s); timing the update..."
                    )
            model.train(was_training)
            if training:
                seconds["update"] = time_both(
                    lambda dt: update_seconds(model, dt),
                    warmup=lambda dt: update_seconds(model, dt, **WARMUP_UPDATE),
                    deadline=start + budget,
                )
        finally:
            model.train(was_training)
    took = time.perf_counter() - start
    ratio = {k: v["bf16"] / v["fp32"] for k, v in seconds.items()}
    rollout = faster(seconds["rollout"]) if engine_rollout is None else engine_rollout[0]
    update = faster(seconds["update"]) if training else None
    why = ", ".join(f"{k} bf16/fp32 time x{r:.2f}" for k, r in ratio.items())
    why = f"auto, measured here in {took:.1f} s: {why}; bf16 kept where <= x{BF16_MARGIN}" if why else "auto"
    if engine_rollout is not None:
        why += f"; rollout: {engine_rollout[1]}"
    return Precision(rollout, update, why, {k: {n: round(t, 4) for n, t in v.items()} for k, v in seconds.items()})


def choose(
    setting: str,
    model,
    device: torch.device,
    *,
    training: bool = True,
    distributed: bool = False,
    rollout_probe: RolloutProbe | None = None,
    recorded: Path | None = None,
    rows: int = 8,
    tokens: int = PROBE_STEPS,
    engine_rollout: tuple[torch.dtype | None, str] | None = None,
    cache: bool = True,
    log: Callable[[str], None] | None = None,
) -> Precision:
    """The precision of a run: `setting` fp32 / bf16 / fp16 as given; auto as described in this module's
    docstring. `recorded`: a precision.json of the run being resumed, which wins for auto; `rows`,
    `tokens`: the shape of its rollouts and `rollout_probe` the engine's timing of one (measure);
    `engine_rollout`: (dtype, why) of a rollout engine that does not decode with the policy
    (grpolab.engine.rollout_precision), taken instead of the rollout probe, which times grpolab's own
    decoder. On a CPU, in this order: bf16_can_pay (fp32, decided from the CPU), the answer remembered for
    this machine and shape (`cache`; grpolab.model.precision_cache), else measure and remember; `log` is
    told before the measurement starts."""
    if setting == "fp32":
        return Precision(None, None, "precision=fp32")
    if setting == "bf16":
        return Precision(torch.bfloat16, torch.bfloat16, "precision=bf16")
    if setting == "fp16":  # loss-scaled in the update (grpolab.model.loss_scale, which says where it runs)
        return Precision(torch.float16, torch.float16, "precision=fp16, the update's loss scaled")
    if recorded is not None and recorded.exists():
        data = json.loads(recorded.read_text())
        return Precision.from_json({**data, "reason": f"as recorded in {recorded} ({data.get('reason', '')})"})
    if device.type == "cuda":
        bf16 = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return Precision(bf16, bf16, "auto: " + ("a bf16-capable GPU" if bf16 else "this GPU has no bf16"))
    if distributed:
        return Precision(None, None, "auto: fp32 on CPUs under torchrun (not measured: every rank must agree)")
    n = sum(p.numel() for p in model.parameters())
    if n < SMALL_MODEL_PARAMS:
        return Precision(
            None,
            None,
            f"auto: fp32 for a {n / 1e6:.1f}M-parameter model (not measured: "
            f"under {SMALL_MODEL_PARAMS // 1_000_000}M, bf16 does not pay)",
        )
    shape = {"training": training, "rows": max(1, min(rows, MAX_PROBE_ROWS)), "tokens": tokens}
    if device.type != "cpu":
        return measure(model, rollout_probe=rollout_probe, engine_rollout=engine_rollout, **shape)
    can_pay, why = bf16_can_pay(device)
    if not can_pay:
        return from_the_cpu(why, engine_rollout)
    key = None
    if cache:
        key = precision_cache.shape_key(model, cpu_facts(), probe=rollout_probe, engine_rollout=engine_rollout, **shape)
        found = precision_cache.read(key)
        if found is not None:
            entry, path = found
            data = entry["precision"]
            reason = f"auto, cached: measured on this machine for this shape at {entry.get('measured_at', '?')} ({path}; delete it to measure again): {data.get('reason', '')}"
            return Precision.from_json({**data, "reason": reason})
    if log is not None:
        phases = " and ".join(p for p, on in (("the rollout", engine_rollout is None), ("the update", training)) if on)
        log(
            f"precision=auto: timing bf16 against fp32 on the policy, {phases}, once for this machine and shape (this CPU: {why})..."
        )
    prec = measure(model, rollout_probe=rollout_probe, engine_rollout=engine_rollout, log=log, **shape)
    if key is not None:
        precision_cache.write(key, prec.to_json())
    return prec


def from_the_cpu(why: str, engine_rollout: tuple[torch.dtype | None, str] | None = None) -> Precision:
    """fp32 for every phase grpolab computes, decided from the CPU (bf16_can_pay said no) without timing;
    an engine with its own kernels keeps its rule for the rollout."""
    rollout = None if engine_rollout is None else engine_rollout[0]
    reason = f"auto, decided from the CPU: {why}"
    if engine_rollout is not None:
        reason += f"; rollout: {engine_rollout[1]}"
    return Precision(rollout, None, reason)
