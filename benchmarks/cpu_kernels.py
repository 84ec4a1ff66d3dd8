"""The kernel-level CPU measurements behind docs/performance.md ("The lean decode step", "The update on
a CPU"), each in this process:

    .venv/bin/python benchmarks/cpu_kernels.py
    PYTHONPATH=/path/to/a/worktree/src .venv/bin/python benchmarks/cpu_kernels.py   # another commit's head

- fresh vs touched memory: exp of a 341 x 49,152 fp32 tensor into a new tensor, and in place;
- the chunked LM head (grpolab.model.lmhead) of 1024 positions, vocabulary 49,152, hidden 576, bf16 autocast,
  with entropies, its logits kept for the backward vs recomputed there: forward and backward seconds
  (medians of 5 alternations; run last, with freed memory kept as in training);
- 16-row bf16 products with cold weights (200 distinct 1536 x 576 matrices): F.linear vs the oneDNN
  packed layout the lean decode step uses (GFLOP/s);
- glibc's malloc as it is vs grpolab.parallel.allocator.keep_freed_memory (each in its own process, since the
  setting lasts for the process): a 16 x 127 x 576 fp32 multiply into a new tensor, and a 49,152 x 576
  fp32 -> bf16 cast into a new tensor (the LM head's weight; timed first), milliseconds (best of 5);
- AdamW over the bundled model's 134.5M parameters: torch's default (foreach) vs fused, seconds per step.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def best(fn, reps: int = 3) -> float:
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def fresh_vs_touched() -> None:
    z = torch.randn(341, 49152)
    fresh = best(lambda: torch.exp(z))
    inplace = best(lambda: z.mul_(1.0))
    print(f"exp into a new 341x49152 fp32 tensor {fresh * 1e3:.1f} ms; an in-place op on it {inplace * 1e3:.1f} ms")


def lm_head() -> None:
    """Kept logits (the default under lmhead.SAVED_LOGITS_BYTES) vs recomputed (keep_bytes=0), alternating,
    with freed memory kept in the process as the training step runs it (so this section comes last)."""
    from grpolab.model.lmhead import SAVED_LOGITS_BYTES, chunked_token_logp
    from grpolab.parallel.allocator import keep_freed_memory

    keep_freed_memory()
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(1, 1024, 576, generator=g) * 0.5).requires_grad_()
    w = (torch.randn(49152, 576, generator=g) * 0.05).requires_grad_()
    t = torch.randint(0, 49152, (1, 1024), generator=g)
    times = {"kept": ([], []), "recomputed": ([], [])}
    for _ in range(6):
        for name, keep in (("kept", SAVED_LOGITS_BYTES), ("recomputed", 0)):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lp, _ = chunked_token_logp(h, w, t, with_entropy=True, keep_bytes=keep)
            t1 = time.perf_counter()
            lp.sum().backward()
            times[name][0].append(t1 - t0)
            times[name][1].append(time.perf_counter() - t1)
            h.grad = w.grad = None
    for name, (fwd, bwd) in times.items():
        print(f"chunked LM head, 1024 positions, logits {name:10s}: forward {statistics.median(fwd[1:]):.3f} s, "
              f"backward {statistics.median(bwd[1:]):.3f} s (medians of 5)")


def packed_products() -> None:
    Ws = [torch.randn(1536, 576, dtype=torch.bfloat16) for _ in range(200)]
    x = torch.randn(16, 576, dtype=torch.bfloat16)
    flops = 2 * 16 * 1536 * 576 * len(Ws)
    plain = best(lambda: [F.linear(x, W) for W in Ws])
    try:
        packs = [torch.ops.mkldnn._reorder_linear_weight(W, 16) for W in Ws]
        packed = best(lambda: [torch.ops.mkldnn._linear_pointwise(x, P, None, "none", [], "") for P in packs])
        extra = f", packed {flops / packed / 1e9:.0f} GFLOP/s"
    except (RuntimeError, AttributeError) as e:
        extra = f", packed: not available ({type(e).__name__})"
    print(f"16-row bf16 products, cold weights: F.linear {flops / plain / 1e9:.0f} GFLOP/s{extra}")


_MALLOC_PROBE = """
import sys, time, torch
from grpolab.parallel.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
def best(fn):
    fn(); out = []
    for _ in range(5):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return min(out) * 1e3
x, w, W = torch.randn(16, 127, 576), torch.randn(576), torch.randn(49152, 576)
cast = best(lambda: W.to(torch.bfloat16))
print(f"{best(lambda: x * w):.2f} {cast:.1f}")
"""


def malloc_kept() -> None:
    import subprocess
    import sys

    for mode in ("system", "keep"):
        out = subprocess.run([sys.executable, "-c", _MALLOC_PROBE, mode], capture_output=True, text=True, check=True)
        mul, cast = out.stdout.split()
        print(f"malloc {mode:6s}: multiply into a new 16x127x576 tensor {mul} ms; head weight cast to bf16 {cast} ms")


def adamw() -> None:
    from grpolab.model.load import load_policy, model_dir

    ps = list(load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu")).parameters())
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    res = {}
    for fused in (False, True):
        opt = torch.optim.AdamW(ps, lr=1e-6, fused=fused)
        res[fused] = best(opt.step)
    print(f"AdamW step, {sum(p.numel() for p in ps):,} parameters: foreach {res[False]:.3f} s, fused {res[True]:.3f} s")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    fresh_vs_touched()
    packed_products()
    malloc_kept()
    adamw()
    lm_head()
