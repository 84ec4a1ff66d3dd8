"""`grpolab plan`'s memory model against measured peaks: a real training step per configuration.

    .venv/bin/python benchmarks/memory_plan.py [--configs NAME ...] [--work DIR] [--json PATH] [--json-out FILE]
    .venv/bin/python benchmarks/memory_plan.py --device cuda --set gpu      # benchmarks/gpu.sh runs this

Each configuration runs in a process of its own: grpolab.training.trainer.setup builds the run (the
bundled SmolLM2-135M, or a random-weight Qwen2.5-0.5B / 1.5B built once from benchmarks/configs/ with
the shipped tokenizer: nothing is downloaded), every completion is forced to max_new_tokens (no EOS,
as grpolab bench does), AdamW's state is created first (what a first step leaves), then one step is
measured phase by phase (grpolab.training.step's collect, reference, shape, update; the optimizer step inside
update). The prediction is grpolab.training.plan.estimate.plan for the same config, the step's prompt width
and the precision the run chose.

What is measured: on a CPU, the bytes torch's CPU allocator has live, from the profiler's memory
events (torch.profiler, profile_memory=True: every allocation and free of the c10 CPU allocator,
timestamped) on top of the bytes of every tensor alive when the step starts (weights, AdamW state, the
reference): the CPU counterpart of torch.cuda.max_memory_allocated, which is what the model predicts
(tensor bytes). Peak RSS is printed beside it (`ru_maxrss`, the whole process: the Python runtime,
libraries, the model load, and glibc's heap, which cpu_malloc=keep never gives back), for context
only. On CUDA: torch.cuda.max_memory_allocated, reset at the start of each phase.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
CONFIGS = ROOT / "benchmarks" / "configs"
TOLERANCE = 0.15
BASE = [
    "eval_size=0",
    "report=false",
    "tensorboard=false",
    "progress=false",
    "save_every=0",
    "samples_per_step=0",
    "algo.beta=0",
    "lr=1e-6",
    "rewards=[{name: 'grpolab.app.bench.spec:bench_reward'}]",
]
"""Settings of every configuration; the reward varies within every group (grpolab bench's), so that the
update computes every group, as the plan assumes."""
SETS = {
    "cpu": {  # about 10 GB at most (the 2-core machine is shared): short sequences, small G, LoRA for 1.5B
        "smollm2-full-fp32": (
            "bundled:smollm2-135m",
            ["precision=fp32", "G=4", "batch_size=8", "micro_batch=4", "max_new_tokens=32", "algo.beta=0.04"],
        ),
        "smollm2-full-bf16-long": (
            "bundled:smollm2-135m",
            ["precision=bf16", "G=8", "batch_size=16", "micro_batch=16", "max_new_tokens=128"],
        ),
        "smollm2-full-bf16-long-ckpt": (
            "bundled:smollm2-135m",
            [
                "precision=bf16",
                "G=8",
                "batch_size=16",
                "micro_batch=16",
                "max_new_tokens=128",
                "grad_checkpointing=true",
            ],
        ),
        "smollm2-lora-bf16-ppo": (
            "bundled:smollm2-135m",
            [
                "precision=bf16",
                "algo=ppo",
                "algo.beta=0.04",
                "lora.r=16",
                "G=4",
                "batch_size=8",
                "micro_batch=4",
                "max_new_tokens=32",
            ],
        ),
        "qwen0.5b-full-fp32": (
            "random:qwen2.5-0.5b",
            ["precision=fp32", "G=2", "batch_size=4", "micro_batch=2", "max_new_tokens=32"],
        ),
        "qwen0.5b-lora-bf16-ckpt": (
            "random:qwen2.5-0.5b",
            [
                "precision=bf16",
                "lora.r=16",
                "algo.beta=0.04",
                "G=4",
                "batch_size=8",
                "micro_batch=8",
                "max_new_tokens=64",
                "grad_checkpointing=true",
            ],
        ),
        "qwen1.5b-lora-fp32": (
            "random:qwen2.5-1.5b",
            ["precision=fp32", "lora.r=16", "G=2", "batch_size=4", "micro_batch=4", "max_new_tokens=32"],
        ),
        "qwen1.5b-lora-bf16-ckpt": (
            "random:qwen2.5-1.5b",
            [
                "precision=bf16",
                "lora.r=16",
                "G=4",
                "batch_size=8",
                "micro_batch=8",
                "max_new_tokens=32",
                "grad_checkpointing=true",
            ],
        ),
    },
    "heldout": {  # configurations the model was never corrected against (docs/performance.md)
        "smollm2-lora-fp32-mu2-ckpt": (
            "bundled:smollm2-135m",
            [
                "precision=fp32",
                "lora.r=8",
                "algo.beta=0.04",
                "algo.mu=2",
                "G=4",
                "batch_size=16",
                "micro_batch=8",
                "max_new_tokens=48",
                "grad_checkpointing=true",
            ],
        ),
        "qwen0.5b-lora-fp32-long": (
            "random:qwen2.5-0.5b",
            ["precision=fp32", "lora.r=16", "G=4", "batch_size=8", "micro_batch=4", "max_new_tokens=128"],
        ),
    },
    "gpu": {  # one H200: real sizes, bf16, a few minutes in all
        "smollm2-full-bf16": (
            "random:smollm2-135m",
            ["precision=bf16", "G=8", "batch_size=64", "micro_batch=16", "max_new_tokens=256", "algo.beta=0.04"],
        ),
        "qwen0.5b-full-bf16": (
            "random:qwen2.5-0.5b",
            ["precision=bf16", "G=8", "batch_size=32", "micro_batch=16", "max_new_tokens=256"],
        ),
        "qwen0.5b-full-bf16-ckpt": (
            "random:qwen2.5-0.5b",
            [
                "precision=bf16",
                "G=8",
                "batch_size=32",
                "micro_batch=16",
                "max_new_tokens=256",
                "grad_checkpointing=true",
            ],
        ),
        "qwen0.5b-lora-bf16": (
            "random:qwen2.5-0.5b",
            [
                "precision=bf16",
                "lora.r=16",
                "algo.beta=0.04",
                "G=8",
                "batch_size=32",
                "micro_batch=16",
                "max_new_tokens=256",
            ],
        ),
    },
    "dry": {  # benchmarks/gpu.sh --dry-run: the CPU, a 2-layer model, seconds
        "tiny-full-fp32": (
            "random:tiny-llama",
            ["precision=fp32", "G=2", "batch_size=4", "micro_batch=2", "max_new_tokens=8", "algo.beta=0.04"],
        )
    },
}


def model_path(spec: str, work: Path) -> str:
    """`model=` for a configuration's model: bundled:NAME, the bundled model itself; random:NAME, a
    random-weight directory built once from benchmarks/configs/NAME.json (bf16 on disk: half the bytes;
    grpolab loads it in fp32)."""
    kind, name = spec.split(":", 1)
    if kind == "bundled":
        return name
    d = work / name
    if (d / "config.json").exists():
        return str(d)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpolab.model.load import TOKENIZER_FILES

    values = {k: v for k, v in json.loads((CONFIGS / f"{name}.json").read_text()).items() if not k.startswith("_")}
    cfg = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = d.with_name(d.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    for f in TOKENIZER_FILES:
        (tmp / f).write_bytes((ROOT / "src" / "grpolab" / "data" / "smollm2-tokenizer" / f).read_bytes())
    tmp.rename(d)
    return str(d)


def live_cpu_bytes() -> int:
    """Bytes of the distinct storages of every CPU tensor Python can reach now."""
    import torch

    seen: dict[int, int] = {}
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                s = o.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
        except (RuntimeError, TypeError):  # tensors without storage (meta, sparse)
            continue
    return sum(seen.values())


class Phases:
    """Wraps grpolab.training.step's stages (train_step looks them up at each call) in named ranges."""

    NAMES = ("collect", "reference", "shape", "update")
    LABEL: ClassVar[dict[str, str]] = {
        "collect": "generation",
        "reference": "reference",
        "shape": "shaping",
        "targets": "advantages",
        "update": "update",
        "optimizer": "optimizer",
    }

    def __init__(self, run, device):
        import grpolab.training.step as step_mod

        self.mod, self.run, self.device = step_mod, run, device
        self.orig = {n: getattr(step_mod, n) for n in self.NAMES}
        self.cuda_peaks: dict[str, int] = {}

    def wrap(self, name, fn):
        import torch

        def inner(*a, **k):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(self.device)
            with torch.profiler.record_function("phase:" + name):
                out = fn(*a, **k)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                label = self.LABEL[name]
                self.cuda_peaks[label] = max(
                    self.cuda_peaks.get(label, 0), torch.cuda.max_memory_allocated(self.device)
                )
            return out

        return inner

    def __enter__(self):
        for n, f in self.orig.items():
            setattr(self.mod, n, self.wrap(n, f))
        self.opt_step = self.run.optimizer.step
        self.run.optimizer.step = self.wrap("optimizer", self.opt_step)
        self.run.advantage.targets = self.wrap("targets", self.run.advantage.targets)  # a critic's values pass
        return self

    def __exit__(self, *exc):
        for n, f in self.orig.items():
            setattr(self.mod, n, f)
        self.run.optimizer.step = self.opt_step
        del self.run.advantage.targets


def cpu_peaks(prof, start: int) -> dict[str, int]:
    """Peak live bytes per phase from the profiler's memory events (innermost phase range wins)."""
    events = prof.profiler.kineto_results.events()
    ranges = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns(), Phases.LABEL[e.name()[6:]])
        for e in events
        if e.name().startswith("phase:")
    )
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    cur, out = start, {}
    for t, b in mem:
        cur += b
        inside = [r for r in ranges if r[0] <= t <= r[1]]
        label = max(inside)[2] if inside else "between phases"
        out[label] = max(out.get(label, 0), cur)
    return out


