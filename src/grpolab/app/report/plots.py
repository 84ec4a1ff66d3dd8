"""The report's plots: matplotlib figures (object API, Agg canvas) saved as PNG bytes, one per panel.

Every curve is drawn twice: the per-step values thin and faint, and a trailing mean over
`window(n)` steps bold on top. One run: one colour per series. Several runs: one colour per run and
one line style per series, so their curves overlay.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass

from grpolab.app.report.load import RunData

STYLES = ["-", "--", ":", "-."]


class MissingPlotting(RuntimeError):
    """matplotlib is not installed (it is the `report` extra)."""


def _matplotlib():
    """matplotlib, used through its object API (Figure + the Agg canvas savefig picks for PNG): no
    pyplot, so the caller's backend and figures (a notebook's, say) are left alone."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401 (checked here: the message below)
    except ImportError as e:
        raise MissingPlotting(
            "grpolab report needs matplotlib: pip install 'grpolab[report]' (or pip install 'matplotlib>=3.7')"
        ) from e
    return matplotlib


def window(n: int) -> int:
    """Smoothing window: a tenth of the run, at least 1 step, at most 25."""
    return max(1, min(25, n // 10))


def smooth(ys: list[float], w: int) -> list[float]:
    """Trailing mean over the last w finite values (NaN where there is none)."""
    out = []
    for i in range(len(ys)):
        part = [y for y in ys[max(0, i - w + 1) : i + 1] if math.isfinite(y)]
        out.append(sum(part) / len(part) if part else float("nan"))
    return out


@dataclass
class Plot:
    """One drawn panel: its PNG (None when no run has its metrics), a caption and the series' names."""

    slug: str
    title: str
    png: bytes | None
    caption: str
    series: list[str]


@dataclass
class Panel:
    slug: str  # file name of the PNG
    title: str
    ylabel: str
    keys: Callable[[list[RunData]], list[tuple[str, str]]]  # runs -> [(metric key, series label)]
    core: bool = True  # shown with a "no data" note when no run has it; False: left out silently
    fill: float | None = None  # a step without the key has this value (counts logged only when non-zero)


def fixed(*pairs: tuple[str, str]) -> Callable[[list[RunData]], list[tuple[str, str]]]:
    return lambda runs: [p for p in pairs if any(p[0] in m for r in runs for m in r.metrics)]


def matching(test: Callable[[str], bool], strip: str = "") -> Callable[[list[RunData]], list[tuple[str, str]]]:
    def keys(runs: list[RunData]) -> list[tuple[str, str]]:
        found = sorted({k for r in runs for m in r.metrics for k in m if test(k)})
        return [(k, k.replace(strip, "", 1) if strip else k) for k in found]

    return keys


def reward_keys(runs: list[RunData]) -> list[tuple[str, str]]:
    """The total, and each verifier's mean when there are several (or one whose weight is not 1)."""
    names = sorted(
        {
            k
            for r in runs
            for m in r.metrics
            for k in m
            if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2
        }
    )
    if len(names) == 1:
        names = [
            k
            for k in names
            if any(
                isinstance(m.get(k), (int, float))
                and isinstance(m.get("reward/mean"), (int, float))
                and abs(m[k] - m["reward/mean"]) > 1e-9
                for r in runs
                for m in r.metrics
            )
        ]
    return [("reward/mean", "total")] + [(k, k.split("/")[1]) for k in names]


def length_keys(runs: list[RunData]) -> list[tuple[str, str]]:
    base = fixed(("completion/length_mean", "mean"), ("completion/length_max", "max"))(runs)
    split = matching(lambda k: "length" in k and "correct" in k and "corr_" not in k)(runs)  # aha/length_correct
    return base + split


def clip_keys(runs: list[RunData]) -> list[tuple[str, str]]:
    pairs = fixed(("clip/low_frac", "low"), ("clip/high_frac", "high"))(runs)
    dual = any((m.get("clip/dual_frac") or 0) > 0 for r in runs for m in r.metrics)
    return pairs + ([("clip/dual_frac", "dual")] if dual else [])


def env_share_keys(runs: list[RunData]) -> list[tuple[str, str]]:
    """The environment's share of the tokens and the stop reasons' shares (multi-turn runs)."""
    tokens = fixed(("env/env_token_frac", "environment tokens"))(runs)
    return tokens + matching(lambda k: k.startswith("env/stopped_"), strip="env/")(runs)


ENV_PANELS = [  # multi-turn runs (docs/agents.md), beside reward and length; left out when no run has them
    Panel(
        "env_turns",
        "Turns and tool calls per trajectory",
        "per trajectory",
        fixed(("env/turns_mean", "model turns"), ("env/tool_calls_mean", "tool calls")),
        core=False,
    ),
    Panel("env_shares", "Environment tokens and stop reasons", "fraction", env_share_keys, core=False),
    Panel(
        "env_errors",
        "Environment errors by kind",
        "count per step",
        matching(lambda k: k.startswith("env/errors_"), strip="env/errors_"),
        core=False,
        fill=0.0,
    ),
    Panel(
        "env_calls",
        "Calls per tool",
        "calls per step",
        matching(lambda k: k.startswith("env/calls/"), strip="env/calls/"),
        core=False,
        fill=0.0,
    ),
]

PANELS = [
    Panel("reward", "Reward (verifiers, before shaping)", "reward", reward_keys),
    Panel("length", "Completion length", "tokens", length_keys),
    Panel("truncated", "Truncation rate", "fraction", fixed(("completion/truncated_frac", "truncated"))),
    Panel("kl", "KL", "nats / token", fixed(("kl", "KL to reference"), ("approx_kl", "approx KL(old || new)"))),
    Panel("entropy", "Entropy", "nats / token", fixed(("entropy", "entropy"))),
    Panel("clip", "Clip fractions", "fraction of tokens", clip_keys),
    Panel("zero_std", "Zero-variance groups", "fraction of groups", fixed(("groups/zero_std_frac", "zero std"))),
    Panel("grad_norm", "Gradient norm (before clipping)", "norm", fixed(("grad_norm", "grad norm"))),
    Panel("lr", "Learning rate", "lr", fixed(("lr", "lr"))),
    Panel(
        "reflection",
        "Reflection phrases",
        "per step",
        matching(lambda k: "reflect" in k and "frac" not in k),
        core=False,
    ),
    Panel(
        "reflection_frac",
        "Completions with a reflection phrase",
        "fraction",
        matching(lambda k: "reflect" in k and "frac" in k),
        core=False,
    ),
    Panel(
        "length_reward_corr",
        "Length-reward correlation",
        "correlation",
        matching(lambda k: "corr" in k and "correct" not in k),
        core=False,
    ),
]

TIME_KEYS = [("time/generate_s", "generate"), ("time/score_s", "score"), ("time/update_s", "update")]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figure(title: str, ylabel: str, xlabel: str = "step"):
    _matplotlib()  # MissingPlotting, with what to install, before any matplotlib import
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.15, top=0.9)  # fixed: one draw per figure
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.ticklabel_format(axis="y", useOffset=False)  # 10.7962 rather than 1e-6 + 1.07962e1
    if xlabel == "step":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def curve_panel(panel: Panel, runs: list[RunData]) -> Plot:
    pairs = panel.keys(runs)
    lines = [(r, k, lab) for r in runs for k, lab in pairs if any(k in m for m in r.metrics)]
    if not lines:
        return Plot(panel.slug, panel.title, None, "no run recorded these metrics", [])
    if not any(math.isfinite(y) for r, k, _ in lines for y in r.series(k)[1]):
        return Plot(
            panel.slug,
            panel.title,
            None,
            "logged, but null (not a finite number) at every step, e.g. a "
            "correlation when every completion had the same length",
            [k for _, k, _ in lines],
        )
    colours = _matplotlib().rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = _figure(panel.title, panel.ylabel)
    n = max(len(r.metrics) for r in runs)
    w = window(n)
    names = []
    for r, k, lab in lines:
        ri, ki = runs.index(r), [p[0] for p in pairs].index(k)
        colour = colours[(ri if len(runs) > 1 else ki) % len(colours)]
        style = STYLES[ki % len(STYLES)] if len(runs) > 1 else "-"
        name = f"{r.label}: {lab}" if len(runs) > 1 else lab
        names.append(name)
        xs, ys = r.series(k, fill=panel.fill)
        ax.plot(xs, ys, color=colour, linestyle=style, linewidth=0.8, alpha=0.3)
        ax.plot(xs, smooth(ys, w), color=colour, linestyle=style, linewidth=2, label=name)
        if len(xs) == 1:
            ax.plot(xs, ys, "o", color=colour)
    if panel.slug == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.legend(fontsize=8, loc="best")
    caption = f"thin: per step; bold: mean of the last {w} step{'s' if w > 1 else ''}"
    if panel.slug == "kl" and all(not (m.get("kl/beta") or 0) for r in runs for m in r.metrics):
        caption += "; KL to the reference is 0: no reference model (beta = 0)"
    return Plot(panel.slug, panel.title, _png(fig), caption, names)


def time_panel(runs: list[RunData]) -> Plot:
    """One run: generate / score / update stacked per step. Several: mean seconds per step, stacked bars."""
    names = [lab for _, lab in TIME_KEYS]
    if not any(k in m for r in runs for m in r.metrics for k, _ in TIME_KEYS):
        return Plot("time", "Step time", None, "no run recorded step times", [])
    if len(runs) == 1:
        r = runs[0]
        fig, ax = _figure("Step time, split", "seconds")
        xs = [m["step"] for m in r.step_rows]
        ys = [[float(m.get(k) or 0.0) for m in r.step_rows] for k, _ in TIME_KEYS]
        ax.stackplot(xs, ys, labels=[lab for _, lab in TIME_KEYS], alpha=0.8)
        total = [float(m.get("time/step_s") or 0.0) for m in r.step_rows]
        ax.plot(xs, total, color="black", linewidth=1, label="whole step")
        ax.legend(fontsize=8, loc="upper right")
        return Plot(
            "time",
            "Step time",
            _png(fig),
            "stacked: generate + score + update; black: the whole step",
            names + ["whole step"],
        )
    fig, ax = _figure("Mean step time, split", "seconds per step", xlabel="run")
    bottom = [0.0] * len(runs)
    for k, lab in TIME_KEYS:
        vals = []
        for r in runs:
            v = [float(m[k]) for m in r.metrics if isinstance(m.get(k), (int, float))]
            vals.append(sum(v) / len(v) if v else 0.0)
        ax.bar([r.label for r in runs], vals, bottom=bottom, label=lab)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.legend(fontsize=8)
    return Plot(
        "time", "Step time", _png(fig), "mean over each run's steps", [f"{r.label}: {n}" for r in runs for n in names]
    )


def eval_panel(runs: list[RunData]) -> Plot:
    """Held-out accuracy before and after training, per run (summary.json)."""
    have = [(r, r.summary.get("eval_before") or {}, r.summary.get("eval_after") or {}) for r in runs]
    if not any("accuracy" in b or "accuracy" in a for _, b, a in have):
        return Plot(
            "eval",
            "Held-out accuracy",
            None,
            "no held-out evaluation recorded (eval_size=0, or the run has not evaluated yet)",
            [],
        )
    greedy = all(not (e or {}).get("temperature") for _, b, a in have for e in (b, a))
    fig, ax = _figure(
        f"Held-out accuracy ({'greedy' if greedy else 'sampled'}; 95% intervals)", "accuracy", xlabel="run"
    )
    width = 0.38
    for j, (when, colour) in enumerate((("before", "#9aa5b1"), ("after", "#2f7ed8"))):
        xs = [i + (j - 0.5) * width for i in range(len(runs))]
        vals = [(b if when == "before" else a).get("accuracy") for _, b, a in have]
        cis = [(b if when == "before" else a).get("accuracy_ci") for _, b, a in have]
        err = [
            # a summary.json whose accuracy was a per-completion mean (rewards that skip completions)
            # can hold one just outside its per-prompt interval: no negative bar then
            [max(0.0, v - ci[0]) if v is not None and ci else 0.0 for v, ci in zip(vals, cis)],
            [max(0.0, ci[1] - v) if v is not None and ci else 0.0 for v, ci in zip(vals, cis)],
        ]
        bars = ax.bar(
            xs,
            [v if v is not None else 0.0 for v in vals],
            width,
            label=when,
            color=colour,
            yerr=err if any(cis) else None,
            capsize=4,
            ecolor="#444",
        )
        for bar, v in zip(bars, vals):
            ax.annotate(
                "not yet" if v is None else f"{100 * v:.1f}%",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(runs)), [r.label for r in runs])
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8, loc="upper left")
    n = {b.get("n") or a.get("n") for _, b, a in have} - {None}
    caption = f"{'/'.join(map(str, sorted(n)))} held-out prompts, main reward" if n else "main reward"
    caption += "; error bars: 95% intervals where recorded (docs/evaluation.md)"
    return Plot(
        "eval", "Held-out accuracy", _png(fig), caption, [f"{r.label}: {w}" for r in runs for w in ("before", "after")]
    )


