"""`grpolab audit`: a pre-flight check of a task, a model and a config, before spending hours.

    grpolab audit [RECIPE] [KEY=VALUE ...] [--prompts 16]

It measures, on a sample of training prompts and with the config's own G, max_new_tokens, temperature
and verifiers:
  * gold:      the task's reference answers through the verifiers (a gold answer whose main verifier
               score is below 1 is an error, printed with its example);
  * pass@1 and pass@G of the base model (sampled, as in training);
  * the share of groups whose rewards are all equal (no learning signal), observed, and expected at
    other G from each prompt's success rate, smoothed as (k + 1/2) / (G + 1);
  * the truncation rate at max_new_tokens;
  * the point-biserial correlation of completion length with the main verifier's score (a positive one
    says longer answers are more often right: length can be expected to rise);
  * in an environment (env.name): turns and tool calls per trajectory, the share of written tool calls
    that parse, and how trajectories stopped; success is then any reward from the environment when its
    reward is the main one;
  * a suggested G and max_new_tokens, with the reason.
Exit status 1 when a run would learn nothing (every sampled group has equal rewards) or a gold answer
fails its verifier; 0 otherwise.
"""

from __future__ import annotations

import argparse
import math
import random
import time

# Renderings of a gold answer tried in turn: a task's verifier may want the bare answer, tags or a box.
GOLD_RENDERINGS = (
    ("bare", "{a}"),
    ("answer tags", "<think>\n</think>\n<answer>{a}</answer>"),
    ("boxed", "The answer is \\boxed{{{a}}}."),
    ("gsm8k", "#### {a}"),
    ("code block", "```python\n{a}\n```"),
)


def check_gold(fns, examples, timeout_s: float, workers: int, thread: str = "workers") -> tuple[list[dict], list[str]]:
    """For each example, the first rendering of its answer that the main verifier scores 1, or a failure
    record. Returns (failures, renderings used)."""
    from grpolab.rewards import score_completions
    from grpolab.training.run import main_reward

    main = main_reward(fns)
    pending = list(range(len(examples)))
    used: list[str] = []
    best: dict[int, float] = {}
    for label, fmt in GOLD_RENDERINGS:
        if not pending:
            break
        texts = [fmt.format(a=examples[i].answer) for i in pending]
        scores = score_completions(
            fns, texts, [examples[i] for i in pending], timeout_s=timeout_s, workers=workers, thread=thread
        )
        still = []
        for i, s in zip(pending, scores.per_fn[main]):
            best[i] = max(best.get(i, 0.0), float(s))
            if s >= 1.0:
                used.append(label)
            else:
                still.append(i)
        pending = still
    failures = [
        {
            "id": examples[i].id,
            "prompt": examples[i].prompt[:200],
            "answer": examples[i].answer[:200],
            "best_score": best.get(i, 0.0),
        }
        for i in pending
    ]
    return failures, sorted(set(used))


def expected_zero_var(ps: list[float], G: int) -> float:
    """Expected share of groups of G whose 0/1 rewards are all equal, for per-prompt success rates ps."""
    return sum(p**G + (1 - p) ** G for p in ps) / len(ps) if ps else float("nan")


def point_biserial(lengths: list[float], ok: list[float]) -> float:
    from grpolab.training.diagnostics import pearson

    return pearson(lengths, ok)


def suggest_G(ps: list[float], G: int) -> tuple[int, str]:
    """The smallest G in 4..64 whose expected zero-variance share is at most 0.5, with the reason."""
    if all(p == 0 for p in ps):
        return G, (
            "no sampled completion was right: a larger G cannot be judged from this sample; make the task "
            "easier, use a stronger model, or audit more prompts"
        )
    if all(p == 1 for p in ps):
        return G, "every sampled completion was right: the task is too easy for this model; make it harder"
    for g in (4, 8, 16, 32, 64):
        if expected_zero_var(ps, g) <= 0.5:
            why = (
                f"expected zero-variance share {expected_zero_var(ps, g):.2f} at G={g} (at most half the groups wasted)"
            )
            return g, why
    return 64, f"even at G=64 the expected zero-variance share is {expected_zero_var(ps, 64):.2f}"


def suggest_max_new_tokens(lengths: list[float], truncated: float, current: int) -> tuple[int, str]:
    if truncated > 0.1:
        return 2 * current, f"{truncated:.0%} of completions hit the limit: the final answer is often cut off"
    longest = max(lengths) if lengths else current
    if truncated == 0 and longest < current / 2:
        s = max(16, int(math.ceil(longest * 1.5 / 16)) * 16)
        if s < current:
            return s, f"no completion was cut off and the longest was {longest:.0f} tokens (faster rollouts)"
    return current, f"{truncated:.0%} truncated: the limit fits"


