"""`grpolab plan [RECIPE] [KEY=VALUE ...] --memory 32GB`: what a run would hold and cost before it runs.

Prints, per phase of one step, the bytes it holds (grpolab.model.memory: generation with its KV cache
or an inference engine's share, the reference pass, the update with its activations per
micro-batch and the pending gradients, the LM head's logits chunks, AdamW's state, a critic), the
peak and the phase that sets it, the seconds of each phase from its FLOPs and the device's rate
(grpolab.training.plan), and, when the peak does not fit, the changes that do. Nothing is loaded
but the tokenizer (to count the prompt's tokens); `model=` may also name a published architecture
(grpolab.model.shapes.SHAPES: qwen2.5-7b, llama-3.1-8b, ...), planned from its shape alone.

--memory takes a size (24GB, 80GiB) or a card (CARDS: rtx4090, rtx5090, a100-80gb, h100-80gb); a
size is planned with the card of that size (24 GB: RTX 4090, 32 GB: RTX 5090, 80 GB: A100 80GB).
Without --memory: this machine (its CUDA GPU, else its CPU: the memory it has and its measured
matmul rate).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from grpolab.training.plan import BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY, Device, Plan, fitting, plan, prompt_tokens_of
from grpolab.util.fields import ConfigError

GB = 1 << 30
CARDS: dict[str, Device] = {
    "rtx4090": Device("RTX 4090 (24 GB)", 24 * GB, 165.2e12, 82.6e12, 1.008e12),
    "rtx5090": Device("RTX 5090 (32 GB)", 32 * GB, 209.5e12, 104.8e12, 1.792e12),
    "a100-80gb": Device("A100 80GB", 80 * GB, 312e12, 19.5e12, 2.039e12),
    "h100-80gb": Device("H100 SXM 80GB", 80 * GB, 989e12, 67e12, 3.35e12),
}
"""Dense bf16 tensor-core rate (fp32 accumulation), fp32 rate and memory bandwidth from each vendor's
datasheet (A100/H100: fp32 without tensor cores)."""
BY_SIZE = {24: "rtx4090", 32: "rtx5090", 80: "a100-80gb"}

USAGE = """grpolab plan [RECIPE.yaml | RECIPE_NAME] [KEY=VALUE ...] [--memory 32GB | --memory rtx5090]

Peak memory per phase of one step, the time from FLOPs, and settings that fit, before anything runs.
KEY=VALUE as for grpolab train; model= may also be a published shape: """


def parse_memory(text: str) -> Device:
    """A card name (CARDS) or a size: 24GB, 24 GB, 80GiB, 32G (GB and GiB are both read as 2^30 bytes,
    as cards are sold); a size names the card of that size, or a card of that memory at the RTX 5090's rates."""
    key = text.strip().lower().replace(" ", "").replace("_", "-")
    if key in CARDS:
        return CARDS[key]
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|gb|gib)?", key)
    if not m:
        raise ConfigError(f"--memory: {text!r} is neither a size (24GB, 32GB, 80GB) nor a card ({', '.join(CARDS)})")
    size = float(m.group(1))
    if size <= 0:
        raise ConfigError(f"--memory: {text!r} must be more than 0 GB")
    card = BY_SIZE.get(int(size)) if size == int(size) else None
    if card:
        return CARDS[card]
    base = CARDS["rtx5090"]
    return Device(f"{size:g} GB GPU (RTX 5090 rates)", int(size * GB), base.bf16_flops, base.fp32_flops, base.bandwidth)