def make_optimizer_state(run) -> None:
    """What a first step leaves behind, without its minutes on a small CPU: AdamW's moments (and the
    critic's). An AdamW step on zero gradients creates them and moves no weight (weight decay 0)."""
    import torch

    opts = [run.optimizer] + ([run.advantage.optimizer] if hasattr(run.advantage, "optimizer") else [])
    for opt in opts:
        for group in opt.param_groups:
            assert group["weight_decay"] == 0, "a zero-gradient step would move the weights"
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)


def measure(name: str, model: str, overrides: list[str], device: str) -> dict:
    """One configuration in this process (see the module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpolab.training.config import build_config
    from grpolab.training.step import train_step
    from grpolab.training.trainer import setup

    torch.manual_seed(0)
    out_dir = tempfile.mkdtemp(prefix="memory-plan-")
    cfg = build_config({}, [f"model={model}", f"out={out_dir}/run", f"device={device}", *BASE, *overrides])
    run = setup(cfg, log=lambda *a: None)
    run.eos_ids = set()  # every completion runs to max_new_tokens
    dev = run.device
    make_optimizer_state(run)
    gc.collect()
    res = {"config": name, "model": model, "overrides": overrides, "device": dev.type}
    with Phases(run, dev) as ph:
        if dev.type == "cuda":
            torch.cuda.synchronize()
            t = time.perf_counter()
            metrics, batch = train_step(run, 1)
            measured = dict(ph.cuda_peaks)
        else:
            start = live_cpu_bytes()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                t = time.perf_counter()
                metrics, batch = train_step(run, 1)
            measured = cpu_peaks(prof, start)
            res["start_bytes"] = start
    res["step_s_profiled"] = time.perf_counter() - t
    res["measured"] = measured
    res["times"] = {k: metrics[k] for k in metrics if k.startswith("time/")}
    res["seqs_computed"] = int(metrics.get("update/seqs_computed", 0))
    assert res["seqs_computed"] == cfg.batch_size, f"the update computed {res['seqs_computed']} of {cfg.batch_size}"
    res.update(
        prompt_tokens=int(batch.rollout.prompt_ids.shape[1]),
        completion_tokens=int(batch.rollout.completion_ids.shape[1]),
        precision={
            "update": 2 if run.precision.update is not None else 4,
            "rollout": 2 if run.precision.rollout is not None else 4,
        },
        measured_peak=max(measured.values()),
        measured_peak_phase=max(measured, key=measured.get),
        rss_peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return predict(res)


def predict(res: dict) -> dict:
    """grpolab.training.plan.estimate's prediction for a measured row (its config, prompt width and precision),
    every row leaving no early finisher (as measured: no EOS)."""
    from grpolab.training.config import build_config
    from grpolab.training.plan.devices import Device
    from grpolab.training.plan.estimate import plan
    from grpolab.training.plan.shapes import SHAPES, Shape

    cfg = build_config({}, [f"model={res['model']}", "out=unused", f"device={res['device']}", *BASE, *res["overrides"]])
    shape = SHAPES[res["model"]] if res["model"] in SHAPES else Shape.from_dir(Path(res["model"]))
    kind = res["device"]
    p = plan(
        cfg,
        Device(kind, 1, 1e12, 1e12, 1e11, kind),
        prompt_tokens=res["prompt_tokens"],
        shape=shape,
        update_bytes=res["precision"]["update"],
        rollout_bytes=res["precision"]["rollout"],
        rows_leave=False,
    )
    assert p.workload.completion_tokens == res["completion_tokens"], (p.workload, res["completion_tokens"])
    res.update(
        predicted={ph.name: ph.total for ph in p.phases}, predicted_peak=p.peak.total, predicted_peak_phase=p.peak.name
    )
    res["ratio"] = res["predicted_peak"] / res["measured_peak"]
    res["within"] = abs(res["ratio"] - 1) <= TOLERANCE
    return res


def run_one(name: str, model: str, overrides: list[str], device: str, timeout: float) -> dict:
    """measure() in a fresh process (peak memory is per process), its JSON on the last stdout line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, __file__, "--one", name, "--model", model, "--device", device, "--", *overrides]
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"config": name, "status": "timeout", "reason": f"over {timeout:.0f} s"}
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"config": name, "status": "failed", "reason": f"exit {p.returncode}", "log_tail": p.stderr[-2000:]}
    return {"status": "ok", **json.loads(lines[-1])}


