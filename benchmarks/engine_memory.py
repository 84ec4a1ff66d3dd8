"""Where a grpolab run's memory goes, phase by phase, with either rollout engine: a bench setting's run
(grpolab.app.bench.ours.setup_run), its peak resident memory measured per phase by resetting the kernel's
high-water mark (`echo 5 > /proc/self/clear_refs`) before each phase and reading VmHWM after it.

    python benchmarks/engine_memory.py [--engine vllm|native|both] [--setting a|b|agent] [--steps 3]
                                       [--cpu-malloc keep|system] [--json PATH] [--raw OUT]

Phases: load+engine (the policy, the reference, the optimizer, and the engine's start: vLLM's model
load, compile and KV cache), then per step generate (generate_turns in the agent setting), reference
(no-grad pass of pi_ref, when beta > 0), update (forward+backward, optimizer step) and sync (the weights
handed to the engine); scoring, shaping and the engine's release() fall between phases and are not
counted. After each step: the rollout's rows x (prompt + completion) width and its completion tokens, as
the update's activations grow with both. Prints, per phase, the resident memory after it and its own
peak (MB); the largest is the run's peak, what `grpolab bench` reports as ru_maxrss. Linux only.
`--engine both` runs native, then vLLM, each in a process of its own, and with `--json` appends their
peaks as one entry of benchmarks/results.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: peak since the last reset) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Lower VmHWM to the resident memory now (Linux >= 4.0), so the next reading is one phase's peak."""
    Path("/proc/self/clear_refs").write_text("5")


class Phases:
    """Records (name, resident after, peak during) for each phase run through `measure`."""

    def __init__(self):
        self.rows: list[dict] = []

    def measure(self, name: str, fn, *args, **kwargs):
        reset_peak()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.rows.append(
            {
                "phase": name,
                "seconds": round(time.perf_counter() - t0, 2),
                "rss_mb": round(status_mb("VmRSS")),
                "peak_mb": round(status_mb("VmHWM")),
            }
        )
        r = self.rows[-1]
        print(f"{name:18} {r['seconds']:8.2f} s   rss {r['rss_mb']:6d} MB   peak {r['peak_mb']:6d} MB", flush=True)
        return out


def results_module():
    """benchmarks/results.py, where the shared entry format lives (this file may be loaded from elsewhere)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import results

    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["vllm", "native", "both"], default="vllm")
    ap.add_argument("--setting", choices=["a", "b", "agent"], default="a")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--cpu-malloc",
        choices=["keep", "system"],
        default=None,
        help="the run's cpu_malloc (default: the config's default)",
    )
    ap.add_argument("--json", default="", help="append the result to this JSON-lines file (benchmarks/results.py)")
    ap.add_argument("--raw", default="", help="write this script's own JSON (every phase) here")
    ns = ap.parse_args()
    if ns.engine == "both":
        peaks = {}
        with tempfile.TemporaryDirectory(prefix="grpolab-mem-") as tmp:
            for engine in ("native", "vllm"):
                argv = [a for a in sys.argv[1:] if a not in ("both", "--engine") and not a.startswith("--engine=")]
                argv = [
                    a
                    for i, a in enumerate(argv)
                    if not (i and argv[i - 1] in ("--json", "--raw")) and a not in ("--json", "--raw")
                ]
                subprocess.run(
                    [sys.executable, __file__, "--engine", engine, "--raw", f"{tmp}/{engine}.json", *argv], check=True
                )
                peaks[engine] = json.loads(Path(f"{tmp}/{engine}.json").read_text())["ru_maxrss_mb"]
        print(f"peak MB: native {peaks['native']}, vllm {peaks['vllm']} (x{peaks['vllm'] / peaks['native']:.2f})")
        if ns.json:
            results = results_module()
            setting = f"setting ({ns.setting}), {ns.steps} steps, cpu_malloc={ns.cpu_malloc or 'default'}"
            results.record(ns.json, [results.entry("engine-memory", setting, peaks["vllm"], peaks["native"])])
        return

    from grpolab.app.bench.agent import bench_model_dir
    from grpolab.app.bench.spec import SETTINGS, Spec

    spec = Spec(setting=ns.setting, steps=ns.steps, against="none", **SETTINGS[ns.setting])
    phases = Phases()
    phases.rows.append({"phase": "start", "rss_mb": round(status_mb("VmRSS")), "peak_mb": round(status_mb("VmHWM"))})
    from grpolab.app.bench.ours import setup_run
    from grpolab.training import step as step_mod

    with tempfile.TemporaryDirectory(prefix="grpolab-mem-") as tmp:
        model = bench_model_dir(spec, tmp) if spec.agent else None
        run = phases.measure(
            "load+engine",
            setup_run,
            spec,
            f"{tmp}/run",
            model=model,
            engine=ns.engine,
            **({"cpu_malloc": ns.cpu_malloc} if ns.cpu_malloc else {}),
        )
        engine = run.engine
        for name in ("generate", "generate_turns", "sync"):  # instance attributes shadow the methods
            fn = getattr(engine, name)
            setattr(engine, name, lambda *a, _n=name, _f=fn, **k: phases.measure(_n, _f, *a, **k))
        for name in ("reference", "update"):  # train_step looks both up at each call
            fn = getattr(step_mod, name)
            setattr(step_mod, name, lambda *a, _n=name, _f=fn, **k: phases.measure(_n, _f, *a, **k))
        shapes = []
        for step in range(1, spec.steps + 1):
            print(f"-- step {step}", flush=True)
            _, batch = step_mod.train_step(run, step)
            r = batch.rollout
            rows, prompt, width = r.completion_ids.shape[0], r.prompt_ids.shape[1], r.completion_ids.shape[1]
            shapes.append(
                {
                    "step": step,
                    "rows": rows,
                    "prompt_width": prompt,
                    "completion_width": width,
                    "tokens": int(r.completion_mask.sum()),
                }
            )
            print(
                f"   rows x (prompt + completion) = {rows} x ({prompt} + {width}), "
                f"{shapes[-1]['tokens']} completion tokens",
                flush=True,
            )
        engine.close()
    out = {
        "engine": ns.engine,
        "setting": ns.setting,
        "cpu_malloc": run.cfg.cpu_malloc,
        "describe": engine.describe(),
        "phases": phases.rows,
        "shapes": shapes,
        "ru_maxrss_mb": round(step_mod.peak_memory_mb(run.device)),
    }
    print(json.dumps(out))
    if ns.raw:
        Path(ns.raw).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
