"""Peak memory of one update micro-batch with the plain LM head vs the chunked one (grpolab.model.lmhead).

    .venv/bin/python benchmarks/memory_lmhead.py [--completion 128] [--precision bf16] [--reps 2]

Each variant runs in its own process (peak RSS is per process): SmolLM2-135M-Instruct, 2 prompts of 48
tokens x G = 8 completions of --completion tokens (16 sequences, one micro-batch, as the update runs
it: grouped_completion_logp with entropies, then backward). Prints peak RSS, the model-and-runtime
baseline before the pass, seconds per pass (best of --reps; noisy on a shared machine), and checks
that both variants give the same log-probs and gradient norm.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(variant: str, completion: int, precision: str, reps: int) -> dict:
    import torch

    import grpolab.model.logprobs as lp_mod
    from grpolab.model.load import load_policy, model_dir

    if variant == "plain":
        lp_mod.plain_head_weight = lambda model: None  # the whole (b, C, V) logits at once, as before
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    p_ids = torch.randint(100, 40000, (2, 48), generator=g)
    c_ids = torch.randint(100, 40000, (16, completion), generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logp, _ = lp_mod.grouped_completion_logp(model, p_ids, torch.ones_like(p_ids), c_ids,
                                                     torch.ones(16, completion), 8, with_entropy=True)
        logp.float().mean().backward()
        times.append(time.perf_counter() - t)
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        model.zero_grad(set_to_none=True)
    return {"variant": variant, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "baseline_mb": base, "seconds": min(times), "logp_sum": float(logp.sum()), "grad_norm": gnorm}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant:
        print(json.dumps(one(a.variant, a.completion, a.precision, a.reps)))
        return
    res = {}
    for v in ("plain", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--variant", v, "--completion", str(a.completion),
                              "--precision", a.precision, "--reps", str(a.reps)],
                             capture_output=True, text=True, check=True).stdout
        res[v] = json.loads(out.strip().splitlines()[-1])
    p, c = res["plain"], res["chunked"]
    print(f"16 sequences x {a.completion} completion tokens, {a.precision}, one micro-batch forward+backward")
    for r in (p, c):
        print(f"  {r['variant']:8} peak {r['peak_mb']:7.0f} MB  (before the pass {r['baseline_mb']:5.0f} MB)  "
              f"{r['seconds']:6.2f} s/pass")
    print(f"  chunked/plain: peak x{c['peak_mb'] / p['peak_mb']:.2f}, pass growth x"
          f"{(c['peak_mb'] - c['baseline_mb']) / (p['peak_mb'] - p['baseline_mb']):.2f}, time x{c['seconds'] / p['seconds']:.2f}")
    print(f"  same numbers: log-prob sums {p['logp_sum']:.3f} / {c['logp_sum']:.3f}, grad norms "
          f"{p['grad_norm']:.5f} / {c['grad_norm']:.5f}")
    print(json.dumps({"plain": p, "chunked": c}))


if __name__ == "__main__":
    main()