def env_summary(infos: list[tuple[dict, int]]) -> dict:
    """In an environment: turns per trajectory, tool calls per trajectory, the share of tool calls that
    parse, and how trajectories stopped (the env/* metrics of the audit's rollouts, weighted by size)."""
    n = sum(k for _, k in infos)

    def mean(key: str) -> float:
        return sum(i.get(key, 0.0) * k for i, k in infos) / n

    calls = sum(i.get("env/tool_calls_mean", 0.0) * k for i, k in infos)
    parse_errors = sum(i.get("env/errors_parse", 0.0) for i, _ in infos)
    out = {
        "turns_mean": mean("env/turns_mean"),
        "tool_calls_mean": calls / n,
        "calls_parsed": calls / (calls + parse_errors) if calls + parse_errors else None,
    }
    out.update(
        {k.removeprefix("env/"): mean(k) for k in {k for i, _ in infos for k in i if k.startswith("env/stopped_")}}
    )
    return out


def env_rows(env: dict | None) -> list[list]:
    """The audit table's rows for an environment run (none for single-turn)."""
    if env is None:
        return []
    stops = ", ".join(
        f"{k.removeprefix('stopped_')} {v:.0%}" for k, v in sorted(env.items()) if k.startswith("stopped_")
    )
    parsed = "no call written" if env["calls_parsed"] is None else f"{env['calls_parsed']:.0%} of written calls parse"
    return [
        ["turns per trajectory", env["turns_mean"], f"stopped: {stops}"],
        ["tool calls per trajectory", env["tool_calls_mean"], parsed],
    ]


def unbounded_user_code(cfg, reward_fns) -> list[str]:
    """Warnings for user code the model's output drives that runs without a hard time bound: reward functions
    of the user's with reward_process=false, an environment's tools without env.tool_process (a backtracking
    regex or `10 ** int(digits)` on the model's text holds the GIL: no thread can stop it; docs/security.md)."""
    out = []
    mine = [f.name for f in reward_fns if getattr(f, "user", False)]
    if mine and not cfg.reward_process:
        out.append(
            f"reward functions {', '.join(mine)} run in this process: reward_timeout_s cannot stop one that holds "
            "the GIL on the model's text (a backtracking regex, 10 ** int(digits)); reward_process=true bounds them"
        )
    if cfg.env.enabled and not cfg.env.tool_process:
        out.append(
            "the environment's tools run in threads: env.tool_timeout_s cannot stop a call that holds the GIL; "
            "env.tool_process=true bounds tool calls (tool functions and environment classes)"
        )
    return out


