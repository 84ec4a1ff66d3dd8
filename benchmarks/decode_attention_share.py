"""How much of the lean decode step is its attention: the torch products, the C kernel, and a floor.

    .venv/bin/python benchmarks/decode_attention_share.py [--rounds 4] [--steps 128]

SmolLM2-135M-Instruct in bf16 (the rollout's layout), 2 prompts of 46 tokens, prefilled and repeated to
16 rows, then --steps decode steps, for each of three attentions in turn (--rounds alternations):
"torch" (grpolab.model.attention's two products), "kernel" (grpolab.engine.native.kernels' C kernel, as shipped) and
"read only", which sums the row's cached keys and values and returns the queries (no attention at
all: what merely reading the cache costs inside the step). Prints ms per step and the ms of it spent
in the attention call, per round (the numbers of the kernel against the torch path: decode_ab.py and
tests/test_kernels.py).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=128)
    a = ap.parse_args()
    from grpolab.engine.native import decoder as D
    from grpolab.engine.native import kernels
    from grpolab.model.load import load_policy, model_dir
    from grpolab.parallel.allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_grad_enabled(False)
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu"))
    w = D.weights_of(model, torch.bfloat16)
    kernel = kernels.decode_attention()
    assert kernel is not None, kernels.unavailable_reason()
    torch_attention = D.grouped_query_attention
    spent = [0.0]

    def read_only(module, q, k, v, mask):
        total = k.sum() + v.sum()
        return q.transpose(1, 2) + total * 0, None

    def timed(f):
        def g(*args):
            t = time.perf_counter()
            out = f(*args)
            spent[0] += time.perf_counter() - t
            return out
        return g

    variants = {"torch": (None, torch_attention), "kernel": (kernel, torch_attention), "read only": (None, read_only)}
    ids = torch.randint(0, 40000, (2, 46), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = mask.cumsum(-1) - 1
    tok = torch.randint(0, 40000, (16,), generator=torch.Generator().manual_seed(1))
    for r in range(a.rounds):
        for name, (attend, attention) in variants.items():
            D.grouped_query_attention = timed(attention)
            st = D.LeanStepper(w, a.steps)
            st.prefill(ids, mask, pos)
            st.repeat(8)
            st.cache.attend = timed(attend) if attend else None  # the kernel, timed like the torch path
            p = pos[:, -1].repeat_interleave(8)
            spent[0] = 0.0
            t = time.perf_counter()
            for _ in range(a.steps):
                p = p + 1
                st.step(tok, p)
            dt = time.perf_counter() - t
            print(f"round {r + 1} {name:>9s}: {dt / a.steps * 1e3:6.1f} ms per step, attention {spent[0] / a.steps * 1e3:5.1f} ms")
    D.grouped_query_attention = torch_attention


if __name__ == "__main__":
    main()