def run_set(
    which: str,
    device: str,
    work: Path,
    names: list[str] | None = None,
    timeout: float = 900,
    deadline: float | None = None,
) -> dict:
    """Every configuration of SETS[which] (or `names`), each in its own process."""
    rows = []
    for name, (model, overrides) in SETS[which].items():
        if names and name not in names:
            continue
        if deadline is not None and time.monotonic() > deadline - 10:
            rows.append({"config": name, "status": "skipped", "reason": "the time budget ran out"})
            continue
        left = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        rows.append(run_one(name, model_path(model, work), overrides, device, left))
    ok = [r for r in rows if r["status"] == "ok"]
    return {
        "status": "ok" if ok and len(ok) == len(rows) else ("failed" if not ok else "partial"),
        "rows": rows,
        "within_tolerance": sum(r["within"] for r in ok),
        "measured": len(ok),
        "tolerance": TOLERANCE,
    }


def summary(res: dict) -> str:
    """One line: how many configurations came within the tolerance, and each one's ratio."""
    rows = ", ".join(
        f"{r['config']} x{r['ratio']:.2f}" if r["status"] == "ok" else f"{r['config']} {r['status']}"
        for r in res["rows"]
    )
    return f"{res['within_tolerance']} of {res['measured']} within {res['tolerance']:.0%} ({rows})"


