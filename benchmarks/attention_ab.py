"""The update's forward+backward with sdpa vs grpolab.model.attention, alternating in one process.

    .venv/bin/python benchmarks/attention_ab.py [--reps 6] [--completion 64]

SmolLM2-135M-Instruct, 2 prompts of 46 tokens x G = 8 completions (one padded), under bf16 autocast,
through grouped_completion_logp with entropies (the update's pass) and its backward. Prints the median
seconds of each attention over --reps alternations, and both log-prob sums.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--completion", type=int, default=64)
    a = ap.parse_args()
    from grpolab.model import attention
    from grpolab.model.load import load_policy, model_dir
    from grpolab.model.logprobs import grouped_completion_logp

    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    p_ids = torch.randint(100, 40000, (2, 46), generator=g)
    c_ids = torch.randint(100, 40000, (16, a.completion), generator=g)
    c_mask = torch.ones(16, a.completion)
    c_mask[3, a.completion - 14:] = 0
    times: dict[str, list[float]] = {"sdpa": [], attention.NAME: []}
    sums = {}
    for _ in range(a.reps):
        for impl in times:
            model.set_attn_implementation(impl)
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lp, _ = grouped_completion_logp(model, p_ids, torch.ones_like(p_ids), c_ids, c_mask, 8,
                                                with_entropy=True)
            (lp * c_mask).sum().backward()
            times[impl].append(time.perf_counter() - t)
            sums[impl] = float((lp * c_mask).sum())
            model.zero_grad(set_to_none=True)
    for impl, ts in times.items():
        print(f"{impl:12s} median {statistics.median(ts):.3f} s  all {[round(t, 2) for t in ts]}  "
              f"log-prob sum {sums[impl]:.3f}")


if __name__ == "__main__":
    main()
