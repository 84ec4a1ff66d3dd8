"""Milliseconds per decode step of the rollout: the lean step (grpolab.engine.native.decoder) vs the model's own forward.

    .venv/bin/python benchmarks/decode_step.py [--rows 16] [--tokens 32] [--reps 3] [--lora-r 0]

SmolLM2-135M-Instruct (the bundled model), `--rows` sequences (2 chat-templated prompts x rows/2), every
completion forced to `--tokens` tokens (no EOS), sampling at temperature 1, through
grpolab.engine.native.generate.generate with decoder=hf (the HF forward; fp32, and bf16 autocast around the whole
loop) and decoder=lean (fp32 weights, and bf16 weights in oneDNN's layout on a CPU). The four paths
alternate for `--reps` rounds in one process; per path the median of the rounds, as ms per generated
token step (the whole rollout, prefill, weight layout and sampling included, divided by --tokens).
With --lora-r, a rank-r peft adapter with non-zero weights on every linear layer (the lean step merges
it; the HF forward runs peft's unmerged layers). Also checks that greedy tokens agree in fp32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lora-r", type=int, default=0)
    a = ap.parse_args()

    from grpolab.engine.native.generate import generate
    from grpolab.model.load import load_policy, load_tokenizer, model_dir
    from grpolab.model.template import chat_prompts

    path = model_dir("smollm2-135m", log=lambda *_: None)
    tok = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu"))
    if a.lora_r:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r,
                                                           target_modules="all-linear"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 1e-3)
    model.eval()
    ids = chat_prompts(tok, ["What is 17 + 25?", "Compute 3 * 14 - 5."], "You are a helpful assistant.")
    G = a.rows // 2
    paths = {"hf fp32": (False, None), "hf bf16 autocast": (False, torch.bfloat16),
             "lean fp32": (True, None), "lean bf16": (True, torch.bfloat16)}
    same = [generate(model, tok, ids, G=1, max_new_tokens=16, greedy=True, eos_ids=set(), lean=lean).completion_ids
            for lean in (False, True)]
    times: dict[str, list[float]] = {k: [] for k in paths}
    for name, (lean, dt) in paths.items():  # warm-up
        generate(model, tok, ids, G=G, max_new_tokens=4, autocast_dtype=dt, lean=lean, eos_ids=set())
    for _ in range(a.reps):
        for name, (lean, dt) in paths.items():
            g = torch.Generator().manual_seed(0)
            t = time.perf_counter()
            generate(model, tok, ids, G=G, max_new_tokens=a.tokens, autocast_dtype=dt, lean=lean, eos_ids=set(),
                     generator=g)
            times[name].append((time.perf_counter() - t) / a.tokens * 1000)
    ms = {k: statistics.median(v) for k, v in times.items()}
    for k, v in ms.items():
        print(f"{k:18s} {v:7.1f} ms/token   x{ms['hf bf16 autocast'] / v:.2f} vs hf bf16 autocast")
    print(f"greedy fp32 tokens, lean == hf: {bool(torch.equal(same[0], same[1]))}")
    print(json.dumps({"rows": a.rows, "tokens": a.tokens, "reps": a.reps, "lora_r": a.lora_r,
                      "ms_per_token": ms, "all": times, "greedy_fp32_equal": bool(torch.equal(same[0], same[1])),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
