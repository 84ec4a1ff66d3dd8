"""The report page: a header per run (config, model, machine, wall time, summary numbers), the
plots (PNG inlined as data: URLs), samples from the start, middle and end (a multi-turn sample's
conversation turn by turn), and the credit view.

The page is one file with no external reference at all: no script, style sheet, font or image
is loaded from anywhere (every src is a data: URL; its one small script is inline).
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
from html import escape

from grpolab.app.report.credit import SCRIPT, credit_section
from grpolab.app.report.evaluation import eval_section
from grpolab.app.report.load import RunData
from grpolab.app.report.plots import Plot

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1340px;
       padding: 16px 24px; color: #1f2328; background: #ffffff; }
h1 { font-size: 22px; margin: 4px 0 8px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 16px 0 6px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; }
th { background: #f6f8fa; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 14px; }
figure { margin: 0; border: 1px solid #d0d7de; border-radius: 6px; padding: 6px; background: #fff; }
figure img { width: 100%; height: auto; display: block; } figcaption { font-size: 12px; color: #57606a; }
.nodata { height: 120px; display: flex; align-items: center; justify-content: center; color: #57606a; }
.note { color: #9a6700; background: #fff8c5; padding: 4px 8px; border-radius: 4px; }
.sample { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
.prompt { color: #57606a; font-size: 13px; margin: 2px 0; } pre { white-space: pre-wrap; margin: 4px 0; font-size: 13px; }
.credit { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px 10px; margin: 8px 0; }
.tokens { font: 14px/1.9 ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap; margin: 6px 0; }
.tok { border-radius: 3px; padding: 1px 0; margin: 0 1px; } .tok.clip { outline: 2px solid #000; } .tok:hover { outline: 2px solid #0969da; }
.tok.env { background: #eaeef2; color: #8c959f; }
.tok.skip { background: repeating-linear-gradient(45deg, #eaeef2, #eaeef2 4px, #f6f8fa 4px, #f6f8fa 8px); color: #6e7781; }
.modes button { margin: 0 2px; border: 1px solid #d0d7de; background: #f6f8fa; border-radius: 4px; cursor: pointer; }
.modes button.on { background: #0969da; color: #fff; } .modes button:disabled { color: #8c959f; cursor: default; } .legend { font-size: 12px; color: #57606a; }
.turn { border-left: 3px solid #d0d7de; padding: 0 8px; margin: 4px 0; } .turn .role { font-size: 12px; font-weight: 600; color: #57606a; }
.turn.assistant { border-color: #2f7ed8; } .turn.tool { border-color: #9a6700; background: #fbf8ef; } .turn.user { border-color: #8c959f; background: #f6f8fa; }
.toktable td { font-size: 12px; padding: 1px 6px; } details { margin: 4px 0; } summary { cursor: pointer; color: #0969da; }
"""


