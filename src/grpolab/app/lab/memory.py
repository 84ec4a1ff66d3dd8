"""Claim: GRPO roughly halves PPO's memory (no value model: no critic weights, gradients, optimizer
state or activations). The same short run with algo=grpo and algo=ppo (presets as shipped, both with a
frozen reference model), each in its own process (`grpolab train`), on the bundled model. Prints
parameters trained, peak memory and step time side by side, and the grpo/ppo ratios.

Peak memory is the process's peak RSS on the CPU (the CUDA allocator's peak on a GPU): it includes the
Python runtime and activations, not only weights and optimizer state, so the ratio is smaller than the
pure parameter-state ratio worked out in docs/algorithms.md. This trains the real model: minutes on a CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CLAIM = "GRPO roughly halves PPO's memory"
KEYS = (("params", "params trained"), ("peak_mb", "peak memory MB"), ("step_s", "last step s"))


def train_cmd(algo: str, steps: int, model: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpolab.app.cli",
        "train",
        f"algo={algo}",
        f"steps={steps}",
        f"out={out}",
        f"model={model}",
        "eval_size=0",
        "batch_size=16",
        "G=4",
        "max_new_tokens=16",
        "micro_batch=8",
        "progress=false",
        "tensorboard=false",
        "algo.mu=1",
        "rollout.engine=native",
    ]


def train_one(algo: str, steps: int, model: str, workdir: Path) -> dict:
    from grpolab.training.metrics import read_jsonl

    out = workdir / algo
    subprocess.run(train_cmd(algo, steps, model, out), check=True, stdout=subprocess.DEVNULL)
    last = read_jsonl(out / "metrics.jsonl")[-1]
    return {"params": last["params/trained"], "peak_mb": last["memory/peak_mb"], "step_s": last["time/step_s"]}


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(
        prog="grpolab lab memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    ap.add_argument("--model", default="smollm2-135m", help="model for both runs (default smollm2-135m)")
    ns = ap.parse_args(argv)
    if ns.steps < 1:
        ap.error("--steps must be >= 1")
    with tempfile.TemporaryDirectory() as d:
        g = train_one("grpo", ns.steps, ns.model, Path(d))
        p = train_one("ppo", ns.steps, ns.model, Path(d))
    ratio = {k: (g[k] / p[k] if p[k] else float("nan")) for k, _ in KEYS}
    print(f"{ns.model}, {ns.steps} steps each, batch 16 (G=4), 16 new tokens")
    print(
        table(
            ["", "grpo", "ppo", "grpo/ppo"],
            [
                [label, *(round(x[k], 2) if k == "step_s" else int(round(x[k])) for x in (g, p)), ratio[k]]
                for k, label in KEYS
            ],
        )
    )
    m = ratio["peak_mb"]
    verdict = (
        f"{'holds' if m <= 0.7 else 'does not hold here'}: GRPO's peak memory is {m:.2f} of PPO's "
        f"(params trained {ratio['params']:.2f}); process peak includes runtime and activations"
    )
    print(verdict)
    return {"grpo": g, "ppo": p, "ratio": ratio, "verdict": verdict}
