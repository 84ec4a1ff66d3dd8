"""Claim (lesson, E3): PPO's critic costs a second set of trained weights, their optimizer state and
time; what it buys is per-token credit -- advantages that differ along a sequence (GAE) instead of
GRPO's one advantage for every token of a completion.

The same model, task, steps and seed trained twice with `grpolab train`, once with algo=ppo (critic,
GAE) and once with algo=grpo, each in its own process (peak memory is per process). Default model:
the aha miniature's cached pre-trained character-level Llama on task longsum (grpolab lab aha), so
it runs in a minute or two on a CPU; --model smollm2-135m --task arithmetic measures the bundled model.

Measured per arm: parameters trained, peak memory (process peak RSS on the CPU, the CUDA allocator's
peak on a GPU), mean time per step, reward per block of steps, and the spread of per-token advantages
within a sequence: the standard deviation of `adv` over the tokens of each logged sample
(samples.jsonl, `tokens`), averaged over samples. GRPO's is 0 by construction.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path

CLAIM = "the critic doubles the trained weights and buys per-token credit (PPO vs GRPO)"


def train_cmd(algo: str, model: str, task: str, out: Path, steps: int, seed: int, lr: float, extra: list[str]):
    return [
        sys.executable,
        "-m",
        "grpolab.app.cli",
        "train",
        f"algo={algo}",
        f"model={model}",
        f"task={task}",
        f"out={out}",
        f"steps={steps}",
        f"seed={seed}",
        f"lr={lr}",
        "G=8",
        "batch_size=32",
        "micro_batch=32",
        "eval_size=0",
        "progress=false",
        "tensorboard=false",
        "report=false",
        "save_every=0",
        "samples_per_step=8",
        "sample_tokens=64",
        "threads=1",
        "reward_workers=1",
        "rollout.engine=native",
        *extra,
    ]


def within_sequence_spread(samples: list[dict]) -> float:
    """Mean over samples of the standard deviation of the per-token advantages of one sequence."""
    spreads = []
    for s in samples:
        adv = [a for a in (s.get("tokens") or {}).get("adv") or [] if a is not None]
        if len(adv) >= 2:
            m = sum(adv) / len(adv)
            spreads.append(math.sqrt(sum((a - m) ** 2 for a in adv) / len(adv)))
    return sum(spreads) / len(spreads) if spreads else float("nan")


def arm(algo: str, model: str, task: str, out: Path, steps: int, seed: int, lr: float, extra: list[str]) -> dict:
    from grpolab.util.fileio import read_jsonl

    if out.exists():
        shutil.rmtree(out)
    subprocess.run(train_cmd(algo, model, task, out, steps, seed, lr, extra), check=True, stdout=subprocess.DEVNULL)
    ms = read_jsonl(out / "metrics.jsonl")
    samples = read_jsonl(out / "samples.jsonl")
    rewards = [m["reward/mean"] for m in ms]
    k = max(1, len(ms) // 4)
    return {
        "params": ms[-1]["params/trained"],
        "peak_mb": max(m["memory/peak_mb"] for m in ms),
        "step_s": sum(m["time/step_s"] for m in ms[1:]) / max(1, len(ms) - 1),
        "reward_first": sum(rewards[:k]) / k,
        "reward_last": sum(rewards[-k:]) / k,
        "reward_curve": rewards,
        "adv_spread": within_sequence_spread(samples),
    }


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(
        prog="grpolab lab critic", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="6 steps per arm (for the tests)")
    ap.add_argument("--steps", type=int, help="steps per arm (default 30; 6 with --quick)")
    ap.add_argument("--model", help="model for both arms (default: the aha miniature's pre-trained model)")
    ap.add_argument("--task", default=None, help="task (default longsum with the miniature, else arithmetic)")
    ap.add_argument("--lr", type=float, help="learning rate (default 2e-4 with the miniature, 2e-5 otherwise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/lab/critic")
    ns = ap.parse_args(argv)
    if ns.steps is not None and ns.steps < 1:
        ap.error("--steps must be >= 1")
    steps = ns.steps or (6 if ns.quick else 30)
    extra: list[str] = []
    if ns.model is None:
        from grpolab.app.lab.aha import MODES, pretrained_model

        model = str(pretrained_model("full", MODES["full"]["pretrain_steps"], ns.seed)[0])
        task, lr = ns.task or "longsum", ns.lr or 2e-4
        extra = ["max_new_tokens=64"]
    else:
        model, task, lr = ns.model, ns.task or "arithmetic", ns.lr or 2e-5
    out = Path(ns.out)
    res = {"model": model, "task": task, "steps": steps}
    for algo in ("ppo", "grpo"):
        res[algo] = arm(algo, model, task, out / algo, steps, ns.seed, lr, extra)
    p, g = res["ppo"], res["grpo"]
    print(f"model={model} task={task}, {steps} steps per arm, batch 32 (G=8), seed {ns.seed}, lr {lr:g}")
    rows = [
        ["params trained", int(p["params"]), int(g["params"]), g["params"] / p["params"]],
        ["peak memory MB", round(p["peak_mb"]), round(g["peak_mb"]), g["peak_mb"] / p["peak_mb"]],
        ["time per step s", p["step_s"], g["step_s"], g["step_s"] / p["step_s"]],
        ["reward first 1/4", p["reward_first"], g["reward_first"], ""],
        ["reward last 1/4", p["reward_last"], g["reward_last"], ""],
        ["adv spread in a sequence", p["adv_spread"], g["adv_spread"], ""],
    ]
    print(table(["", "ppo", "grpo", "grpo/ppo"], rows))
    holds = g["params"] / p["params"] < 0.6 and p["adv_spread"] > 0 and g["adv_spread"] < 1e-6
    verdict = (
        f"{'holds' if holds else 'does not hold here'}: the critic makes PPO train "
        f"{p['params'] / g['params']:.2f}x the parameters (peak memory {p['peak_mb'] / g['peak_mb']:.2f}x, "
        f"time per step {p['step_s'] / g['step_s']:.2f}x GRPO's) and gives per-token advantages that vary "
        f"within a sequence (mean std {p['adv_spread']:.3g}; GRPO {g['adv_spread']:.3g}); reward last quarter "
        f"{p['reward_last']:.2f} (ppo) vs {g['reward_last']:.2f} (grpo) on this budget"
    )
    print(verdict)
    res["verdict"] = verdict
    return res