def _fmt(x, fmt: str = "{:.3f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "–"


def _count(x) -> str:
    """A count from a run's files as text: an int, else "?" (a foreign file's field is never markup)."""
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else "?"


def _dur(s) -> str:
    if not isinstance(s, (int, float)) or not math.isfinite(s):
        return "–"
    m, sec = divmod(round(s), 60)
    return f"{m // 60} h {m % 60} min" if m >= 60 else f"{m} min {sec} s" if m else f"{sec} s"


def _first_last(run: RunData, key: str, k: int = 5) -> tuple[float, float]:
    vals = [m.get(key) for m in run.metrics]
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    first, last = vals[:k], vals[-k:]
    return (sum(first) / len(first) if first else float("nan"), sum(last) / len(last) if last else float("nan"))


def _status(run: RunData) -> str:
    done, planned = len(run.step_rows), run.steps_planned
    if run.finished:
        return f"finished: {done} step{'s' if done != 1 else ''}"
    return f"in progress or stopped: {done} of {planned if planned is not None else '?'} steps (no final summary yet)"


def _machine(run: RunData) -> str:
    m = run.machine
    if not m:
        device = run.config.get("device", "?")
        return f"not recorded (device={escape(str(device))}; grpolab train records it when it writes the report)"
    return escape(", ".join(f"{k} {v}" for k, v in m.items()))


def _eval(run: RunData, when: str) -> str:
    e = run.summary.get(f"eval_{when}") or {}
    if not isinstance(e.get("accuracy"), (int, float)):
        return "–"
    ci = e.get("accuracy_ci")
    return f"{100 * e['accuracy']:.1f}%" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def _alerts(run: RunData) -> str:
    """alert/NAME metrics (1.0 at a step where the alert fired): the steps of each."""
    names = sorted({k for m in run.metrics for k in m if k.startswith("alert/") and k != "alert/count"})
    fired = {n: [m["step"] for m in run.metrics if m.get(n) == 1.0] for n in names}
    text = "; ".join(
        f"{n.split('/', 1)[1]}: {', '.join(map(str, s[:8]))}{' ...' if len(s) > 8 else ''}"
        for n, s in fired.items()
        if s
    )
    return escape(text) if text else ("none fired" if names else "not logged")


def header(runs: list[RunData]) -> str:
    """The table of runs (one column each) and each run's resolved config."""

    def algo(r: RunData) -> str:
        a = r.config.get("algo")
        return str(a.get("name", "?")) if isinstance(a, dict) else str(a or "?")

    rows = [
        ("run directory", lambda r: f"<code>{escape(str(r.path))}</code>"),
        ("status", lambda r: escape(_status(r))),
        ("model", lambda r: escape(str(r.config.get("model", "?")))),
        ("task / algorithm", lambda r: escape(f"{r.config.get('task', '?')} / {algo(r)}")),
        (
            "group, batch, completion limit",
            lambda r: escape(
                f"G={r.config.get('G', '?')}, batch_size={r.config.get('batch_size', '?')}, "
                f"max_new_tokens={r.config.get('max_new_tokens', '?')}"
            ),
        ),
        ("machine", _machine),
        ("time in training steps", lambda r: _dur(sum(float(m.get("time/step_s") or 0) for m in r.metrics))),
        ("wall time (config.yaml to last write)", lambda r: _dur(r.wall_s)),
        ("reward, first 5 -> last 5 steps", lambda r: "{} -> {}".format(*map(_fmt, _first_last(r, "reward/mean")))),
        (
            "length, first 5 -> last 5 steps",
            lambda r: "{} -> {}".format(*(_fmt(x, "{:.1f}") for x in _first_last(r, "completion/length_mean"))),
        ),
        ("held-out accuracy, before -> after (95% interval)", lambda r: f"{_eval(r, 'before')} -> {_eval(r, 'after')}"),
        ("peak memory", lambda r: _fmt(max([m.get("memory/peak_mb") or 0 for m in r.metrics] + [0]), "{:.0f} MB")),
        ("alerts (steps)", _alerts),
        (
            "lines skipped",
            lambda r: (
                escape(
                    "; ".join(
                        f"{f}: {len(v)} (line {', '.join(x.rsplit(':', 1)[-1] for x in v[:5])})"
                        for f, v in r.skipped.items()
                    )
                )
                or "none"
            ),
        ),
    ]
    head = "".join(f"<th>{escape(r.label)}</th>" for r in runs)
    body = "".join(f"<tr><th>{escape(name)}</th>{''.join(f'<td>{fn(r)}</td>' for r in runs)}</tr>" for name, fn in rows)
    configs = "".join(
        f"<details><summary>resolved config of {escape(r.label)} (config.yaml)</summary>"
        f"<pre>{escape(r.config_text or 'no config.yaml')}</pre></details>"
        for r in runs
    )
    return f"<table><tr><th></th>{head}</tr>{body}</table>{_differences(runs)}{configs}"


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _differences(runs: list[RunData]) -> str:
    """Config keys whose values differ between the runs (what a comparison compares)."""
    if len(runs) < 2:
        return ""
    flats = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f if k != "out" and len({repr(g.get(k)) for g in flats}) > 1})
    if not keys:
        return "<p>The runs' configs are the same (apart from <code>out</code>).</p>"
    rows = "".join(
        f"<tr><th>{escape(k)}</th>{''.join(f'<td>{escape(repr(f.get(k)))}</td>' for f in flats)}</tr>" for k in keys
    )
    return f"<h3>Config differences</h3><table><tr><th>key</th>{''.join(f'<th>{escape(r.label)}</th>' for r in runs)}</tr>{rows}</table>"


def plots_section(plots: list[Plot]) -> str:
    figs = []
    for p in plots:
        if p.png is None:
            figs.append(
                f'<figure id="plot-{p.slug}"><div class="nodata">{escape(p.title)}: {escape(p.caption)}</div></figure>'
            )
        else:
            data = base64.b64encode(p.png).decode("ascii")
            alt = f"{p.title}: {', '.join(p.series)}"
            figs.append(
                f'<figure id="plot-{p.slug}"><img class="plot" alt="{escape(alt)}" src="data:image/png;base64,'
                f'{data}"><figcaption>{escape(p.caption)}</figcaption></figure>'
            )
    return f'<div class="grid">{"".join(figs)}</div>'


