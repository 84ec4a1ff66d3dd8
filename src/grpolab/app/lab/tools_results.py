"""Reading the runs of `grpolab lab tools` (grpolab.app.lab.tools): each trajectory classified (did it call
the tool, is its final answer the tool's result), one row per step from metrics.jsonl and samples.jsonl, the
blocks of steps, the verdicts with their numbers, and the curves."""

from __future__ import annotations

from pathlib import Path


def classify(conversation: list[dict]) -> dict:
    """One trajectory: did it call the tool, is its final answer the tool's (last) result, its turns."""
    from grpolab.env.builtin import final_answer
    from grpolab.env.calls import has_tool_call

    results = [m.get("content", "") for m in conversation if m.get("role") == "tool"]
    turns = [m.get("content", "") for m in conversation if m.get("role") == "assistant"]
    final = turns[-1] if turns else ""
    answer = None if has_tool_call(final) else final_answer(final)  # a last turn that calls answers nothing
    tool_value = final_answer(results[-1]) if results else None
    return {
        "called": bool(results),
        "uses": answer is not None and tool_value is not None and answer == tool_value,
        "turns": len(turns),
    }


def per_step(metrics: list[dict], samples: list[dict]) -> list[dict]:
    """One row per step: the run's metrics and, from every trajectory of the step (samples.jsonl), the
    shares that call the tool and whose final answer is its result, overall and by kind of problem."""
    from grpolab.app.lab.miniature import mean

    by_step: dict[int, list[tuple[str, dict, float | None]]] = {}
    for s in samples:
        a, b = (int(x) for x in s["prompt"].rstrip("=").split("+"))
        kind = "easy" if max(a, b) < 10 else "hard"
        by_step.setdefault(int(s["step"]), []).append(
            (kind, classify(s.get("conversation") or []), (s.get("rewards") or {}).get("math"))
        )
    rows = []
    for m in metrics:
        cs = by_step.get(int(m["step"]), [])
        called = [c for _, c, _ in cs if c["called"]]

        def share(items, key):
            return sum(c[key] for c in items) / len(items) if items else float("nan")

        rows.append(
            {
                "step": int(m["step"]),
                "reward": m.get("reward/mean"),
                "right": m.get("reward/math/mean"),
                "calls": share([c for _, c, _ in cs], "called"),
                "uses": share([c for _, c, _ in cs], "uses"),
                "uses_if_called": share(called, "uses"),
                "turns": m.get("env/turns_mean"),
                "tokens": m.get("lab/model_tokens_mean", m.get("completion/length_mean")),
                "length_metric": m.get("completion/length_mean"),
                "calls_easy": share([c for k, c, _ in cs if k == "easy"], "called"),
                "calls_hard": share([c for k, c, _ in cs if k == "hard"], "called"),
                "right_easy": mean([r for k, _, r in cs if k == "easy"]),
                "result_logp": m.get("lab/result_logp", float("nan")),
                "env_token_share": m.get("lab/env_token_share", 0.0),
            }
        )
    return rows


def summary(rows: list[dict], n_blocks: int) -> dict:
    from grpolab.app.lab.miniature import blocks

    bl = blocks(rows, n_blocks)
    return {"blocks": bl, "first": bl[0], "last": bl[-1]}


def numbers(s: dict) -> str:
    f, l = s["first"], s["last"]
    return (
        f"reward {f['reward']:.2f} -> {l['reward']:.2f}, trajectories that call the tool {f['calls']:.0%} -> "
        f"{l['calls']:.0%}, final answer = the tool's result {f['uses']:.0%} -> {l['uses']:.0%} "
        f"({f['uses_if_called']:.0%} -> {l['uses_if_called']:.0%} of those that call), turns "
        f"{f['turns']:.2f} -> {l['turns']:.2f} (first vs last block)"
    )


def verdict(s: dict) -> str:
    f, l = s["first"], s["last"]
    if l["reward"] - f["reward"] > 0.05 and l["calls"] - f["calls"] > 0.05:
        return f"holds here: tool use rose with reward: {numbers(s)}"
    return f"does not hold here: {numbers(s)}"


def samples_at(samples: list[dict], step: int, k: int = 4) -> list[str]:
    """The step's first k trajectories as one line each: prompt, then turns and results as the model saw them."""
    out = []
    for s in [s for s in samples if s["step"] == step][:k]:
        parts = [
            m["content"] if m["role"] == "assistant" else f"<tool_response>{m['content']}</tool_response>"
            for m in s.get("conversation") or []
        ]
        out.append(f"{s['prompt']}{' | '.join(parts)}   (reward {s['reward']:g})")
    return out


def ablation_verdict(arms: dict, cost: float) -> str:
    """The ablation's verdict in one line; `cost`: the price per call of the cost_per_call arms."""
    c, b, w = arms["calc"], arms["broken_tool"], arms["env_tokens_in_loss"]
    parts = []
    db = b["last"]["calls"] - b["first"]["calls"]
    parts.append(
        f"broken tool: calls {b['first']['calls']:.0%} -> {b['last']['calls']:.0%} "
        f"({'do not rise' if db <= 0.05 else 'rise'}; reward {b['first']['reward']:.2f} -> "
        f"{b['last']['reward']:.2f}) against {c['first']['calls']:.0%} -> {c['last']['calls']:.0%} "
        f"with the working one"
    )
    for name, algo in (("cost_per_call", "grpo"), ("cost_per_call_dr_grpo", "dr_grpo")):
        k = arms[name]
        de, dh = (k["last"][x] - k["first"][x] for x in ("calls_easy", "calls_hard"))
        parts.append(
            f"cost {cost:g} per call, {algo}: calls on one-digit sums {k['first']['calls_easy']:.0%} -> "
            f"{k['last']['calls_easy']:.0%} ({'fall' if de < -0.05 else 'rise' if de > 0.05 else 'flat'}), "
            f"on three-digit sums {k['first']['calls_hard']:.0%} -> {k['last']['calls_hard']:.0%} "
            f"({'rise' if dh > 0.05 else 'fall' if dh < -0.05 else 'flat'})"
        )
    parts.append(
        f"tool results in the loss (THE WRONG SETTING; {w['last']['env_token_share']:.0%} of the loss's tokens "
        f"are the calculator's): the policy's log-prob of the result tokens ends at "
        f"{w['last']['result_logp']:.2f} nats/token against {c['last']['result_logp']:.2f} masked (from "
        f"{c['first']['result_logp']:.2f}): the update trains the model to predict text it never writes; "
        f"the logged length reads {w['last']['length_metric']:.1f} tokens where the model wrote "
        f"{w['last']['tokens']:.1f}; reward {w['last']['reward']:.2f} vs {c['last']['reward']:.2f} masked, calls "
        f"{w['last']['calls']:.0%} vs {c['last']['calls']:.0%}, final answer = the result {w['last']['uses']:.0%} "
        f"vs {c['last']['uses']:.0%} (last block)"
    )
    return "ablation: " + "; ".join(parts)


def plot(arms: dict[str, list[dict]], path: Path) -> str | None:
    from grpolab.app.lab.miniature import plot_curves

    return plot_curves(
        arms,
        path,
        [
            ("reward", "reward", "reward/mean"),
            ("calls", "trajectories that call the tool", "share"),
            ("uses", "final answer = the tool's result", "share"),
        ],
    )
