"""Claim (lesson, section 6.6): trained with GRPO on a verifiable reward alone, response length rises
with reward, and reflection appears -- the DeepSeek-R1-Zero "aha", here in miniature on a CPU.

1. A tiny character-level Llama (grpolab.app.lab.tinychar) is pre-trained by supervised next-token
   training on sums of 4-6 one-digit numbers ("3+5+7+2="), written three ways (grpolab.tasks.longsum):
   mostly a direct guess that is right about a third of the time, a small share of step-by-step
   running sums ("8,15,17") that are always right, and a rarer share that slips, writes "wait" and
   corrects itself. The pre-trained model is cached ($GRPOLAB_CACHE/lab), keyed by its settings.
2. It is then trained with the real `grpolab train` (trainer, rollout, GRPO objective) on task
   longsum, whose only reward is the final number (math, extract=last_number). Nothing rewards length
   or format.
3. Printed per block of steps: reward, mean length (all, correct, incorrect), the step-by-step share,
   the reflection-marker rate, the length-reward correlation; sample completions from the start and
   the end; a verdict with the numbers. OUT/aha.json and OUT/aha.png hold the curves.

What it shows: RL selects a behaviour that is rare in the starting policy, longer and more accurate,
so length and reward rise together. What it does not show: reasoning emerging from nothing -- the
step-by-step solutions were in the pre-training texts (docs/lab.md).

--ablate adds two arms: the same pre-training without step-by-step texts (length should not rise),
and algo=dr_grpo against algo=grpo on the same model (GRPO's per-sequence 1/|o| length bias).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

CLAIM = "length rises with reward when RL selects longer, more accurate solutions (the aha, in miniature)"

MIXES = {  # styles of the texts written after the task's own prompt ("3+5+7+2="), and the share of
    # worked examples: the same sums after a different prompt ("3+5+7+2?"), always step by step
    "full": {"direct": 0.85, "steps": 0.12, "reflect": 0.03, "worked": 0.5},
    "nosteps": {"direct": 1.0, "steps": 0.0, "reflect": 0.0, "worked": 0.0},
}
MODES = {  # pre-training and RL budgets
    "full": {"pretrain_steps": 1500, "steps": 60, "blocks": 6},
    "quick": {"pretrain_steps": 1500, "steps": 20, "blocks": 4},  # the same cached pre-trained model
}
MODEL = {"hidden": 96, "layers": 3, "heads": 4}
N_TEXTS = 20_000
VERSION = 2  # bump when the corpus or the model recipe changes (invalidates the cache)


def corpus(mix: dict[str, float], n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, completion) pre-training pairs on the longsum problem space. A share mix["worked"] are
    worked examples: prompt "3+5+7+2?" and a step-by-step solution (where the skill is learnt, as a
    base model learns arithmetic from textbooks); the rest use the task's prompt "3+5+7+2=" with a
    style drawn from mix (mostly direct guesses: the behaviour the starting policy shows)."""
    from grpolab.tasks.longsum import LongSumTask, solution

    task = LongSumTask(seed=seed, eval_size=0)
    rng = random.Random(f"grpolab/app/lab/aha/corpus/{seed}")
    styles = [k for k in mix if k != "worked"]
    weights = [mix[k] for k in styles]
    out = []
    for _ in range(n):
        terms = task.draw_terms(rng)
        q = "+".join(map(str, terms))
        if rng.random() < mix.get("worked", 0.0):
            out.append((q + "?", solution(terms, "steps", rng)))
        else:
            out.append((q + "=", solution(terms, rng.choices(styles, weights)[0], rng)))
    return out


def pretrained_model(mix_name: str, pretrain_steps: int, seed: int, log=print) -> tuple[Path, dict]:
    """The cached pre-trained model for these settings (built once). Returns (directory, info)."""
    from grpolab.app.lab import tinychar
    from grpolab.app.lab.miniature import cached_model

    spec = {
        "mix": MIXES[mix_name],
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "model": MODEL,
        "n_texts": N_TEXTS,
        "version": VERSION,
    }

    def build(directory: Path, target: Path) -> dict:
        log(f"pre-training the tiny model ({mix_name} mix, {pretrain_steps} steps; cached in {target})")
        tok = tinychar.char_tokenizer()
        model = tinychar.tiny_llama(tok, seed=seed, **MODEL)
        info = tinychar.pretrain(
            model, tok, corpus(MIXES[mix_name], N_TEXTS, seed), steps=pretrain_steps, seed=seed, log=log
        )
        info.update({"params": tinychar.n_params(model), "spec": spec})
        tinychar.save(model, tok, directory)
        return info

    return cached_model(f"aha-{mix_name}", spec, build, log)


