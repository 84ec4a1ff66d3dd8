"""The CPU changes that were tried for the speed issue and not kept, measured (docs/bench-history.md,
"The update on a CPU"; docs/performance.md, same section, lists them):

    .venv/bin/python benchmarks/cpu_not_kept.py [--no-compile]

- `F.rms_norm` instead of the HF RMSNorm module in a training pass: 16 x 174 x 576 fp32 positions,
  forward+backward, whether the outputs and gradients are equal, ms (median of 3 rounds of 20);
- the lean decode step (grpolab.engine.native.decoder.forward, 16 rows, bf16 weights in oneDNN's layout) with its KV
  cache in fp32 (as shipped) and in bf16 (its attention products then run in bf16), ms per token step
  at about 50 cached positions, alternating, median of 3 rounds of 20 steps;
- torch.compile (inductor, dynamic shapes) of one decoder layer's decode step, the 30 layers only:
  plain bf16 weights eager and compiled, and packed weights eager (the packed oneDNN product does not
  lower in inductor, which the script reports); compile time of the first call. Skipped with --no-compile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def per_call_ms(fn, n: int = 20, rounds: int = 3) -> float:
    fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e3)
    return statistics.median(out)


def rms_norm_variants() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    m = LlamaRMSNorm(576, eps=1e-5)
    m.weight.data = torch.randn(576)
    x = torch.randn(16, 174, 576, requires_grad=True)
    g = torch.randn(16, 174, 576)
    fused = lambda t: F.rms_norm(t, (576,), m.weight, 1e-5)  # noqa: E731

    def run(f):
        x.grad = m.weight.grad = None
        y = f(x)
        y.backward(g)
        return y.detach(), x.grad.clone(), m.weight.grad.clone()

    same = all(torch.equal(a, b) for a, b in zip(run(m), run(fused)))
    print(f"RMSNorm fwd+bwd 16x174x576 fp32: HF module {per_call_ms(lambda: run(m)):.2f} ms, "
          f"F.rms_norm {per_call_ms(lambda: run(fused)):.2f} ms; outputs and gradients equal: {same}")


def _lean(model):
    from grpolab.engine.native import decoder as D

    return D, D.weights_of(model, torch.bfloat16, 16)


def kv_cache_dtypes(model) -> None:
    D, w = _lean(model)
    N, P, T = 16, 46, 64
    ids = torch.randint(0, 1000, (N, P), generator=torch.Generator().manual_seed(0))
    tok = ids[:, -1]
    causal = torch.ones((P, P), dtype=torch.bool).tril()[None, None].expand(N, 1, P, P)
    valid = torch.ones(N, P + T, dtype=torch.bool)
    gqa = D.grouped_query_attention

    def cast_query(module, q, k, v, mask, **kw):  # the query in the cache's dtype
        return gqa(module, q.to(k.dtype), k, v, mask, **kw)

    times: dict[str, list[float]] = {"fp32 cache": [], "bf16 cache": []}
    with torch.no_grad():
        for _ in range(3):
            for name in times:
                cache = D.KVCache(w, N, P + T, "cpu")
                if name == "bf16 cache":
                    cache.k = [t.bfloat16() for t in cache.k]
                    cache.v = [t.bfloat16() for t in cache.v]
                    D.grouped_query_attention = cast_query
                D.forward(w, cache, ids, torch.arange(P)[None].expand(N, P), causal)

                def step():
                    t = cache.length
                    D.forward(w, cache, tok[:, None], torch.full((N, 1), t), valid[:, None, None, :t + 1])

                times[name].append(per_call_ms(step, n=20, rounds=1))
                D.grouped_query_attention = gqa
    print("lean decode step, 16 rows, ~50 cached positions: " +
          ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in times.items()))


def compiled_layers(model) -> None:
    D, w_packed = _lean(model)
    packer = D._packer
    D._packer = lambda *a: ((lambda W: W), False)
    w_plain = D.weights_of(model, torch.bfloat16, 16)
    D._packer = packer
    N, S = 16, 110
    nh, nkv, d = w_plain.n_heads, w_plain.n_kv, w_plain.head_dim

    def layer(w, x, cos, sin, ck, cv, key_mask, start: int, lw):
        end = start + 1
        qkv = D.linear(w, D.rms_norm(x, lw.ln1, w.eps).to(w.dtype), lw.qkv, None)
        qk = D.rope(qkv[..., :(nh + nkv) * d].view(N, 1, nh + nkv, d).transpose(1, 2).float(), cos, sin)
        ck[:, :, start:end] = qk[:, nh:]
        cv[:, :, start:end] = qkv[..., (nh + nkv) * d:].view(N, 1, nkv, d).transpose(1, 2)
        a, _ = D.grouped_query_attention(None, qk[:, :nh], ck[:, :, :end], cv[:, :, :end], key_mask)
        x = x + D.linear(w, a.reshape(N, 1, nh * d).to(w.dtype), lw.o, None)
        g, u = D.linear(w, D.rms_norm(x, lw.ln2, w.eps).to(w.dtype), lw.gate_up).chunk(2, dim=-1)
        return x + D.linear(w, F.silu(g) * u, lw.down)

    x0 = torch.randn(N, 1, 576)
    valid = torch.ones(N, S, dtype=torch.bool)

    def timed(w, f) -> tuple[float, float]:
        cache = D.KVCache(w, N, S, "cpu")
        cos, sin = w.rotary(x0, torch.full((N, 1), 46))
        cos, sin = cos[:, None].float(), sin[:, None].float()
        t = [46]

        def step():
            x = x0
            for i, lw in enumerate(w.layers):
                x = f(w, x, cos, sin, cache.k[i], cache.v[i], valid[:, None, None, :t[0] + 1], t[0], lw)
            t[0] += 1

        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        return first, per_call_ms(step, n=15, rounds=3)

    with torch.no_grad():
        _, plain = timed(w_plain, layer)
        _, packed = timed(w_packed, layer)
        first, comp = timed(w_plain, torch.compile(layer, dynamic=True))
        try:
            timed(w_packed, torch.compile(layer, dynamic=True))
            packed_lowers = "yes"
        except Exception as e:  # noqa: BLE001 - inductor's failure is the finding
            packed_lowers = f"no ({type(e).__name__})"
    print(f"decoder layers only, 16 rows: plain bf16 eager {plain:.1f} ms, compiled {comp:.1f} ms "
          f"(first call {first:.0f} s), packed eager {packed:.1f} ms; packed compiles: {packed_lowers}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    from grpolab.model.load import load_policy, model_dir
    from grpolab.parallel.allocator import keep_freed_memory

    keep_freed_memory()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rms_norm_variants()
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu")).eval()
    kv_cache_dtypes(model)
    if not a.no_compile:
        compiled_layers(model)


if __name__ == "__main__":
    main()
