"""The measurements of benchmarks/gpu_check.py that run in a process of their own (so that a crash, a
hang or an out-of-memory error ends that process, not the whole check):

    python benchmarks/gpu_workers.py build  SPEC.json OUT.json   random-weight model dirs from configs
    python benchmarks/gpu_workers.py matmul SPEC.json OUT.json   the bf16 matmul rate (MFU's denominator)
    python benchmarks/gpu_workers.py update SPEC.json OUT.json   grpolab's update phase: forward+backward
                                                                  of B*G completions + AdamW, timed
    python benchmarks/gpu_workers.py decode SPEC.json OUT.json   grpolab's decode vs a static KV cache
                                                                  with torch.compile(mode="reduce-overhead")

SPEC.json holds the keyword arguments of the worker; OUT.json gets its result (a dict with "status").
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
TOKENIZER = ROOT / "src" / "grpolab" / "data" / "smollm2-tokenizer"
PROMPTS = [f"What is {17 + 3 * i} + {25 + 7 * i}? Give the final answer as a number." for i in range(64)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def amp_dtype(precision: str, dev: torch.device) -> torch.dtype | None:
    """The autocast dtype of `precision` (None: fp32); auto = bf16 on a bf16-capable GPU, as grpolab
    trains there (grpolab's own rule for the CPU is not needed here)."""
    if precision == "bf16" or (precision == "auto" and dev.type == "cuda" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return None


def count_params(model) -> int:
    """Parameters counted once (a tied LM head is the embedding): 6 N per trained token is then the
    forward+backward cost including the LM head, the embedding lookup costing nothing."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# --- build ------------------------------------------------------------------------------------------


def build(configs: dict, out_dir: str, device: str = "cpu", seed: int = 0) -> dict:
    """One random-weight model directory per config file (name -> path of a JSON config), each with the
    shipped SmolLM2 tokenizer, like grpolab.model.load.make_tiny_model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpolab.model.load import TOKENIZER_FILES, load_tokenizer

    tok = load_tokenizer(TOKENIZER)
    res = {}
    for name, cfg_path in configs.items():
        t = time.perf_counter()
        values = {k: v for k, v in json.loads(Path(cfg_path).read_text()).items() if not k.startswith("_")}
        cfg = AutoConfig.for_model(values.pop("model_type"), **values)
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        assert model.config.vocab_size >= len(tok), (name, model.config.vocab_size, len(tok))
        d = Path(out_dir) / name
        model.save_pretrained(d, safe_serialization=True)
        for f in TOKENIZER_FILES:
            (d / f).write_bytes((TOKENIZER / f).read_bytes())
        res[name] = {
            "dir": str(d),
            "params": count_params(model),
            "config": str(cfg_path),
            "vocab_size": cfg.vocab_size,
            "tokenizer_size": len(tok),
            "build_s": time.perf_counter() - t,
        }
        del model
    # a model with more embedding rows than tokens (the Qwen shape) may sample an id the tokenizer does
    # not know: it must decode (to nothing), as rollouts decode every completion
    above = tok.batch_decode([[5, len(tok), len(tok) + 1000, 151935]], skip_special_tokens=True)
    return {"status": "ok", "models": res, "ids_above_the_tokenizer_decode_to": above[0]}


# --- matmul -----------------------------------------------------------------------------------------


def matmul(device: str, n: int = 8192, dtype: str = "bfloat16", warmup: int = 3, reps: int = 10) -> dict:
    """FLOP/s of torch.matmul of two n x n matrices of random data (2 n^3 FLOPs each), mean of `reps`
    products after `warmup`, timed with CUDA events on a GPU."""
    dev = torch.device(device)
    dt = getattr(torch, dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dt, generator=g)
    b = torch.randn(n, n, device=dev, dtype=dt, generator=g)
    for _ in range(warmup):
        torch.matmul(a, b)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        sec = start.elapsed_time(end) / 1e3 / reps
    else:
        sec = timed(lambda: [torch.matmul(a, b) for _ in range(reps)], dev) / reps
    return {
        "status": "ok",
        "n": n,
        "dtype": dtype,
        "reps": reps,
        "seconds_per_matmul": sec,
        "flops_per_s": 2 * n**3 / sec,
        "tflops": 2 * n**3 / sec / 1e12,
    }


# --- update -----------------------------------------------------------------------------------------


def update(
    model_dir: str,
    device: str,
    prompts: int,
    G: int,
    new_tokens: int,
    micro_batch: int,
    precision: str = "bf16",
    reps: int = 3,
    rate: float | None = None,
    seed: int = 0,
) -> dict:
    """grpolab's update phase as the trainer runs it: fp32 weights under autocast, the prompt once per
    group (grouped_completion_logp), micro-batches of whole groups, one AdamW step over the whole batch.
    Completions are random ids of the tokenizer (every one `new_tokens` long); one warm-up, then the
    median of `reps`. MFU = 6 N (completion tokens) / seconds / rate."""
    from grpolab.model.cache import left_pad
    from grpolab.model.load import load_policy, load_tokenizer
    from grpolab.model.logprobs import grouped_completion_logp
    from grpolab.model.optim import adamw
    from grpolab.model.template import chat_prompts

    dev = torch.device(device)
    tok = load_tokenizer(Path(model_dir))
    model = load_policy(Path(model_dir), dev)
    model.train()
    amp = amp_dtype(precision, dev)
    opt = adamw([p for p in model.parameters() if p.requires_grad], lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    ids, mask = left_pad(chat_prompts(tok, PROMPTS[:prompts], None), tok.pad_token_id)
    g = torch.Generator().manual_seed(seed)
    comp = torch.randint(3, len(tok), (prompts * G, new_tokens), generator=g)
    cmask = torch.ones(prompts * G, new_tokens)
    adv = torch.randn(prompts * G, generator=g)
    groups = max(1, micro_batch // G)
    ids, mask, comp, cmask, adv = (x.to(dev) for x in (ids, mask, comp, cmask, adv))

    def step():
        for s in range(0, prompts, groups):
            r = slice(s * G, (s + groups) * G)
            with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
                lp, _ = grouped_completion_logp(model, ids[s : s + groups], mask[s : s + groups], comp[r], cmask[r], G)
            loss = -(lp * adv[r, None]).sum() / cmask.sum()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    timed(step, dev)  # warm-up (allocator, kernels, AdamW state)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = [timed(step, dev) for _ in range(reps)]
    sec = statistics.median(times)
    n_params = count_params(model)
    tokens = prompts * G * new_tokens
    res = {
        "status": "ok",
        "precision": "fp32" if amp is None else "bf16",
        "params": n_params,
        "prompts": prompts,
        "G": G,
        "new_tokens": new_tokens,
        "prompt_tokens": int(ids.shape[1]),
        "micro_batch_seqs": groups * G,
        "trained_tokens": tokens,
        "update_s": sec,
        "update_s_all": times,
        "trained_tok_s": tokens / sec,
        "model_flops": 6 * n_params * tokens,
    }
    if dev.type == "cuda":
        res["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    if rate:
        res["mfu"] = 6 * n_params * tokens / sec / rate
    return res


# --- decode -----------------------------------------------------------------------------------------


def decode(
    model_dir: str,
    device: str,
    prompts: int,
    G: int,
    new_tokens: int,
    compile: bool = True,
    reps: int = 2,
    seed: int = 0,
) -> dict:
    """Decode throughput, every completion forced to `new_tokens` (no EOS), sampling at temperature 1:
    grpolab.engine.native.generate.generate with the lean decode step (decoder=lean, bf16 on a GPU), with
    decoder=hf (the model's forward, fp32 weights under bf16 autocast) and, on a GPU, on bf16 weights; transformers' generate with a static KV cache on bf16 weights, eager (disable_compile) and,
    when `compile`, compiled as generate does it itself on a static cache: torch.compile of the
    forward, mode="reduce-overhead" (CUDA graphs). A path that fails is recorded with its reason and
    the others still run; each path's first call (compilation included) is reported apart."""
    from grpolab.engine.native.generate import generate
    from grpolab.model.cache import left_pad
    from grpolab.model.load import load_policy, load_tokenizer
    from grpolab.model.template import chat_prompts

    dev = torch.device(device)
    tok = load_tokenizer(Path(model_dir))
    ids = chat_prompts(tok, PROMPTS[:prompts], None)
    n_tok = prompts * G * new_tokens
    res: dict = {"status": "ok", "prompts": prompts, "G": G, "new_tokens": new_tokens, "tokens": n_tok, "paths": {}}
    gen = torch.Generator(device=dev).manual_seed(seed)

    def record(name, fn, warmups=1):
        try:
            t_first = timed(fn, dev)
            for _ in range(warmups - 1):
                timed(fn, dev)
            ts = [timed(fn, dev) for _ in range(reps)]
            sec = statistics.median(ts)
            res["paths"][name] = {"status": "ok", "seconds": sec, "tok_s": n_tok / sec, "first_call_s": t_first}
        except Exception as e:  # noqa: BLE001 - the reason is the result
            res["paths"][name] = {
                "status": "failed",
                "error": f"{type(e).__name__}: {e}"[:2000],
                "trace": traceback.format_exc()[-3000:],
            }

    model = load_policy(Path(model_dir), dev).eval()
    amp = amp_dtype("auto", dev)
    record(
        "grpolab",
        lambda: generate(
            model, tok, ids, G=G, max_new_tokens=new_tokens, autocast_dtype=amp, generator=gen, eos_ids=set()
        ),
    )
    res["paths"]["grpolab"]["precision"] = "lean decode step (grpolab.engine.native.decoder), weights cast to " + (
        "bf16" if amp else "fp32"
    )
    record(
        "grpolab_hf_forward",
        lambda: generate(
            model,
            tok,
            ids,
            G=G,
            max_new_tokens=new_tokens,
            autocast_dtype=amp,
            generator=gen,
            eos_ids=set(),
            lean=False,
        ),
    )
    res["paths"]["grpolab_hf_forward"]["precision"] = "decoder=hf: fp32 weights, " + (
        "bf16 autocast" if amp else "fp32"
    )
    if dev.type == "cuda":
        model = model.to(torch.bfloat16)
        record(
            "grpolab_bf16_weights",
            lambda: generate(model, tok, ids, G=G, max_new_tokens=new_tokens, generator=gen, eos_ids=set()),
        )

    x, m = left_pad(ids, tok.pad_token_id)
    x, m = x.repeat_interleave(G, 0).to(dev), m.repeat_interleave(G, 0).to(dev)

    def hf(**extra):
        def run():
            with torch.no_grad():
                out = model.generate(
                    input_ids=x,
                    attention_mask=m,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    pad_token_id=tok.pad_token_id,
                    **extra,
                )
            assert out.shape[1] == x.shape[1] + new_tokens, out.shape

        return run

    record("hf_static_eager", hf(cache_implementation="static", disable_compile=True))
    if compile and dev.type == "cuda":
        from transformers import CompileConfig  # generate compiles the forward itself on a static cache

        record(
            "hf_static_compiled",
            hf(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead", fullgraph=False)),
            warmups=2,
        )
    else:
        res["paths"]["hf_static_compiled"] = {
            "status": "skipped",
            "reason": "no CUDA device: torch.compile(mode='reduce-overhead') records CUDA graphs"
            if dev.type != "cuda"
            else "compile=False",
        }
    base = res["paths"].get("grpolab", {}).get("tok_s")
    for p in res["paths"].values():
        if base and p.get("tok_s"):
            p["vs_grpolab"] = p["tok_s"] / base
    return res


WORKERS = {"build": build, "matmul": matmul, "update": update, "decode": decode}


def quiet() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: list[str]) -> int:
    name, spec_path, out_path = argv
    quiet()
    spec = json.loads(Path(spec_path).read_text())
    t = time.perf_counter()
    try:
        res = WORKERS[name](**spec)
    except Exception as e:  # noqa: BLE001 - the reason goes into the result
        res = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-4000:]}
    res["worker_s"] = time.perf_counter() - t
    Path(out_path).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
