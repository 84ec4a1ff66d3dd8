"""Side-by-side CPU benchmarks, printed as ratios (run on a quiet machine; numbers are noisy otherwise).

    python benchmarks/bench_cpu.py [--reps 3] [--json PATH]

1. rollout: grpolab.engine.native.generate.generate vs transformers' model.generate (what TRL's GRPOTrainer calls when
   it has no vLLM), same model, prompts, G, max_new_tokens, temperature; both in bf16 autocast.
2. update: forward+backward of one micro-batch, fp32 vs bf16 autocast (decides `precision=auto`), and
   the prompt computed once per group (grouped_completion_logp) vs once per sequence (what TRL does).
3. sampler: inverse-CDF sampling vs torch.multinomial over the 49k vocabulary.
Each line prints the median of --reps runs; --json appends them as entries of benchmarks/results.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpolab.engine.native.generate import generate
from grpolab.engine.native.sampling import inverse_cdf_sample
from grpolab.model.cache import left_pad
from grpolab.model.load import load_policy, load_tokenizer, model_dir
from grpolab.model.logprobs import completion_logp, grouped_completion_logp
from grpolab.model.template import chat_prompts


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--B", type=int, default=4, help="prompts")
    ap.add_argument("--G", type=int, default=8, help="completions per prompt")
    ap.add_argument("--new", type=int, default=32, help="max new tokens")
    ap.add_argument("--json", help="append the results to this JSON-lines file (benchmarks/results.py)")
    a = ap.parse_args()
    path = model_dir("smollm2-135m")
    tok = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu"))
    prompts = [f"What is {i + 17} + {2 * i + 25}? Give the final answer as a number." for i in range(a.B)]
    ids = chat_prompts(tok, prompts, None)
    bf16 = torch.bfloat16
    print(f"threads={torch.get_num_threads()} B={a.B} G={a.G} max_new_tokens={a.new} reps={a.reps}")

    # 1. rollout, fp32. No EOS stops (min_new_tokens for the peer) so both generate the same tokens.
    g = torch.Generator().manual_seed(0)
    n_tok = a.B * a.G * a.new

    def ours(dtype):
        return lambda: generate(
            model, tok, ids, G=a.G, max_new_tokens=a.new, autocast_dtype=dtype, generator=g, eos_ids=set()
        )

    t_ours = median_time(ours(None), a.reps)
    x, m = left_pad(ids, tok.pad_token_id)
    xr, mr = x.repeat_interleave(a.G, 0), m.repeat_interleave(a.G, 0)

    def hf():
        with torch.no_grad():
            model.generate(
                input_ids=xr,
                attention_mask=mr,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=a.new,
                min_new_tokens=a.new,
                pad_token_id=tok.pad_token_id,
            )

    peer = median_time(hf, a.reps)
    print(
        f"rollout  grpolab {n_tok / t_ours:7.1f} tok/s   transformers.generate {n_tok / peer:7.1f} tok/s   "
        f"speed-up x{peer / t_ours:.2f}"
    )
    t_bf = median_time(ours(bf16), a.reps)
    print(f"rollout  fp32 {t_ours:6.2f} s   bf16 autocast {t_bf:6.2f} s   bf16/fp32 time x{t_bf / t_ours:.2f}")

    # 2. update: one micro-batch of 16 sequences, 45 prompt + 25 completion tokens.
    torch.manual_seed(0)
    b, P, C = 16, 45, 25
    p = torch.randint(0, len(tok), (b, P))
    pm = torch.ones(b, P, dtype=torch.long)
    c = torch.randint(0, len(tok), (b, C))
    cm = torch.ones(b, C)
    model.train()

    def step(dtype):
        def run():
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                lp, _ = completion_logp(model, p, pm, c, cm)
            lp.sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    t32 = median_time(step(None), a.reps)
    t16 = median_time(step(bf16), a.reps)
    print(f"update   fp32 {t32:6.2f} s   bf16 autocast {t16:6.2f} s   bf16/fp32 time x{t16 / t32:.2f}")

    # 2b. the prompt once per group: 2 groups x G=8 sharing a prompt, fp32
    pg, pgm = p[:2], pm[:2]
    pr, pmr = pg.repeat_interleave(8, 0), pgm.repeat_interleave(8, 0)

    def per_seq():
        lp, _ = completion_logp(model, pr, pmr, c, cm)
        lp.sum().backward()
        model.zero_grad(set_to_none=True)

    def grouped():
        lp, _ = grouped_completion_logp(model, pg, pgm, c, cm, 8)
        lp.sum().backward()
        model.zero_grad(set_to_none=True)

    t_seq = median_time(per_seq, a.reps)
    t_grp = median_time(grouped, a.reps)
    print(
        f"update   per-sequence {t_seq:6.2f} s   prompt once per group {t_grp:6.2f} s   speed-up x{t_seq / t_grp:.2f}"
        f"   ({P} prompt + {C} completion tokens, G=8)"
    )

    # 3. sampler
    logits = torch.randn(a.B * a.G, len(tok)) * 3
    probs = torch.softmax(logits, -1)
    ti = median_time(lambda: inverse_cdf_sample(probs, g), 20)
    tm = median_time(lambda: torch.multinomial(probs, 1, generator=g), 20)
    print(f"sampler  inverse-CDF {1e3 * ti:6.1f} ms   torch.multinomial {1e3 * tm:6.1f} ms   speed-up x{tm / ti:.1f}")
    if a.json:
        import os
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import results

        shape = f"{a.B} prompts x G={a.G} x {a.new} tokens"
        results.record(
            a.json,
            [
                results.entry("rollout-hf", f"{shape}, fp32", n_tok / t_ours, n_tok / peer),
                results.entry("precision", f"rollout, {shape}", t_bf, t_ours),
                results.entry("precision", f"update, {b} x ({P} + {C}) tokens", t16, t32),
                results.entry(
                    "prompt-once",
                    f"forward+backward, 2 groups x G=8, {P} prompt + {C} completion tokens, fp32",
                    t_grp,
                    t_seq,
                ),
                results.entry("sampler", f"{a.B * a.G} rows x {len(tok):,} tokens", 1e3 * ti, 1e3 * tm),
            ],
        )


if __name__ == "__main__":
    main()