STOPS = {
    "answer": "ended by the environment or a turn without a tool call",
    "max_turns": "at env.max_turns",
    "budget": "out of model tokens (env.max_model_tokens or a turn cut at env.max_turn_tokens)",
    "env_tokens": "past env.max_env_tokens",
}


def conversation(messages) -> str:
    """A multi-turn sample's messages after the prompt, turn by turn, each labelled by its role (the
    model's turns numbered; a tool result with its tool's name)."""
    out, turn = [], 0
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "?"))
        if role == "assistant":
            turn += 1
            label = f"assistant · turn {turn}"
        elif role == "tool":
            label = f"tool · {m['name']}" if m.get("name") else "tool"
        else:
            label = role
        content = m.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        calls = m.get("tool_calls")
        if calls:
            text += ("\n" if text else "") + f"tool calls: {calls}"
        kind = role if role in ("assistant", "tool", "user") else "other"
        out.append(f'<div class="turn {kind}"><div class="role">{escape(label)}</div><pre>{escape(text)}</pre></div>')
    return f'<div class="conversation">{"".join(out)}</div>'


def samples_section(run: RunData, per_phase: int = 4) -> str:
    """Samples of the first, middle and last step that has any."""
    steps = sorted({s["step"] for s in run.samples})
    if not steps:
        return '<p class="note">No samples yet (samples.jsonl is empty or missing).</p>'
    picked = []
    for name, st in (("start", steps[0]), ("middle", steps[len(steps) // 2]), ("end", steps[-1])):
        if st not in [p[1] for p in picked]:
            picked.append((name, st))
    out = []
    for name, st in picked:
        cards = []
        for s in [s for s in run.samples if s["step"] == st][:per_phase]:
            rewards = ", ".join(f"{escape(str(k))} {_fmt(v)}" for k, v in (s.get("rewards") or {}).items())
            shaped = "" if s.get("reward_shaped") == s.get("reward") else f" · shaped {_fmt(s.get('reward_shaped'))}"
            turns = s.get("conversation")
            if isinstance(turns, list):  # multi-turn: the conversation after the prompt, turn by turn
                body = conversation(turns)
                n = sum(isinstance(m, dict) and m.get("role") == "assistant" for m in turns)
                stop, why = s.get("stop"), STOPS.get(str(s.get("stop")))
                extra = f" model tokens · {n} model turn{'s' if n != 1 else ''}" + (
                    f" · stopped: {escape(str(stop))}{f' ({escape(why)})' if why else ''}" if stop else ""
                )
            else:
                body, extra = f"<pre>{escape(str(s.get('completion', '')))}</pre>", " tokens"
            cards.append(
                f'<div class="sample"><div class="prompt">{escape(str(s.get("prompt", "")))} '
                f"<b>answer</b> {escape(str(s.get('answer', '')))}</div>"
                f"{body}<div>reward {_fmt(s.get('reward'))} "
                f"({rewards}){shaped} · {_count(s.get('length'))}{extra}"
                f"{' · truncated' if s.get('truncated') else ''}</div></div>"
            )
        out.append(f"<h3>{name}: step {st}</h3>{''.join(cards)}")
    return "".join(out)


def render(runs: list[RunData], plots: list[Plot]) -> str:
    title = "grpolab report: " + (runs[0].label if len(runs) == 1 else " vs ".join(r.label for r in runs))
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    intro = (
        f"<h1>{escape(title)}</h1><p>Written {when} by <code>grpolab report</code>. Every curve: "
        "thin per step, bold smoothed. Keys are defined in docs/metrics.md.</p>"
    )
    parts = [
        intro,
        '<h2 id="runs">Runs</h2>',
        header(runs),
        '<h2 id="curves">Curves</h2>',
        plots_section(plots),
        '<h2 id="evaluation">Held-out evaluation</h2>',
        eval_section(runs),
    ]
    for i, r in enumerate(runs):
        suffix = f" of {escape(r.label)}" if len(runs) > 1 else ""
        parts += [
            f'<h2 id="{"credit" if i == 0 else f"credit-{i}"}">Token-level credit{suffix}</h2>',
            credit_section(r, i),
            f'<h2 id="{"samples" if i == 0 else f"samples-{i}"}">Samples{suffix}</h2>',
            samples_section(r),
        ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>{''.join(parts)}"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


__all__ = ["render"]