def phase_ratios(r: dict) -> str:
    """predicted / measured of the generation and update phases (the update's largest moment)."""
    p, m = r["predicted"], r["measured"]
    update = max(v for k, v in p.items() if k.startswith("update"))
    return f"x{p['generation'] / m['generation']:.3f} / x{update / m['update']:.3f}"


def table(res: dict) -> str:
    """The markdown table of docs/performance.md."""
    mb = 2**20
    head = (
        "| configuration | P + C | predicted peak (phase) | measured peak (phase) | predicted / measured | "
        "generation / update | peak RSS |"
    )
    out = [head, "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r["status"] != "ok":
            out.append(f"| {r['config']} | {r['status']}: {r.get('reason', '')} | | | | | |")
            continue
        out.append(
            f"| {r['config']} | {r['prompt_tokens']} + {r['completion_tokens']} | "
            f"{r['predicted_peak'] / mb:,.0f} MB ({r['predicted_peak_phase']}) | "
            f"{r['measured_peak'] / mb:,.0f} MB ({r['measured_peak_phase']}) | **x{r['ratio']:.3f}** | "
            f"{phase_ratios(r)} | {r['rss_peak_mb']:,.0f} MB |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=list(SETS), default="cpu")
    ap.add_argument("--configs", nargs="+", help="only these configurations of the set")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--work",
        default=str(Path.home() / ".cache" / "grpolab" / "bench-models"),
        help="where random-weight model directories are built once",
    )
    ap.add_argument("--json", help="append one entry per configuration to this JSON-lines file (benchmarks/results.py)")
    ap.add_argument("--json-out", help="write this script's own JSON (every phase) here")
    ap.add_argument(
        "--predict",
        metavar="JSON",
        help="recompute the predictions of a --json-out file's measured "
        "rows with the model as it is now (the measurements stay)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.one:
        import torch

        if ns.device == "cpu":
            torch.set_num_threads(min(2, os.cpu_count() or 1))
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        print(json.dumps(measure(ns.one, ns.model, ns.overrides, ns.device)))
        return 0
    if ns.predict:
        res = json.loads(Path(ns.predict).read_text())
        res["rows"] = [predict(r) if r["status"] == "ok" else r for r in res["rows"]]
        res["within_tolerance"] = sum(r["within"] for r in res["rows"] if r["status"] == "ok")
    else:
        work = Path(ns.work)
        work.mkdir(parents=True, exist_ok=True)
        res = run_set(ns.set, ns.device, work, ns.configs)
    print(table(res))
    print(f"within {TOLERANCE:.0%}: {res['within_tolerance']} of {res['measured']} measured")
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(res, indent=2) + "\n")
    if ns.json:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import results

        mb = 2**20
        results.record(
            ns.json,
            [
                {
                    **results.entry(
                        "memory-plan", r["config"], round(r["predicted_peak"] / mb), round(r["measured_peak"] / mb)
                    ),
                    "ratio": r["predicted_peak"] / r["measured_peak"],
                }
                for r in res["rows"]
                if r["status"] == "ok"
            ],
        )
    return 0 if res["status"] == "ok" and res["within_tolerance"] == res["measured"] else 1


if __name__ == "__main__":
    sys.exit(main())