def this_machine() -> Device:
    """The CUDA GPU here, else this CPU: its total memory, and matmul rates and bandwidth measured now
    (a 1024^3 product in each precision, a 256 MB copy; well under a second)."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = props.name.lower().replace(" ", "")
        card = next((c for k, c in CARDS.items() if k.split("-")[0].replace("rtx", "") in name), CARDS["rtx5090"])
        return Device(props.name, props.total_memory, card.bf16_flops, card.fp32_flops, card.bandwidth)
    from grpolab.training.plan import _available_cpu_bytes

    rates = {}
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(1024, 1024, dtype=dt)
        a @ a
        t = time.perf_counter()
        for _ in range(3):
            a @ a
        rates[dt] = 3 * 2 * 1024**3 / (time.perf_counter() - t)
    x = torch.empty(1 << 26)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    y.copy_(x)
    bandwidth = 2 * x.numel() * 4 / (time.perf_counter() - t)
    return Device("this CPU", _available_cpu_bytes(), rates[torch.bfloat16], rates[torch.float32], bandwidth, "cpu")


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


def _prompt_tokens(cfg, given: int | None) -> tuple[int, str]:
    """--prompt-tokens, else the task's longest prompt in the model's (or the bundled) tokenizer's template."""
    if given:
        return given, "--prompt-tokens"
    from grpolab.model.load import load_tokenizer, model_dir
    from grpolab.model.shapes import SHAPES

    name = cfg.model if cfg.model not in SHAPES or cfg.model == "smollm2-135m" else "smollm2-135m"
    tok = load_tokenizer(model_dir(name, log=lambda *_: None))
    n = prompt_tokens_of(cfg, tok)
    return n, f"the longest of 64 prompts of task={cfg.task}" + ("" if name == cfg.model else " (SmolLM2's tokenizer)")


def main(argv: list[str]) -> int:
    from grpolab.model.shapes import SHAPES
    from grpolab.training.config import build_config
    from grpolab.training.recipe import load_recipe

    ap = argparse.ArgumentParser(
        prog="grpolab plan",
        usage=USAGE + ", ".join(SHAPES),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("args", nargs="*", help="a recipe (first) and KEY=VALUE overrides")
    ap.add_argument("--memory", help="a size (24GB, 32GB, 80GB) or a card: " + ", ".join(CARDS))
    ap.add_argument("--prompt-tokens", type=int, help="prompt length to plan for (default: the task's longest)")
    ap.add_argument(
        "--engine-share",
        type=float,
        default=0.0,
        help="fraction of the device an inference engine reserves for generation (vLLM's "
        "gpu_memory_utilization when colocated); 0: grpolab's own rollout",
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ns = ap.parse_intermixed_args(argv)  # options and KEY=VALUE in any order
    if ns.prompt_tokens is not None and ns.prompt_tokens < 1:
        raise ConfigError("--prompt-tokens: must be >= 1")
    if not 0 <= ns.engine_share < 1:
        raise ConfigError("--engine-share: must be in [0, 1)")
    args = list(ns.args)
    recipe = load_recipe(args.pop(0)) if args and "=" not in args[0] else {}
    bad = [a for a in args if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]!r}: expected KEY=VALUE (only the first argument may be a recipe file)")
    cfg = build_config(recipe, args)
    device = parse_memory(ns.memory) if ns.memory else this_machine()
    tokens, source = _prompt_tokens(cfg, ns.prompt_tokens)
    kw = {"prompt_tokens": tokens, "engine_share": ns.engine_share}
    p = plan(cfg, device, **kw)
    alternatives = [] if p.fits else fitting(cfg, args, device, recipe, **kw)
    if ns.json:
        print(
            json.dumps(
                {
                    **to_json(p),
                    "prompt_tokens": tokens,
                    "prompt_tokens_from": source,
                    "fitting": [
                        {
                            "changes": c,
                            "peak_bytes": q.peak.total,
                            "peak_phase": q.peak.name,
                            "step_seconds": q.step_seconds,
                        }
                        for c, q in alternatives
                    ],
                },
                indent=2,
            )
        )
        return 0
    print("\n".join(describe(p)))
    print(f"prompt tokens: {tokens} ({source})")
    if not p.fits:
        if alternatives:
            print("\nsettings that fit (peak, time per step):")
            for changes, q in alternatives:
                print(f"  {' '.join(changes):62} {_gb(q.peak.total):>9}  {q.step_seconds:7.1f} s  ({q.peak.name})")
        else:
            print(
                "\nnothing tried fits (grad_checkpointing, micro_batch, precision=bf16, lora.r=16, shorter "
                "completions): a smaller model, or more devices with fsdp=true (docs/distributed.md)"
            )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
