"""Activation checkpointing of the update pass, on and off (grpolab.model.checkpointing): time, memory, same numbers.

    .venv/bin/python benchmarks/checkpointing_ab.py [--completion 128] [--precision bf16] [--reps 3]

SmolLM2-135M-Instruct (the bundled model), 2 prompts of 48 tokens x G = 8 completions of --completion
tokens: one micro-batch of 16 sequences as the update runs it (grouped_completion_logp with entropies,
then backward), in one process, the two variants alternated --reps times after a warm-up of each.
Prints the best time of each (and every time: this machine's load moves them), the peak bytes torch's
CPU allocator had live during the pass above what was live before it (the first micro-batch of an
update: no gradients held yet) (the profiler's memory events, as benchmarks/memory_plan.py measures), what
grpolab.model.memory predicts for the same pass, and checks that both give the same log-probs and
gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpolab.model.checkpointing import checkpointed
    from grpolab.model.load import load_policy, model_dir
    from grpolab.model.logprobs import grouped_completion_logp
    from grpolab.model.memory import Regime, Workload, pass_activations
    from grpolab.model.shapes import SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(2)
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu"))
    model.train()
    g = torch.Generator().manual_seed(0)
    B, G, P, C = 2, 8, 48, a.completion
    p_ids = torch.randint(100, 40000, (B, P), generator=g)
    c_ids = torch.randint(100, 40000, (B * G, C), generator=g)
    amp = a.precision == "bf16"

    def once(ckpt: bool):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        with checkpointed(model, ckpt), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logp, _ = grouped_completion_logp(model, p_ids, torch.ones_like(p_ids), c_ids, torch.ones(B * G, C), G,
                                              with_entropy=True)
        logp.float().mean().backward()
        sec = time.perf_counter() - t
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return sec, float(logp.detach().sum()), grads

    def peak(ckpt: bool) -> int:
        """The pass's peak above what was live before it (no gradients yet: the first micro-batch)."""
        model.zero_grad(set_to_none=True)  # freed before the window: the profiler sees only the pass's own
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            once(ckpt)
        cur = top = 0
        for _, b in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                           if e.name() == "[memory]"):
            cur += b
            top = max(top, cur)
        return top

    res = {False: {"times": []}, True: {"times": []}}
    for ckpt in (False, True):
        once(ckpt)  # warm-up
    for _ in range(a.reps):
        for ckpt in (False, True):
            sec, lp, grads = once(ckpt)
            res[ckpt]["times"].append(sec)
            res[ckpt]["logp_sum"], res[ckpt]["grads"] = lp, grads
    for ckpt in (False, True):
        res[ckpt]["peak_bytes"] = peak(ckpt)
        w = Workload(B, G, P, C, C, seqs_per_pass=B * G)
        acts = pass_activations(SHAPES["smollm2-135m"], w, Regime(update_bytes=2 if amp else 4, checkpointing=ckpt),
                                B * G)
        res[ckpt]["predicted_activations"] = acts["activations"]
    off, on = res[False], res[True]
    mb = 2 ** 20
    diff = float((off["grads"] - on["grads"]).abs().max())
    print(f"16 sequences x {C} completion tokens, {a.precision}, one micro-batch forward+backward, best of {a.reps}")
    for name, r in (("plain", off), ("checkpointed", on)):
        print(f"  {name:13} {min(r['times']):6.2f} s/pass (all: {', '.join(f'{t:.1f}' for t in r['times'])})   peak above start {r['peak_bytes'] / mb:7.0f} MB   "
              f"predicted activations {r['predicted_activations'] / mb:6.0f} MB")
    print(f"  checkpointed/plain: time x{min(on['times']) / min(off['times']):.2f}, "
          f"peak x{on['peak_bytes'] / off['peak_bytes']:.2f}")
    print(f"  same numbers: log-prob sums {off['logp_sum']:.4f} / {on['logp_sum']:.4f}, "
          f"max |grad difference| {diff:.3g}")
    print(json.dumps({k: {kk: v for kk, v in r.items() if kk != "grads"} for k, r in
                      (("plain", off), ("checkpointed", on))}))


if __name__ == "__main__":
    main()
