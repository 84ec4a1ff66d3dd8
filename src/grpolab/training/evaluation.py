"""Held-out evaluation: through the run's rollout engine, greedy or n samples per prompt, with intervals.

    res = evaluate(run, examples)           one evaluation (the run's eval_* settings, or as given):
                                            accuracy, pass@k, 95% intervals, the extraction report
    eval_metrics(res)                       its flat eval/ keys, for a row of metrics.jsonl
    compare(before, after)                  the paired change on the same prompts, with its interval
                                            and a sentence saying whether it is beyond noise
    Evaluator(run, eval_set, logger)        when a training run evaluates: start, every eval_steps,
                                            end; keeps the best model (save_best), stops at eval_stop_at

The statistics are grpolab.algo.stats (docs/evaluation.md says how to read them). A completion passes
when its main reward (the largest weight) is at least cfg.eval_pass_threshold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from grpolab.algo.stats import (
    bootstrap_interval,
    default_ks,
    describe_change,
    paired_comparison,
    pass_at_k_per_prompt,
    wilson_interval,
)
from grpolab.batch import Example
from grpolab.engine.base import Sampling
from grpolab.training.eval_loss import batch_loss, eval_loss_applies
from grpolab.training.run import Run
from grpolab.training.step import rollout_and_score
from grpolab.util.fields import ConfigError

EVAL_STREAM = 0x5EED_E7A1
"""Offset of the evaluation's sampling seed from the run's: every evaluation of a run draws the same
random stream (common random numbers: the change between two evaluations is the model's, not the dice's)."""

BOOTSTRAP_RESAMPLES = 2000


def evaluate(
    run: Run,
    examples: list[Example],
    *,
    num_generations: int | None = None,
    temperature: float | None = None,
    ks: list[int] | None = None,
    loss: bool = False,
) -> dict:
    """Score `examples` through run.engine: one greedy completion per prompt (num_generations 0, the
    default of cfg.eval_num_generations) or n sampled ones at `temperature` (cfg.eval_temperature).

    Returns {"accuracy": the mean over prompts of each prompt's mean main reward (a main reward that skips a
    completion, None, leaves it out; a prompt with none scored is left out, its score None), "reward": mean weighted total, "length": mean tokens,
    "n": prompts, "main_reward", "samples_per_prompt", "temperature" (0 = greedy), "accuracy_ci",
    "accuracy_ci_method" (wilson: greedy 0/1 scores; bootstrap: over prompts), "pass@k" {k: {"estimate",
    "ci"}} (unbiased, Chen et al. 2021; ks default 1, 2, 4, ..., n), "extraction" {verifier: shares of
    no_answer / wrong / right} for verifiers with answer_found, "per_prompt" {"id", "correct", "score"}
    (what a paired comparison needs) and, in an environment, "turns"}. {} for no examples. loss: also
    "loss", the training loss of the evaluation's completions (grpolab.training.eval_loss: the mean over its
    chunks, weighted by their completions), where eval_loss_applies.
    """
    if not examples:
        return {}
    cfg = run.cfg
    n_gen = cfg.eval_num_generations if num_generations is None else num_generations
    greedy = n_gen == 0
    G = max(1, n_gen)
    temp = cfg.eval_temperature if temperature is None else temperature
    ks = sorted(set(ks)) if ks else default_ks(G)
    if ks[0] < 1 or ks[-1] > G:
        raise ConfigError(f"k: every k must be between 1 and the samples per prompt ({G}); got {ks}")
    sampling = Sampling(run.sampling.max_new_tokens, temp, cfg.top_p, greedy)  # no top-k, min-p or penalty
    generator = torch.Generator(device=run.device)
    generator.manual_seed((cfg.seed * 1_000_003 + EVAL_STREAM) % 2**63)
    main, threshold = run.main_reward, cfg.eval_pass_threshold
    checks = {f.name: f.fn.answer_found for f in run.reward_fns if callable(getattr(f.fn, "answer_found", None))}
    chunk_size = cfg.eval_batch if greedy else max(1, cfg.eval_batch // G)
    totals, lengths, turns, truncated = [], [], [], []
    per_fn: dict[str, list[float]] = {f.name: [] for f in run.reward_fns}
    correct, score = [], []
    losses: list[tuple[float, int]] = []  # (a chunk's loss, its completions)
    loss = loss and eval_loss_applies(run)
    shares = {name: [0, 0, 0] for name in checks}  # no_answer, wrong, right
    for s in range(0, len(examples), chunk_size):
        chunk = examples[s : s + chunk_size]
        rollout, scores, info = rollout_and_score(
            run, chunk, G=G, generator=generator, sampling=sampling
        )  # multi-turn in an environment too
        if "env/turns_mean" in info:
            turns.append((info["env/turns_mean"], len(chunk)))
        if loss:
            losses.append(batch_loss(run, chunk, rollout, scores))
        totals += scores.total
        skipped = set(scores.none.get(main, ()))  # a TRL-form main reward that does not apply: left out
        per = scores.per_fn[main]
        lengths += rollout.lengths.tolist()
        truncated += rollout.truncated.tolist()
        for name, values in per_fn.items():
            values += [float(x) for x in scores.per_fn.get(name, ()) if x is not None and x == x]
        for j in range(len(chunk)):
            rows = [i for i in range(j * G, (j + 1) * G) if i not in skipped]
            correct.append(sum(1 for i in rows if per[i] >= threshold))
            score.append(sum(per[i] for i in rows) / len(rows) if rows else None)  # None: nothing scored
        for name, found in checks.items():
            for i, text in enumerate(rollout.texts):
                ok = scores.per_fn[name][i] >= threshold
                shares[name][2 if ok else 1 if found(text, chunk[i // G]) else 0] += 1
    scored = [x for x in score if x is not None]  # the prompts with a scored completion
    out = {
        "accuracy": sum(scored) / len(scored) if scored else None,  # per-prompt mean: what its interval is of
        "reward": sum(totals) / len(totals),
        "length": sum(lengths) / len(lengths),
        "n": len(examples),
        "main_reward": main,
        "accuracy_is_share": all(0.0 <= x <= 1.0 for x in scored),
        "reward_std": _std(totals),
        "length_min": min(lengths),
        "length_max": max(lengths),
        "truncated_frac": sum(truncated) / len(truncated),
        **ended_lengths(lengths, truncated),
        "zero_std_frac": sum(len(set(totals[i : i + G])) == 1 for i in range(0, len(totals), G)) / len(examples),
        "rewards": {name: {"mean": _mean(v), "std": _std(v)} for name, v in per_fn.items()},
    }
    if losses:
        out["loss"] = sum(value * n for value, n in losses) / sum(n for _, n in losses)
    if turns:  # in an environment: model turns per trajectory
        out["turns"] = sum(t * n for t, n in turns) / len(examples)
    out["samples_per_prompt"] = G
    out["temperature"] = 0.0 if greedy else float(temp)
    c = np.asarray(correct)
    binary = greedy and all(x in (0.0, 1.0) for x in scored)
    if not scored:  # the main reward skipped every completion: no accuracy to estimate
        out["accuracy_ci"], out["accuracy_ci_method"] = None, None
    elif binary:
        out["accuracy_ci"], out["accuracy_ci_method"] = list(wilson_interval(sum(scored), len(scored))), "wilson"
    else:
        out["accuracy_ci"] = list(bootstrap_interval(scored, resamples=BOOTSTRAP_RESAMPLES, seed=cfg.seed))
        out["accuracy_ci_method"] = "bootstrap"
    out["pass@k"] = {}
    for k in ks:
        per_prompt = pass_at_k_per_prompt(G, c, k)
        ci = (
            wilson_interval(int(c.sum()), len(c))
            if G == 1
            else bootstrap_interval(per_prompt, resamples=BOOTSTRAP_RESAMPLES, seed=cfg.seed)
        )
        out["pass@k"][str(k)] = {"estimate": float(per_prompt.mean()), "ci": list(ci)}
    out["extraction"] = {
        name: {"no_answer": a / sum(v), "wrong": b / sum(v), "right": r / sum(v)}
        for name, v in shares.items()
        for a, b, r in [v]
    }
    out["per_prompt"] = {"id": [e.id for e in examples], "correct": correct, "score": score}
    return json.loads(json.dumps(out))  # plain JSON types: what summary.json holds reads back equal


def ended_lengths(lengths: list[int], truncated: list[bool]) -> dict:
    """The mean, shortest and longest length of the completions that ended (EOS), 0 each when none did (TRL's
    completions/*_terminated_length)."""
    ended = [n for n, t in zip(lengths, truncated) if not t]
    if not ended:
        return {"ended_length_mean": 0.0, "ended_length_min": 0.0, "ended_length_max": 0.0}
    return {
        "ended_length_mean": sum(ended) / len(ended),
        "ended_length_min": min(ended),
        "ended_length_max": max(ended),
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float:
    """The sample standard deviation, sqrt(sum (x - mean)^2 / (n - 1)) (TRL's reward_std); 0 below two values."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def eval_metrics(res: dict) -> dict:
    """The flat eval/ keys of one evaluation for a metrics row: eval/accuracy (+ _lo, _hi: its 95%
    interval), eval/reward, eval/length, eval/pass@K (+ _lo, _hi), eval/extract/NAME/{no_answer,
    wrong,right}, eval/prompts, eval/samples_per_prompt (and eval/turns in an environment)."""
    if not res:
        return {}
    m = {
        "eval/accuracy": res["accuracy"],
        "eval/accuracy_lo": (res["accuracy_ci"] or [None])[0],
        "eval/accuracy_hi": (res["accuracy_ci"] or [None, None])[1],
        "eval/reward": res["reward"],
        "eval/length": res["length"],
        "eval/prompts": res["n"],
        "eval/samples_per_prompt": res["samples_per_prompt"],
    }
    if "turns" in res:
        m["eval/turns"] = res["turns"]
    if "loss" in res:
        m["eval/loss"] = res["loss"]
    keys = ("reward_std", "length_min", "length_max", "truncated_frac", "zero_std_frac")
    for key in (*keys, "ended_length_mean", "ended_length_min", "ended_length_max"):
        if key in res:  # evaluations recorded before these were kept have none
            m[f"eval/{key}"] = res[key]
    for name, stats in res.get("rewards", {}).items():
        m[f"eval/reward/{name}/mean"], m[f"eval/reward/{name}/std"] = stats["mean"], stats["std"]
    for k, v in res["pass@k"].items():
        m[f"eval/pass@{k}"], m[f"eval/pass@{k}_lo"], m[f"eval/pass@{k}_hi"] = v["estimate"], *v["ci"]
    for name, shares in res["extraction"].items():
        for kind, share in shares.items():
            m[f"eval/extract/{name}/{kind}"] = share
    return m


def is_share(res: dict) -> bool:
    """Whether an evaluation's accuracy is a share (every main-reward score in [0, 1]), so that it reads as a
    percentage; a reward that scores outside it (negative, above 1) has a mean score instead. An evaluation
    recorded before this was kept is judged by its accuracy alone."""
    acc = res.get("accuracy")
    in_range = not isinstance(acc, (int, float)) or 0.0 <= acc <= 1.0
    return bool(res.get("accuracy_is_share", True)) and in_range


def compare(before: dict | None, after: dict | None, seed: int = 0) -> dict | None:
    """The paired change from `before` to `after` (two evaluate() results on the same prompts, in the same
    order): for the accuracy (per-prompt mean main reward) and each pass@k both report, the paired
    bootstrap interval of the per-prompt differences (McNemar's exact test for greedy 0/1 scores) and a
    sentence. None when either is missing or the prompts differ."""
    if not before or not after or "per_prompt" not in before or "per_prompt" not in after:
        return None
    pb, pa = before["per_prompt"], after["per_prompt"]
    if pb["id"] != pa["id"]:
        return None
    both = [(b, a) for b, a in zip(pb["score"], pa["score"]) if b is not None and a is not None]
    out = {
        "accuracy": paired_comparison(
            [b for b, _ in both], [a for _, a in both], resamples=BOOTSTRAP_RESAMPLES, seed=seed
        )
    }
    share = is_share(before) and is_share(after)  # a score outside [0, 1] is no percentage
    out["accuracy"]["sentence"] = describe_change(
        f"held-out {'accuracy' if share else 'mean score'} ({before['main_reward']})", out["accuracy"], percent=share
    )
    nb, na = before["samples_per_prompt"], after["samples_per_prompt"]
    for k in sorted(set(before.get("pass@k", {})) & set(after.get("pass@k", {})), key=int):
        cmp = paired_comparison(
            pass_at_k_per_prompt(nb, pb["correct"], int(k)),
            pass_at_k_per_prompt(na, pa["correct"], int(k)),
            resamples=BOOTSTRAP_RESAMPLES,
            seed=seed,
        )
        cmp["sentence"] = describe_change(f"pass@{k}", cmp)
        out[f"pass@{k}"] = cmp
    return json.loads(json.dumps(out))


class Evaluator:
    """When a training run evaluates, and what follows from it.

    at_start(prior) before step 1 (`prior`: a resumed run's recorded evaluation, not redone),
    due(step) / evaluate_at(step) in the loop (every eval_steps steps and at the last one), final()
    after it. evaluate_at is the one place where "an evaluation happened": it logs nothing itself
    but returns the eval/ metrics for the step's row, keeps the best model (save_best) and decides
    the stop (eval_stop_at), then calls `on_evaluate(step, metrics, result)` when set.
    Every rank calls these (FSDP gathers the policy for rank 0's evaluation); rank 0 alone has the
    held-out set and evaluates.
    """

    def __init__(
        self, run: Run, eval_set: list[Example], logger, on_evaluate: Callable[[int, dict, dict], None] | None = None
    ):
        self.run, self.eval_set, self.logger, self.on_evaluate = run, eval_set, logger, on_evaluate
        cfg = run.cfg
        self.metric = cfg.save_best or "eval/accuracy"
        self.higher = higher_is_better(self.metric, cfg.save_best_higher)
        self.last: dict | None = None
        self.last_step = -1
        self.stop_reason: str | None = None
        self.best = _read_best(run.out) if cfg.save_best else None

    @property
    def every(self) -> int:
        return self.run.cfg.eval_steps

    def due(self, step: int) -> bool:
        """Evaluate after `step`: every eval_steps steps and at the last one (only when eval_steps > 0), from
        step eval_delay on (transformers' DefaultFlowCallback: global_step % eval_steps == 0, or the last step,
        and eval_delay <= global_step)."""
        cfg = self.run.cfg
        on_schedule = self.every > 0 and (step % self.every == 0 or step == cfg.steps)
        return on_schedule and cfg.eval_size > 0 and step >= cfg.eval_delay

    def at_start(self, prior: dict | None) -> dict | None:
        """The evaluation before training (step 0): `prior` when the run recorded it, else measured; with
        eval_steps > 0 also a metrics row {"step": 0, eval/...}."""
        if prior is not None or not self.run.cfg.eval_size:
            return prior
        if self.eval_set:
            self.run.log(f"evaluating {len(self.eval_set)} held-out prompts before training ({self.describe()})...")
        res = self.evaluate_at(0)
        if self.every > 0 and res:
            self.logger.log({"step": 0, **res})
        return self.last

    def describe(self) -> str:
        cfg = self.run.cfg
        n = cfg.eval_num_generations
        return "greedy" if n == 0 else f"{n} samples per prompt at temperature {cfg.eval_temperature:g}"

    def evaluate_at(self, step: int) -> dict:
        """Evaluate the current policy after `step` (0: before training). Returns the eval/ metrics (empty
        on ranks other than 0); records the best model and the stop decision."""
        from grpolab.parallel import distributed
        from grpolab.parallel import fsdp as sharding

        loss = self.metric == "eval/loss"  # measured when it ranks the evaluations
        # FSDP: rank 0's evaluation unsharded; vLLM sharded over processes: rank 0's calls served by its group
        with sharding.gathered(self.run.policy), self.run.engine.together():  # every rank enters both
            res = evaluate(self.run, self.eval_set, loss=loss) if self.eval_set else {}
        self.last, self.last_step = res or None, step
        metrics = eval_metrics(res)
        if res and self.run.cfg.save_best and self.metric not in metrics:
            raise ConfigError(missing_metric(self.metric, metrics))
        value = metrics.get(self.metric)
        better = value is not None and (self.best is None or improves(value, self.best["value"], self.higher))
        if self.run.cfg.save_best and better:
            self.best = {"step": step, "metric": self.metric, "value": value}
            save_best_model(self.run, self.best)
            metrics["eval/best"] = value
        stop_at = self.run.cfg.eval_stop_at
        reached = stop_at is not None and step > 0 and value is not None and not improves(stop_at, value, self.higher)
        if distributed.global_counts(self.run.ranks, 1.0 if reached else 0.0)[0]:
            self.stop_reason = (
                f"{self.metric} = {value:.4g} reached eval_stop_at={stop_at:g} after step {step}"
                if reached
                else f"eval_stop_at reached after step {step} (rank 0)"
            )
        if self.on_evaluate is not None and res:
            self.on_evaluate(step, metrics, res)
        return metrics

    def final(self, steps: int) -> dict | None:
        """The evaluation after training: the last one when it was at the final step, else measured now."""
        if self.last_step == steps or (self.stop_reason and self.last_step > 0):
            return self.last
        if not self.run.cfg.eval_size:
            return None
        if self.eval_set:
            self.run.log(f"evaluating {len(self.eval_set)} held-out prompts after training ({self.describe()})...")
        self.evaluate_at(steps)
        return self.last


BEST = "best"


def higher_is_better(metric: str, setting: bool | None) -> bool:
    """Whether a higher `metric` is the better model: `setting` (save_best_higher) where given, else higher
    unless the name ends in loss (transformers' greater_is_better default)."""
    return not metric.endswith("loss") if setting is None else bool(setting)


def improves(value: float, best: float, higher: bool) -> bool:
    """value > best where higher is better, value < best otherwise (ties keep the earlier model, as
    transformers' _determine_best_metric keeps it)."""
    return value > best if higher else value < best


def missing_metric(metric: str, metrics: dict) -> str:
    """The error of a save_best metric that this run's evaluation does not log, naming the ones it does."""
    why = (
        " (the evaluation's loss is measured only where the training loss needs no reference or critic: "
        "algo.beta=0, no adaptive KL, no critic)"
        if metric == "eval/loss"
        else ""
    )
    logged = ", ".join(k for k in sorted(metrics) if k not in ("eval/prompts", "eval/samples_per_prompt"))
    return f"save_best: this run's evaluation logs no {metric}{why}; it logs {logged}"


def _read_best(out: Path) -> dict | None:
    """The best so far of a resumed run (OUT/checkpoints/best/best.json), None if there is none."""
    try:
        return json.loads((Path(out) / "checkpoints" / BEST / "best.json").read_text())
    except (OSError, ValueError):
        return None


def save_best_model(run: Run, best: dict) -> Path | None:
    """OUT/checkpoints/best: the policy's weights (or adapter) and tokenizer, with best.json ({step,
    metric, value}), replaced atomically (grpolab.training.checkpoint.save_model_copy). Rank 0 only."""
    if not run.ranks.main:
        return None
    from grpolab.training.checkpoint import save_model_copy

    path = save_model_copy(run.out, BEST, run.policy, run.tokenizer, {"best.json": json.dumps(best, indent=2)})
    run.log(f"best {best['metric']} so far: {best['value']:.4g} at step {best['step']} -> {path}")
    return path


def summary_fields(before: dict | None, after: dict | None, evaluator: Evaluator | None, seed: int) -> dict:
    """What summary.json adds about the evaluation: the paired change (eval_change), the best model
    (best) and an early stop (stopped_early)."""
    out: dict = {}
    change = compare(before, after, seed)
    if change is not None:
        out["eval_change"] = change
    if evaluator is not None and evaluator.best is not None:
        out["best"] = {**evaluator.best, "path": str(Path(evaluator.run.out) / "checkpoints" / BEST)}
    if evaluator is not None and evaluator.stop_reason:
        out["stopped_early"] = {"step": evaluator.last_step, "reason": evaluator.stop_reason}
    return out


__all__ = [
    "BEST",
    "Evaluator",
    "compare",
    "eval_metrics",
    "evaluate",
    "higher_is_better",
    "improves",
    "save_best_model",
    "summary_fields",
]