def rl_config(model: Path, out: Path, *, steps: int, seed: int, algo: str, threads: int, lr: float):
    from grpolab.training.config import build_config

    recipe = {
        "out": str(out),
        "steps": steps,
        "seed": seed,
        "model": str(model),
        "task": "longsum",
        "algo": {"name": algo, "beta": 0.0},
        "G": 8,
        "batch_size": 64,
        "micro_batch": 64,
        "max_new_tokens": 64,
        "temperature": 1.0,
        "lr": lr,
        "warmup_steps": 2,
        "eval_size": 64,
        "samples_per_step": 64,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "threads": threads,
        "reward_workers": 1,
        "report": False,
        "sample_tokens": 0,
        "rollout": {"engine": "native"},
    }  # the lab measures a claim, on the engine its numbers came from
    return build_config(recipe, [])


def train_arm(
    name: str, model: Path, out: Path, *, steps: int, seed: int, algo: str, threads: int, lr: float
) -> tuple[list[dict], list[dict], float]:
    """One `grpolab train` run; returns (metrics records, sample records, seconds)."""
    from grpolab.app.lab.miniature import train_run

    # a previous lab run's output in OUT/NAME is replaced (train_run)
    return train_run(name, rl_config(model, out / name, steps=steps, seed=seed, algo=algo, threads=threads, lr=lr))


def per_step(metrics: list[dict], samples: list[dict]) -> list[dict]:
    """One row per step: the logged metrics plus the step-by-step and reflection shares of its samples."""
    from grpolab.tasks.longsum import style_of

    by_step: dict[int, list[str]] = {}
    for s in samples:
        by_step.setdefault(int(s["step"]), []).append(style_of(s["completion"]))
    rows = []
    for m in metrics:
        styles = by_step.get(int(m["step"]), [])
        rows.append(
            {
                "step": int(m["step"]),
                "reward": m.get("reward/mean"),
                "length": m.get("completion/length_mean"),
                "length_correct": m.get("aha/length_correct"),
                "length_incorrect": m.get("aha/length_incorrect"),
                "steps_share": sum(s != "direct" for s in styles) / len(styles) if styles else float("nan"),
                "reflection": m.get("aha/reflection_frac"),
                "corr": m.get("aha/length_reward_corr"),
                "truncated": m.get("completion/truncated_frac"),
            }
        )
    return rows


def summary(rows: list[dict], n_blocks: int) -> dict:
    from grpolab.app.lab.miniature import blocks
    from grpolab.training.diagnostics import pearson

    bl = blocks(rows, n_blocks)
    first, last = bl[0], bl[-1]
    return {
        "blocks": bl,
        "first": first,
        "last": last,
        "corr_across_steps": pearson([r["length"] for r in rows], [r["reward"] for r in rows]),
    }


def samples_at(samples: list[dict], step: int, k: int = 6) -> list[str]:
    return [f"{s['prompt']}{s['completion']}   (reward {s['reward']:g})" for s in samples if s["step"] == step][:k]


def plot(arms: dict[str, list[dict]], path: Path) -> str | None:
    """Length and reward curves of every arm in one PNG; returns a message when matplotlib is missing."""
    from grpolab.app.lab.miniature import plot_curves

    return plot_curves(
        arms,
        path,
        [
            ("reward", "reward (final answer only)", "reward/mean"),
            ("length", "mean completion length", "tokens (characters)"),
        ],
    )