EVAL_CURVE_TITLE = "Held-out evaluation during the run (95% interval bands)"


def eval_keys(runs: list[RunData]) -> list[str]:
    """eval/accuracy and each eval/pass@K that has its interval keys, pass@K by K."""
    found = {
        k
        for r in runs
        for m in r.metrics
        for k in m
        if (k == "eval/accuracy" or k.startswith("eval/pass@")) and not k.endswith(("_lo", "_hi"))
    }
    return sorted(found, key=lambda k: (k != "eval/accuracy", int(k.split("@")[1]) if "@" in k else 0))


def eval_curve_plot(runs: list[RunData]) -> Plot | None:
    """The eval/ curves per evaluation step, a translucent band between each key's _lo and _hi; None when no
    run logged evaluations in metrics.jsonl (eval_steps = 0)."""
    keys = eval_keys(runs)
    if not keys:
        return None
    colours = _matplotlib().rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = _figure(EVAL_CURVE_TITLE, "fraction")
    names = []
    for ri, r in enumerate(runs):
        for ki, k in enumerate(keys):
            rows = [m for m in r.metrics if isinstance(m.get(k), (int, float))]
            if not rows:
                continue
            xs = [m["step"] for m in rows]
            colour = colours[(ri * len(keys) + ki) % len(colours)]
            name = f"{r.label}: {k[5:]}" if len(runs) > 1 else k[5:]
            ax.plot(xs, [m[k] for m in rows], "o-", color=colour, linewidth=1.6, markersize=4, label=name)
            lo, hi = [m.get(f"{k}_lo") for m in rows], [m.get(f"{k}_hi") for m in rows]
            if all(isinstance(v, (int, float)) for v in lo + hi):
                ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
            names.append(name)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc="best")
    n = sorted({m.get("eval/prompts") for r in runs for m in r.metrics if m.get("eval/prompts")})
    caption = (
        f"{'/'.join(map(str, n))} held-out prompts at each evaluation (step 0: before training); bands: "
        "95% intervals (Wilson for greedy accuracy, bootstrap over the prompts otherwise; docs/evaluation.md)"
    )
    return Plot("eval_curve", EVAL_CURVE_TITLE, _png(fig), caption, names)


def all_plots(runs: list[RunData]) -> list[Plot]:
    """Every panel in page order; the optional ones (environment and aha metrics) only when a run has them."""
    out = [curve_panel(p, runs) for p in PANELS[:2]]
    out += [plot for p in ENV_PANELS if (plot := curve_panel(p, runs)).series]
    out += [eval_panel(runs)] + [p for p in [eval_curve_plot(runs)] if p is not None]
    out += [plot for p in PANELS[2:] if (plot := curve_panel(p, runs)).series or p.core]
    return out + [time_panel(runs)]


__all__ = ["ENV_PANELS", "PANELS", "MissingPlotting", "Plot", "all_plots", "eval_curve_plot", "smooth", "window"]
