"""Claim (Yue et al. 2025, "Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs
Beyond the Base Model?"): RL on verifiable rewards raises pass@1 more than pass@k at large k; sampled
enough times, the base model solves about as many problems (or more) as the trained one.

The base model and a trained checkpoint each draw --n samples for the same --prompts held-out prompts
(grpolab.training.evaluation, through the rollout engine, at --temperature); pass@k for k = 1, 2, 4, ...,
n is the unbiased estimator of Chen et al. 2021 with a bootstrap 95% interval over the prompts, and each
change trained - base is paired over the prompts (grpolab.algo.stats). The verdict reads the gain at
k = 1 against the gain at k = n, through the paired interval of their difference per prompt.
Without RUN_DIR a short run of the demo recipe (the bundled model's arithmetic task) is trained first.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CLAIM = "RL raises pass@1 more than pass@k at large k (Yue et al. 2025)"


def _config(ns, run_dir: Path | None, overrides: list[str]):
    """The evaluation settings: the run's config (RUN_DIR) or the demo recipe, with --quick's small sizes
    and the KEY=VALUE overrides on top."""
    from grpolab.training.config import build_config, config_from_run
    from grpolab.training.recipe import load_recipe

    recipe = config_from_run(run_dir) if run_dir is not None else load_recipe("demo")
    quick = ["batch_size=8", "G=4", "micro_batch=4", "max_new_tokens=8", "eval_batch=8"] if ns.quick else []
    base = [
        f"eval_size={ns.prompts}",
        f"eval_num_generations={ns.n}",
        f"eval_temperature={ns.temperature}",
        f"steps={ns.steps}",
        f"out={ns.out / 'train'}",
        "progress=false",
        "eval_steps=0",
        "save_every=0",
    ]
    return build_config(recipe, quick + base + overrides)


def _evaluate(cfg, model: str) -> dict:
    import dataclasses

    from grpolab.training.evaluation import evaluate
    from grpolab.training.trainer import setup

    run = setup(dataclasses.replace(cfg, model=model), training=False, log=lambda *_: None)
    try:
        return evaluate(run, run.task.eval_set()[: cfg.eval_size])
    finally:
        run.engine.close()


def gain_gap(base: dict, trained: dict, k_small: int, k_large: int, seed: int = 0) -> dict:
    """The per-prompt difference of the gains, (pass@k_small change) - (pass@k_large change), with its
    paired bootstrap interval: positive and beyond noise where RL helped at k_small more than at k_large."""
    from grpolab.algo.stats import paired_comparison, pass_at_k_per_prompt

    n_b, n_t = base["samples_per_prompt"], trained["samples_per_prompt"]
    cb, ct = base["per_prompt"]["correct"], trained["per_prompt"]["correct"]
    small = pass_at_k_per_prompt(n_t, ct, k_small) - pass_at_k_per_prompt(n_b, cb, k_small)
    large = pass_at_k_per_prompt(n_t, ct, k_large) - pass_at_k_per_prompt(n_b, cb, k_large)
    return paired_comparison(large, small, seed=seed, binary=False)  # mean(small - large), paired


def verdict(change: dict, gap: dict, k_large: int) -> str:
    """What held here, in one sentence: the gain at k = 1 against the gain at k = k_large."""
    c1, ck = change["pass@1"], change[f"pass@{k_large}"]

    def pts(c: dict) -> str:
        return f"{100 * c['change']:+.1f} points [{100 * c['ci'][0]:+.1f}, {100 * c['ci'][1]:+.1f}]"

    lo, hi = gap["ci"]
    said = (
        f"pass@1 {pts(c1)}, pass@{k_large} {pts(ck)}; the gain at k=1 minus the gain at k={k_large}: "
        f"{100 * gap['change']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    )
    behind = ck["after"] < ck["before"]
    tail = (
        f"; at k={k_large} the base model is ahead ({100 * ck['before']:.1f}% vs {100 * ck['after']:.1f}%)"
        if behind
        else ""
    )
    if c1["beyond_noise"] and c1["change"] > 0 and lo > 0:
        return f"holds here: RL raised pass@1 more than pass@{k_large} ({said}){tail}"
    if hi < 0:
        return f"does not hold here: the gain grew with k ({said})"
    if not c1["beyond_noise"] or c1["change"] <= 0:
        return (
            f"not measured here: training did not raise pass@1 beyond noise ({said}); train longer or "
            f"give a better trained run"
        )
    return f"not measured here: the two gains are within noise of each other ({said}){tail}"


def plot(base: dict, trained: dict, path: Path) -> str | None:
    """pass@k of both models against k (log 2 axis) with their 95% bands; a message when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return "no PNG written: matplotlib is not installed (pip install 'grpolab[report]')"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, res in (("base", base), ("trained", trained)):
        ks = [int(k) for k in res["pass@k"]]
        est = [v["estimate"] for v in res["pass@k"].values()]
        ax.plot(ks, est, "o-", label=name)
        ax.fill_between(
            ks, [v["ci"][0] for v in res["pass@k"].values()], [v["ci"][1] for v in res["pass@k"].values()], alpha=0.2
        )
    ax.set_xscale("log", base=2)
    ax.set(title="pass@k, base vs trained (95% bands)", xlabel="k", ylabel="pass@k", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run(argv: list[str]) -> dict:
    import dataclasses

    from transformers.utils import logging as hf_logging

    from grpolab.app.lab.tables import table
    from grpolab.training.evaluation import compare

    ap = argparse.ArgumentParser(prog="grpolab lab passk", description=CLAIM + ". " + __doc__.split("\n\n")[1])
    ap.add_argument(
        "args",
        nargs="*",
        metavar="[RUN_DIR] [KEY=VALUE ...]",
        help="a trained run (its newest checkpoint vs the model it started from; default: train one), "
        "and settings of the run and the evaluation",
    )
    ap.add_argument("--n", type=int, default=64, help="samples per prompt, the largest k (default 64)")
    ap.add_argument("--prompts", type=int, default=32, help="held-out prompts (default 32)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    ap.add_argument(
        "--steps", type=int, default=20, help="steps of the demo recipe trained when no RUN_DIR is given (default 20)"
    )
    ap.add_argument(
        "--out", type=Path, default=Path("runs/lab-passk"), help="output directory (default runs/lab-passk)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 4 samples of 4 prompts, 1 training step of 8 completions, 8 tokens",
    )
    ns = ap.parse_intermixed_args(argv)
    if ns.quick:
        ns.n, ns.prompts, ns.steps = min(ns.n, 4), min(ns.prompts, 4), 1
    if ns.n < 2 or ns.prompts < 2 or ns.steps < 1:
        ap.error("--n and --prompts must be >= 2 and --steps >= 1")
    dirs, overrides = [a for a in ns.args if "=" not in a], [a for a in ns.args if "=" in a]
    if len(dirs) > 1:
        ap.error(f"one RUN_DIR at most, got {' '.join(dirs)}")
    t0 = time.perf_counter()
    hf_logging.disable_progress_bar()
    run_dir = Path(dirs[0]) if dirs else None
    if run_dir is not None and not (run_dir / "config.yaml").exists():
        ap.error(f"{run_dir}: not a run directory (no config.yaml); give the out= directory of a grpolab train run")
    cfg = _config(ns, run_dir, overrides)
    ns.out.mkdir(parents=True, exist_ok=True)
    if run_dir is None:
        from grpolab.app.lab.miniature import train_run

        print(f"training {cfg.steps} step(s) of the demo recipe into {cfg.out} ...")
        train_run("passk", dataclasses.replace(cfg, eval_size=0))  # evaluated below, once
        run_dir = Path(cfg.out)
    from grpolab.training.checkpoint import latest_good_checkpoint

    ck = latest_good_checkpoint(run_dir, log=print)
    if ck is None:
        ap.error(f"{run_dir}: the run has no checkpoint")
    print(
        f"sampling {ns.n} completions for each of {cfg.eval_size} held-out prompts, base ({cfg.model}) and "
        f"trained ({ck}) ..."
    )
    base, trained = _evaluate(cfg, cfg.model), _evaluate(cfg, str(ck))
    change = compare(base, trained, cfg.seed)
    ks = [int(k) for k in base["pass@k"]]
    rows = []
    for k in ks:
        b, t, c = base["pass@k"][str(k)], trained["pass@k"][str(k)], change[f"pass@{k}"]
        rows.append(
            [
                f"pass@{k}",
                f"{100 * b['estimate']:.1f} [{100 * b['ci'][0]:.1f}, {100 * b['ci'][1]:.1f}]",
                f"{100 * t['estimate']:.1f} [{100 * t['ci'][0]:.1f}, {100 * t['ci'][1]:.1f}]",
                f"{100 * c['change']:+.1f} [{100 * c['ci'][0]:+.1f}, {100 * c['ci'][1]:+.1f}]",
            ]
        )
    print(
        f"{cfg.task}, {base['n']} held-out prompts, {ns.n} samples each at temperature {ns.temperature:g}; "
        f"main reward {base['main_reward']}; percent, 95% intervals"
    )
    print(table(["", "base", "trained", "change (paired)"], rows))
    gap = gain_gap(base, trained, 1, ks[-1], cfg.seed)
    res = {
        "claim": CLAIM,
        "base_model": cfg.model,
        "trained": str(ck),
        "n": ns.n,
        "prompts": base["n"],
        "temperature": ns.temperature,
        "base": base,
        "trained_eval": trained,
        "change": change,
        "gain_gap": gap,
        "verdict": verdict(change, gap, ks[-1]),
    }
    note = plot(base, trained, ns.out / "passk.png")
    res["png"] = None if note else str(ns.out / "passk.png")
    res["time_s"] = time.perf_counter() - t0
    (ns.out / "passk.json").write_text(json.dumps(res, indent=2, default=float))
    print(res["verdict"])
    print(note or f"({res['time_s']:.0f} s; {ns.out / 'passk.json'}, {res['png']})")
    return res


__all__ = ["CLAIM", "gain_gap", "run", "verdict"]
