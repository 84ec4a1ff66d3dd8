"""grpolab eval: score one model, or compare two paired on the same prompts, with 95% intervals.

    grpolab eval RUN_OR_MODEL [--num-generations 16] [--k 1,4,16] [--temperature 1.0] [KEY=VALUE ...]
    grpolab eval A B [...]          A and B on A's held-out prompts; the change B - A with its interval

A target is a run directory (its config and newest verified checkpoint), a checkpoint directory of a run
(OUT/checkpoints/step-000020 or OUT/checkpoints/best: that run's config), a recipe (a YAML file or the
name of one in recipes/), or a model (smollm2-135m, a Hugging Face directory, a .gguf file) evaluated on
the task the KEY=VALUE settings name. stdout is one JSON document; the table and the sentences go to
stderr. The numbers are grpolab.training.evaluation's (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpolab.util.fields import ConfigError

USAGE = """grpolab eval [RUN_OR_MODEL [B]] [--num-generations N] [--k 1,4,16] [--temperature T] [KEY=VALUE ...]

Score a model or a run's newest checkpoint on the held-out prompts of its task: greedily (accuracy with a
Wilson 95% interval), or with N samples per prompt (pass@k for every k <= N, unbiased, with bootstrap
95% intervals over the prompts). Two targets: both on the same prompts (the first one's task), and
the paired change B - A with its interval and whether it is beyond noise.
Examples:
  grpolab eval runs/demo                                  # greedy, the run's task and eval_size
  grpolab eval smollm2-135m --num-generations 16 --k 1,4,16 eval_size=32
  grpolab eval smollm2-135m runs/demo --num-generations 8 # base vs trained, paired
"""


def _err(msg: str) -> None:
    print(msg, file=sys.stderr)


def resolve_target(target: str) -> tuple[dict, str]:
    """(recipe dict with `model` set where the target names one, what it is) for one eval target."""
    from grpolab.training.config import config_from_run
    from grpolab.training.recipe import RECIPES_DIR, load_recipe

    p = Path(target)
    if (p / "config.yaml").exists():
        from grpolab.training.checkpoint import latest_good_checkpoint

        recipe = config_from_run(p)
        ck = latest_good_checkpoint(p, log=lambda msg: _err(f"grpolab: {msg}"))
        if ck is None:
            raise ConfigError(f"{target}: the run has no checkpoint yet")
        recipe["model"] = str(ck)
        return recipe, f"run {target} ({ck.name})"
    if p.is_dir() and p.parent.name == "checkpoints" and (p.parents[1] / "config.yaml").exists():
        recipe = config_from_run(p.parents[1])
        recipe["model"] = str(p)
        return recipe, f"checkpoint {target}"
    if p.suffix in (".yaml", ".yml") or (not p.exists() and (RECIPES_DIR / f"{target}.yaml").exists()):
        return load_recipe(target), f"recipe {target}"
    return {"model": target}, f"model {target}"


def parse_ks(text: str | None) -> list[int] | None:
    """`1,4,16` -> [1, 4, 16] (ConfigError, exit 2, on anything else)."""
    if not text:
        return None
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--k: expected comma-separated integers like 1,4,16, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k: every k must be >= 1, got {text!r}")
    return ks


def eval_main(argv: list[str]) -> int:
    from grpolab.training.config import build_config

    ap = argparse.ArgumentParser(
        prog="grpolab eval", usage=USAGE, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-h", "--help", action="store_true")
    ap.add_argument(
        "--num-generations",
        type=int,
        default=None,
        metavar="N",
        help="samples per prompt (eval_num_generations; 0: greedy)",
    )
    ap.add_argument("--k", default=None, help="the k of pass@k, comma-separated (default 1, 2, 4, ..., N)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (eval_temperature)")
    ap.add_argument("args", nargs="*")
    ns = ap.parse_intermixed_args(argv)  # targets, options and KEY=VALUE in any order
    if ns.help:
        print(USAGE)
        return 0
    targets = [a for a in ns.args if "=" not in a]
    overrides = [a for a in ns.args if "=" in a]
    if len(targets) > 2:
        raise ConfigError(
            f"grpolab eval takes one or two targets (a run, checkpoint, recipe or model), "
            f"got {len(targets)}: {' '.join(targets)}"
        )
    if ns.num_generations is not None:
        overrides.append(f"eval_num_generations={ns.num_generations}")
    if ns.temperature is not None:
        overrides.append(f"eval_temperature={ns.temperature}")
    ks = parse_ks(ns.k)
    from grpolab.training.config import thread_wait_of
    from grpolab.util.threads import prepare

    # before a checkpoint lookup imports torch (grpolab.util.threads); `auto` measures the load first
    prepare(thread_wait_of({}, overrides), measure=True)
    resolved = [resolve_target(t) for t in targets] or [({}, "the configured model")]
    # the settings (task, rewards, eval_*) of the first target that has a config; each target's own model
    base = next((dict(r) for r, label in resolved if not label.startswith("model ")), {})
    for (recipe, _), target in zip(resolved[1:], targets[1:]):
        if "model" not in recipe:
            raise ConfigError(f"{target}: a recipe names no model to compare; give a run, checkpoint or model")
        for key in ("task", "task_args"):
            if recipe.get(key, base.get(key)) != base.get(key):
                _err(
                    f"grpolab eval: note: {target} was set up with {key}={recipe[key]!r}; both are evaluated "
                    f"on the same prompts, with {key}={base.get(key)!r}"
                )
    cfgs = [build_config({**base, **({"model": r["model"]} if "model" in r else {})}, overrides) for r, _ in resolved]
    n = max(1, cfgs[0].eval_num_generations)
    if ks and max(ks) > n:
        raise ConfigError(f"--k: k={max(ks)} is more than the {n} sample(s) per prompt; raise --num-generations")
    label_a = resolved[0][1]
    if len(targets) < 2:
        res = _evaluate(cfgs[0], ks)
        print(json.dumps(res, indent=2))
        _err(format_result(label_a, res))
        return 0
    label_b = resolved[1][1]
    from grpolab.training.evaluation import compare

    res_a, res_b = _evaluate(cfgs[0], ks), _evaluate(cfgs[1], ks)
    change = compare(res_a, res_b, cfgs[0].seed)
    print(
        json.dumps(
            {"a": {"target": targets[0], **res_a}, "b": {"target": targets[1], **res_b}, "change": change}, indent=2
        )
    )
    _err(format_result(label_a, res_a) + "\n" + format_result(label_b, res_b))
    for cmp in (change or {}).values():
        _err(cmp["sentence"])
    return 0


def _evaluate(cfg, ks: list[int] | None) -> dict:
    """Load cfg.model (no reference, no optimizer) and evaluate it on cfg.eval_size held-out prompts."""
    from grpolab.training.evaluation import evaluate
    from grpolab.training.trainer import setup

    run = setup(cfg, training=False, log=_err)  # stdout: the JSON alone
    try:
        return evaluate(run, run.task.eval_set()[: cfg.eval_size or 64], ks=ks)
    finally:
        run.engine.close()


def format_result(label: str, res: dict) -> str:
    """A few lines for the terminal: accuracy and each pass@k with their 95% intervals, the extraction shares."""
    how = (
        "greedy"
        if not res.get("temperature")
        else f"{res['samples_per_prompt']} samples per prompt at temperature {res['temperature']:g}"
    )
    if res["accuracy"] is None:  # the main reward skipped every completion
        accuracy = "  accuracy  none: the main reward scored no completion"
    else:
        lo, hi = res["accuracy_ci"]
        accuracy = f"  accuracy  {100 * res['accuracy']:5.1f}%  [{100 * lo:.1f}, {100 * hi:.1f}]  ({res['accuracy_ci_method']})"
    lines = [f"{label}: {res['n']} held-out prompts, {how}, main reward {res['main_reward']}", accuracy]
    for k, v in res["pass@k"].items():
        lo, hi = v["ci"]
        lines.append(f"  pass@{k:<4}{100 * v['estimate']:5.1f}%  [{100 * lo:.1f}, {100 * hi:.1f}]")
    for name, s in res.get("extraction", {}).items():
        lines.append(
            f"  {name}: no parsable answer {100 * s['no_answer']:.1f}%, wrong {100 * s['wrong']:.1f}%, "
            f"right {100 * s['right']:.1f}%"
        )
    return "\n".join(lines)


__all__ = ["eval_main", "format_result", "parse_ks", "resolve_target"]
