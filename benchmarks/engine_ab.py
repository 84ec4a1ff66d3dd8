"""Generation speed of the rollout engines side by side, on the bundled model, forced to full length
(no EOS), in one process: grpolab's native engine, the vLLM engine (grpolab.engine.vllm_engine), and
vLLM's own LLM.generate on the same token ids and sampling settings (the integration's overhead).

    python benchmarks/engine_ab.py [--eager] [--dtype bf16|fp32] [--rounds 3] [--shapes 2x8x64,2x8x128,8x8x64]
                                  [--json PATH] [--raw OUT]

`--dtype` is the rollout precision of both engines (bf16: the native engine's lean decoder; fp32: its HF
forward), as `precision=auto` may choose either on a CPU.

Prints, per shape (prompts x G x new tokens), tokens/s of each and the ratios vllm/native and
engine/raw; the start-up time of vLLM (compiled, or --eager) and of one weight sync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def results_module():
    """benchmarks/results.py, where the shared entry format lives (this file may be loaded from elsewhere)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import results

    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eager", action="store_true", help="vLLM with enforce_eager (no torch.compile)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="2x8x64,2x8x128,8x8x64")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="", help="append the results to this JSON-lines file (benchmarks/results.py)")
    ap.add_argument("--raw", default="", help="write this script's own JSON (every figure) here")
    ns = ap.parse_args()

    import torch

    if ns.threads:
        torch.set_num_threads(ns.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    from grpolab.engine.base import Sampling
    from grpolab.engine.native.engine import NativeEngine
    from grpolab.engine.settings import RolloutConfig
    from grpolab.engine.vllm_engine import VllmEngine
    from grpolab.model.load import load_policy, load_tokenizer, model_dir
    from grpolab.model.template import chat_prompts

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[ns.dtype]
    path = model_dir("smollm2-135m", log=lambda *a: None)
    tok = load_tokenizer(path)
    policy = load_policy(path, torch.device("cpu"))
    native = NativeEngine(policy, tok, device=torch.device("cpu"), dtype=dtype, decoder="auto", eos_ids=set())
    t0 = time.perf_counter()
    settings = RolloutConfig(engine="vllm", vllm_eager=ns.eager)
    vllm = VllmEngine(
        settings,
        model_path=path,
        tokenizer=tok,
        device=torch.device("cpu"),
        dtype=dtype,
        eos_ids=set(),
        max_model_len=1024,
        seed=0,
    )
    startup = time.perf_counter() - t0
    sync = vllm.sync(policy, 0)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    questions = [f"What is {a} + {b}? Think step by step." for a, b in zip(range(11, 99, 7), range(3, 90, 5))]
    rows = []
    for shape in ns.shapes.split(","):
        B, G, T = (int(x) for x in shape.split("x"))
        ids = chat_prompts(tok, questions[:B], None)
        sampling = Sampling(max_new_tokens=T)
        g = torch.Generator().manual_seed(0)

        def raw():
            params = SamplingParams(
                n=G, temperature=1.0, max_tokens=T, logprobs=0, seed=1, detokenize=False, ignore_eos=True
            )
            outs = vllm.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

        timed = {
            "native": lambda: int(native.generate(ids, sampling, G=G, generator=g).completion_mask.sum()),
            "vllm": lambda: int(vllm.generate(ids, sampling, G=G, generator=g).completion_mask.sum()),
            "vllm_raw": raw,
        }
        tokens = B * G * T
        for k, f in timed.items():  # warm-up, and every engine really writes every token
            assert f() == tokens, f"{k} did not write {tokens} tokens"
        secs = {k: [] for k in timed}
        for _ in range(ns.rounds):
            for k, f in timed.items():  # interleaved, so that load on the machine hits each alike
                t = time.perf_counter()
                f()
                secs[k].append(time.perf_counter() - t)
        tps = {k: tokens / statistics.median(v) for k, v in secs.items()}
        spans = {k: [tokens / max(v), tokens / min(v)] for k, v in secs.items()}
        rows.append(
            {
                "shape": shape,
                **{f"{k}_tok_s": round(v, 1) for k, v in tps.items()},
                "vllm_over_native": round(tps["vllm"] / tps["native"], 2),
                "engine_overhead": round(tps["vllm_raw"] / tps["vllm"] - 1, 3),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        if ns.json:
            results = results_module()
            setting = f"{B} x {G} x {T} (prompts x G x tokens), {ns.dtype}" + (", eager" if ns.eager else "")
            results.record(
                ns.json,
                [
                    results.entry("engine-speed", setting, tps["native"], tps["vllm"], interval=spans["native"]),
                    results.entry("engine-overhead", setting, tps["vllm"], tps["vllm_raw"], interval=spans["vllm"]),
                ],
            )
    out = {
        "vllm_startup_s": round(startup, 1),
        "eager": ns.eager,
        "dtype": ns.dtype,
        "sync_s": round(sync, 3),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    print(json.dumps(out))
    if ns.raw:
        Path(ns.raw).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