def audit(cfg, n_prompts: int = 16, log=print) -> dict:
    """Measure everything listed in the module docstring. Returns the numbers and `ok`."""
    from grpolab.app.lab.tables import table
    from grpolab.training.agents import ENV_REWARD
    from grpolab.training.step import rollout_and_score
    from grpolab.training.trainer import setup

    t0 = time.perf_counter()
    run = setup(cfg, training=False, log=log)
    main = run.main_reward
    examples = run.task.sample(n_prompts, random.Random(f"grpolab/app/audit/{cfg.seed}"))
    verifiers = [f for f in run.reward_fns if f.name != ENV_REWARD]  # the environment's reward needs a rollout
    failures, renderings = (
        check_gold(verifiers, examples, cfg.reward_timeout_s, cfg.reward_workers, cfg.reward_thread)
        if verifiers
        else ([], [])
    )
    in_env = run.environments is not None
    # success of one sample: the main reward at 1; in an environment whose reward is the main one, any
    # reward at all (e.g. retry_arithmetic pays less than 1 for a right answer after feedback)
    success = (lambda x: x > 0.0) if main == ENV_REWARD else (lambda x: x >= 1.0)
    env_infos = []
    G = cfg.G
    import torch

    gen = torch.Generator(device=run.device).manual_seed(cfg.seed)
    oks, totals, lengths, trunc = [], [], [], []
    for s in range(0, len(examples), max(1, cfg.batch_size // G)):
        chunk = examples[s : s + max(1, cfg.batch_size // G)]
        rollout, sc, info = rollout_and_score(run, chunk, G=G, generator=gen)
        env_infos.append((info, len(rollout.texts)))
        oks += [1.0 if success(x) else 0.0 for x in sc.per_fn[main]]
        totals += list(sc.total)
        lengths += rollout.lengths.tolist()
        trunc += rollout.truncated.float().tolist()
    groups_ok = [oks[i : i + G] for i in range(0, len(oks), G)]
    groups_tot = [totals[i : i + G] for i in range(0, len(totals), G)]
    ps = [sum(g) / len(g) for g in groups_ok]
    # each prompt's success rate for the expectations at other G: (k + 1/2) / (G + 1), so that 0 right
    # out of G samples reads as "rare", not "impossible" (a raw 0 would make every G look hopeless)
    ps_s = [(sum(g) + 0.5) / (len(g) + 1) for g in groups_ok]
    zero_var = sum(max(g) - min(g) < 1e-9 for g in groups_tot) / len(groups_tot)
    truncated = sum(trunc) / len(trunc)
    corr = point_biserial(lengths, oks)
    g_sug, g_why = suggest_G(ps, G) if all(p == 0 for p in ps) or all(p == 1 for p in ps) else suggest_G(ps_s, G)
    # the length limit that cuts a sample: max_new_tokens, or in an environment the budget of a trajectory
    limit_key = "env.max_model_tokens" if in_env else "max_new_tokens"
    t_sug, t_why = suggest_max_new_tokens(lengths, truncated, cfg.max_completion_tokens)
    res = {
        "task": cfg.task,
        "model": cfg.model,
        "G": G,
        "max_new_tokens": cfg.max_new_tokens,
        "prompts": len(examples),
        "main_reward": main,
        "gold_failures": failures,
        "gold_renderings": renderings,
        "pass@1": sum(oks) / len(oks),
        f"pass@{G}": sum(max(g) for g in groups_ok) / len(groups_ok),
        "zero_var_frac": zero_var,
        "expected_zero_var": {g: expected_zero_var(ps_s, g) for g in (4, 8, 16, 32)},
        "truncated_frac": truncated,
        "length_mean": sum(lengths) / len(lengths),
        "length_reward_corr": corr,
        "suggested_G": g_sug,
        "suggested_G_reason": g_why,
        "suggested_max_new_tokens": t_sug,
        "suggested_max_new_tokens_reason": t_why,
    }
    if in_env:
        res["env"] = env_summary(env_infos)
    problems = []
    if failures:
        problems.append(
            f"{len(failures)} of {len(examples)} gold answers score < 1 through `{main}`: the verifier "
            f"and the task disagree (first: id {failures[0]['id']}, answer {failures[0]['answer']!r}, "
            f"score {failures[0]['best_score']:g})"
        )
    if zero_var >= 1.0:
        problems.append(f"every sampled group of G={G} has equal rewards: GRPO would get no signal at all")
    res["problems"] = problems
    res["ok"] = not problems
    res["time_s"] = time.perf_counter() - t0
    rows = [
        [
            "gold answers score 1",
            f"{len(examples) - len(failures)}/{len(examples)}",
            "via " + ", ".join(renderings) if renderings else "none passed",
        ],
        ["pass@1", res["pass@1"], f"{len(oks)} sampled completions, T={cfg.temperature:g}"],
        [f"pass@{G}", res[f"pass@{G}"], "share of prompts with a right completion"],
        [
            "zero-variance groups",
            zero_var,
            "observed; expected at G=4/8/16/32 (rates smoothed): "
            + "/".join(f"{v:.2f}" for v in res["expected_zero_var"].values()),
        ],
        [
            "truncated",
            truncated,
            (f"cut by env.max_turn_tokens={cfg.env.max_turn_tokens} or " if in_env else "at ")
            + f"{limit_key}={cfg.max_completion_tokens}; mean length {res['length_mean']:.1f}",
        ],
        ["length~correct corr", corr, "point-biserial; > 0: longer answers are more often right"],
        *env_rows(res.get("env")),
        ["suggested G", g_sug, g_why],
        [f"suggested {limit_key}", t_sug, t_why],
    ]
    log(f"audit: task={cfg.task} model={cfg.model} G={G} on {len(examples)} prompts ({res['time_s']:.0f} s)")
    values = table(["check", "value"], [r[:2] for r in rows]).splitlines()
    log("\n".join(f"{v}  {r[2]}" for v, r in zip(values, [["", "", "note"]] + rows)))
    for p in problems:
        log(f"error: {p}")
    for f in failures[:3]:
        log(f"  gold failure: {f}")
    res["warnings"] = unbounded_user_code(cfg, run.reward_fns)
    for w in res["warnings"]:
        log(f"warning: {w}")
    log("verdict: " + ("ready to train" if res["ok"] else "a run would learn nothing or score wrongly; fix the above"))
    return res


def main(argv: list[str]) -> int:
    from grpolab.training.config import build_config
    from grpolab.training.recipe import load_recipe

    ap = argparse.ArgumentParser(
        prog="grpolab audit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=16, help="training prompts sampled (default 16)")
    ap.add_argument("args", nargs="*", help="[RECIPE] KEY=VALUE ... as for grpolab train")
    ns = ap.parse_intermixed_args(argv)
    args = list(ns.args)
    recipe = load_recipe(args.pop(0)) if args and "=" not in args[0] else {}
    cfg = build_config(recipe, args)
    res = audit(cfg, n_prompts=max(1, ns.prompts))
    return 0 if res["ok"] else 1
