"""The lesson's claim "GRPO needs about half of PPO's memory", measured: the same short run with
algo=grpo and algo=ppo (presets as shipped, both with a frozen reference model), each in its own
process, on the bundled model. Prints parameters trained and peak memory side by side, as ratios.

    .venv/bin/python benchmarks/memory_grpo_vs_ppo.py [--steps 2] [--model smollm2-135m]

Peak memory is the process's peak RSS on the CPU (the CUDA allocator's peak on a GPU): it includes
the Python runtime and activations, not only weights and optimizer state, so the ratio is smaller than
the pure parameter-state ratio worked out in docs/algorithms.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(algo: str, steps: int, model: str, workdir: Path) -> dict:
    out = workdir / algo
    cmd = [sys.executable, "-m", "grpolab.cli", "train", f"algo={algo}", f"steps={steps}", f"out={out}",
           f"model={model}", "eval_size=0", "batch_size=16", "G=4", "max_new_tokens=16", "micro_batch=8",
           "progress=false", "tensorboard=false", "algo.mu=1"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return {"params": last["params/trained"], "peak_mb": last["memory/peak_mb"], "step_s": last["time/step_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        g = run("grpo", a.steps, a.model, Path(d))
        p = run("ppo", a.steps, a.model, Path(d))
    print(f"{'':18}{'grpo':>12}{'ppo':>12}{'grpo/ppo':>10}")
    for k, label in (("params", "params trained"), ("peak_mb", "peak memory MB"), ("step_s", "last step s")):
        print(f"{label:18}{g[k]:12.0f}{p[k]:12.0f}{g[k] / p[k]:10.2f}")


if __name__ == "__main__":
    main()
