"""The kernel-level CPU measurements behind docs/performance.md ("The lean decode step", "The update on
a CPU"), each in this process:

    .venv/bin/python benchmarks/cpu_kernels.py
    PYTHONPATH=/path/to/a/worktree/src .venv/bin/python benchmarks/cpu_kernels.py   # another commit's head

- fresh vs touched memory: exp of a 341 x 49,152 fp32 tensor into a new tensor, and in place;
- the chunked LM head (grpolab.lmhead) of 1024 positions, vocabulary 49,152, hidden 576, bf16 autocast,
  with entropies: forward and backward seconds (best of 3);
- 16-row bf16 products with cold weights (200 distinct 1536 x 576 matrices): F.linear vs the oneDNN
  packed layout the lean decode step uses (GFLOP/s);
- AdamW over the bundled model's 134.5M parameters: torch's default (foreach) vs fused, seconds per step.
"""

from __future__ import annotations

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
    from grpolab.lmhead import chunked_token_logp

    g = torch.Generator().manual_seed(0)
    h = (torch.randn(1, 1024, 576, generator=g) * 0.5).requires_grad_()
    w = (torch.randn(49152, 576, generator=g) * 0.05).requires_grad_()
    t = torch.randint(0, 49152, (1, 1024), generator=g)
    fwd, bwd = [], []
    for _ in range(4):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, _ = chunked_token_logp(h, w, t, with_entropy=True)
        t1 = time.perf_counter()
        lp.sum().backward()
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
        h.grad = w.grad = None
    print(f"chunked LM head, 1024 positions: forward {min(fwd[1:]):.3f} s, backward {min(bwd[1:]):.3f} s")


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


def adamw() -> None:
    from grpolab.models import load_policy, model_dir

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
    lm_head()
    packed_products()
    adamw()