def verdict(s: dict) -> str:
    f, l = s["first"], s["last"]
    dr, dl = l["reward"] - f["reward"], l["length"] - f["length"]
    nums = (
        f"reward {f['reward']:.2f} -> {l['reward']:.2f}, mean length {f['length']:.1f} -> {l['length']:.1f} "
        f"tokens, step-by-step share {f['steps_share']:.2f} -> {l['steps_share']:.2f} "
        f"(first vs last block; correlation of length and reward across steps {s['corr_across_steps']:.2f})"
    )
    if dr > 0.05 and dl > 1.0:
        return f"holds here: length and reward rose together: {nums}"
    return f"does not hold here: {nums}"


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.miniature import finish
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(
        prog="grpolab lab aha", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="20 RL steps instead of 60, on the same cached pre-trained model (for the tests)",
    )
    ap.add_argument("--ablate", action="store_true", help="also run: no step-by-step pre-training; algo=dr_grpo")
    ap.add_argument("--out", default="runs/lab/aha", help="where the runs, aha.json and aha.png go")
    ap.add_argument("--steps", type=int, help="RL steps (default 60; 20 with --quick)")
    ap.add_argument("--pretrain-steps", type=int, help="pre-training steps (default 1500)")
    ap.add_argument(
        "--lr", type=float, default=2e-4, help="RL learning rate (default 2e-4; 1e-3 breaks the step-by-step skill)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: a 0.3M-parameter model runs fastest on one core)",
    )
    ns = ap.parse_args(argv)
    for name in ("steps", "pretrain_steps", "threads"):
        if getattr(ns, name) is not None and getattr(ns, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    import torch

    torch.set_num_threads(ns.threads)
    mode = MODES["quick" if ns.quick else "full"]
    steps = ns.steps or mode["steps"]
    pre_steps = ns.pretrain_steps or mode["pretrain_steps"]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, pinfo = pretrained_model("full", pre_steps, ns.seed)
    m = MIXES["full"]
    print(
        f"tiny char-level Llama: {pinfo['params']:,} parameters, pre-trained {pinfo['steps']} steps "
        f"(loss {pinfo['loss_first']:.2f} -> {pinfo['loss_last']:.2f}, {pinfo['time_s']:.0f} s when built) on "
        f"{N_TEXTS:,} texts: {m['worked']:.0%} worked examples ('3+5+7+2?' -> step by step); after the task's "
        f"prompt ('3+5+7+2='): {m['direct']:.0%} direct guesses (right 1/3 of the time), {m['steps']:.0%} "
        f"step by step, {m['reflect']:.0%} slip + 'wait' + fix"
    )
    arms_cfg = [("grpo", model, "grpo")]
    if ns.ablate:
        nomodel, _ = pretrained_model("nosteps", pre_steps, ns.seed)
        arms_cfg += [("no_steps_pretraining", nomodel, "grpo"), ("dr_grpo", model, "dr_grpo")]
    res: dict = {"mode": "quick" if ns.quick else "full", "pretrain": pinfo, "model": str(model), "arms": {}}
    rows_by_arm: dict[str, list[dict]] = {}
    for name, mdir, algo in arms_cfg:
        print(
            f"\n[{name}] grpolab train: task=longsum algo={algo} steps={steps} G=8 batch_size=64 lr={ns.lr:g} "
            f"(reward: the final number only)"
        )
        metrics, samples, secs = train_arm(
            name, mdir, out, steps=steps, seed=ns.seed, algo=algo, threads=ns.threads, lr=ns.lr
        )
        rows = per_step(metrics, samples)
        rows_by_arm[name] = rows
        s = summary(rows, mode["blocks"])
        cols = ["steps", "reward", "length", "length_correct", "length_incorrect", "steps_share", "reflection", "corr"]
        print(
            table(
                ["steps", "reward", "len", "len_ok", "len_wrong", "step_share", "reflect", "len~rew"],
                [[b[c] for c in cols] for b in s["blocks"]],
            )
        )
        s["time_s"] = secs
        s["samples_start"] = samples_at(samples, rows[0]["step"])
        s["samples_end"] = samples_at(samples, rows[-1]["step"])
        s["verdict"] = verdict(s)
        res["arms"][name] = s
        print(f"samples at step {rows[0]['step']}:  " + " | ".join(s["samples_start"][:4]))
        print(f"samples at step {rows[-1]['step']}: " + " | ".join(s["samples_end"][:4]))
        print(f"[{name}] {s['verdict']} ({secs:.0f} s)")
    main = res["arms"]["grpo"]
    if ns.ablate:
        print("\nablation (first -> last block)")
        print(
            table(
                ["arm", "reward", "", "length", " ", "len_wrong", "  ", "step_share", "   "],
                [
                    [
                        n,
                        a["first"]["reward"],
                        a["last"]["reward"],
                        a["first"]["length"],
                        a["last"]["length"],
                        a["first"]["length_incorrect"],
                        a["last"]["length_incorrect"],
                        a["first"]["steps_share"],
                        a["last"]["steps_share"],
                    ]
                    for n, a in res["arms"].items()
                ],
            )
        )
        ns_, dr, g = res["arms"]["no_steps_pretraining"], res["arms"]["dr_grpo"], main
        dl = ns_["last"]["length"] - ns_["first"]["length"]
        res["ablation_verdict"] = (
            f"ablation: without step-by-step pre-training the length {'does not rise' if dl <= 1.0 else 'rises'} "
            f"({ns_['first']['length']:.1f} -> {ns_['last']['length']:.1f} tokens; reward {ns_['first']['reward']:.2f} -> "
            f"{ns_['last']['reward']:.2f}) against {g['first']['length']:.1f} -> {g['last']['length']:.1f} with it; "
            f"incorrect completions in the last block: {g['last']['length_incorrect']:.1f} tokens under grpo, "
            f"{dr['last']['length_incorrect']:.1f} under dr_grpo"
        )
        print(res["ablation_verdict"])
    return finish(res, "grpo", rows_by_arm, out, "aha", plot, t0)
