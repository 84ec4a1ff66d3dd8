"""A plan in words and as JSON: what `grpolab plan` prints (report_lines, report_json) around one plan's
table (describe, to_json) and the settings that fit when it does not."""

from __future__ import annotations

from grpolab.training.plan.devices import GB
from grpolab.training.plan.estimate import BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY, Plan

Alternatives = list[tuple[list[str], Plan]]
"""Sets of changes and their plans, as grpolab.training.plan.estimate.fitting returns them."""


def _gb(b: float) -> str:
    return f"{b / GB:.1f} GB" if b >= 0.1 * GB else f"{b / 2**20:.0f} MB"


def describe(p: Plan) -> list[str]:
    """The plan as lines of text: the run, every phase with its own parts, the peak, the time."""
    s, w, r, d = p.shape, p.workload, p.regime, p.device
    how = f"LoRA r={r.lora_r}" if r.lora_r else "full fine-tuning"
    prec = f"update {'bf16' if r.update_bytes == 2 else 'fp32'}, rollout {'bf16' if r.rollout_bytes == 2 else 'fp32'}"
    extras = (
        (" (lean decoder)" if r.lean else "")
        + f", reference: {r.reference}"
        + (", critic" if r.critic else "")
        + (", grad_checkpointing" if r.checkpointing else "")
    )
    trained = p.phases[0].parts["AdamW state"] / 8 / 1e6
    usable = f" ({_gb(d.usable)} usable)" if d.usable != d.memory else ""
    lines = [
        f"{s.name}: {s.params / 1e9:.2f}B parameters ({how}, trained {trained:,.1f}M), {prec}{extras}",
        f"step: {w.prompts} prompts x G={w.G} = {w.rows} sequences, prompt {w.prompt_tokens} + completion "
        + f"{w.completion_tokens} tokens, micro-batches of {min(w.seqs_per_pass, w.rows)} sequences "
        + f"({w.micro_batches} per update), mu={w.mu}",
        f"device: {d.name}, {_gb(d.memory)}{usable}",
        "",
    ]
    base = p.phases[0].parts
    lines.append(
        f"  {'resident':24} {_gb(p.phases[0].total):>9}   " + ", ".join(f"{k} {_gb(v)}" for k, v in base.items() if v)
    )
    for ph in p.phases[1:]:
        own = {k: v for k, v in ph.parts.items() if k not in base and v}
        lines.append(
            f"  {ph.name:24} {_gb(ph.total):>9}   + "
            + (", ".join(f"{k} {_gb(v)}" for k, v in own.items()) or "nothing")
            + (f" ({ph.note})" if ph.note else "")
        )
    pk = p.peak
    verdict = "fits" if p.fits else "does NOT fit"
    lines += [
        "",
        f"peak: {_gb(pk.total)} in {pk.name}: {verdict} in {_gb(d.usable)}",
        f"time: about {p.step_seconds:.1f} s per step ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in p.seconds.items())
        + ") at "
        f"{(d.bf16_flops if r.update_bytes == 2 else d.fp32_flops) / 1e12:.1f} TFLOP/s, {d.bandwidth / 1e9:.0f} GB/s "
        f"({MATMUL_EFFICIENCY:.0%} of the rate, {BANDWIDTH_EFFICIENCY:.0%} of the bandwidth: "
        "grpolab.training.plan)",
    ]
    lines += [f"note: {n}" for n in p.notes]
    return lines


def to_json(p: Plan) -> dict:
    """The plan as plain values: the model, the device, the peak and every phase's bytes, the seconds."""
    return {
        "model": p.shape.name,
        "params": p.shape.params,
        "device": p.device.name,
        "memory": p.device.memory,
        "usable": p.device.usable,
        "fits": p.fits,
        "peak_bytes": p.peak.total,
        "peak_phase": p.peak.name,
        "phases": {ph.name: {"total": ph.total, "parts": ph.parts} for ph in p.phases},
        "seconds": p.seconds,
        "step_seconds": p.step_seconds,
        "notes": p.notes,
    }


def report_lines(p: Plan, prompt_tokens: int, source: str, alternatives: Alternatives) -> list[str]:
    """What `grpolab plan` prints: the plan, where its prompt length came from, and when the peak does
    not fit, the settings that do (or what else there is when none does)."""
    lines = [*describe(p), f"prompt tokens: {prompt_tokens} ({source})"]
    if p.fits:
        return lines
    if alternatives:
        lines += ["", "settings that fit (peak, time per step):"]
        lines += [
            f"  {' '.join(changes):62} {_gb(q.peak.total):>9}  {q.step_seconds:7.1f} s  ({q.peak.name})"
            for changes, q in alternatives
        ]
    else:
        lines += [
            "",
            "nothing tried fits (grad_checkpointing, micro_batch, precision=bf16, lora.r=16, shorter "
            "completions): a smaller model, or more devices with fsdp=true (docs/distributed.md)",
        ]
    return lines


def report_json(p: Plan, prompt_tokens: int, source: str, alternatives: Alternatives) -> dict:
    """What `grpolab plan --json` prints: to_json's plan, the prompt length and its source, and the
    settings that fit (their changes, peak and time per step)."""
    return {
        **to_json(p),
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_from": source,
        "fitting": [
            {"changes": c, "peak_bytes": q.peak.total, "peak_phase": q.peak.name, "step_seconds": q.step_seconds}
            for c, q in alternatives
        ],
    }


__all__ = ["describe", "report_json", "report_lines", "to_json"]
