"""The report's held-out evaluation section: pass@k before and after (with intervals), the paired change
in words, and the answer extraction shares, from summary.json (eval_before, eval_after, eval_change).
The eval/ curves with their interval bands are a plot (grpolab.app.report.plots.eval_curve_plot).
"""

from __future__ import annotations

from html import escape

from grpolab.app.report.load import RunData


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "–"


def _with_ci(v: dict | None) -> str:
    if not v:
        return "–"
    est = v.get("estimate", v.get("accuracy"))
    ci = v.get("ci", v.get("accuracy_ci"))
    return _pct(est) + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def _run_section(r: RunData) -> str:
    b, a = r.summary.get("eval_before") or {}, r.summary.get("eval_after") or {}
    if not b and not a:
        return "<p>No held-out evaluation recorded (eval_size=0, or the run has not finished).</p>"
    ref = b or a
    how = (
        "greedy"
        if not ref.get("temperature")
        else f"{ref.get('samples_per_prompt')} samples per prompt at temperature {ref.get('temperature'):g}"
    )
    change = r.summary.get("eval_change") or {}
    rows = [("accuracy", _with_ci(b), _with_ci(a), change.get("accuracy"))]
    for k in sorted(set(b.get("pass@k", {})) | set(a.get("pass@k", {})), key=int):
        rows.append(
            (
                f"pass@{k}",
                _with_ci(b.get("pass@k", {}).get(k)),
                _with_ci(a.get("pass@k", {}).get(k)),
                change.get(f"pass@{k}"),
            )
        )

    def delta(c: dict | None) -> str:
        if not c:
            return "–"
        verdict = "beyond noise" if c["beyond_noise"] else "within noise"
        return f"{100 * c['change']:+.1f} [{100 * c['ci'][0]:+.1f}, {100 * c['ci'][1]:+.1f}] ({verdict})"

    body = "".join(
        f'<tr><th>{escape(n)}</th><td class="num">{x}</td><td class="num">{y}</td>'
        f'<td class="num">{escape(delta(c))}</td></tr>'
        for n, x, y, c in rows
    )
    out = [
        (
            f"<p>{ref.get('n', '?')} held-out prompts, {escape(how)}, main reward "
            f"<code>{escape(str(ref.get('main_reward', '?')))}</code>; 95% intervals in brackets.</p>"
        ),
        f"<table><tr><th></th><th>before</th><th>after</th><th>change, points (paired)</th></tr>{body}</table>",
    ]
    if change.get("accuracy"):
        out.append(f"<p>{escape(change['accuracy']['sentence'])}.</p>")
    ext = sorted(set(b.get("extraction", {})) | set(a.get("extraction", {})))
    if ext:
        cells = "".join(
            f"<tr><th>{escape(name)}</th>"
            + "".join(
                f'<td class="num">{_pct((e.get("extraction", {}).get(name) or {}).get(kind))}</td>'
                for e in (b, a)
                for kind in ("no_answer", "wrong", "right")
            )
            + "</tr>"
            for name in ext
        )
        kinds = "<th>no parsable answer</th><th>wrong</th><th>right</th>"
        out.append(
            "<h3>Answer extraction (share of completions)</h3>"
            f'<table><tr><th></th><th colspan="3">before</th><th colspan="3">after</th></tr>'
            f"<tr><th>verifier</th>{kinds}{kinds}</tr>{cells}</table>"
        )
    if r.summary.get("best"):
        best = r.summary["best"]
        out.append(
            f"<p>Best model by {escape(best['metric'])}: {best['value']:.4g} at step {best['step']} "
            f"(<code>{escape(best['path'])}</code>).</p>"
        )
    if r.summary.get("stopped_early"):
        out.append(f'<p class="note">Stopped early: {escape(r.summary["stopped_early"]["reason"])}.</p>')
    return "".join(out)


def eval_section(runs: list[RunData]) -> str:
    """The held-out evaluation of each run (summary.json): pass@k before and after with intervals, the paired
    change and whether it is beyond noise, the extraction shares, the best model, an early stop."""
    if len(runs) == 1:
        return _run_section(runs[0])
    return "".join(f"<h3>{escape(r.label)}</h3>{_run_section(r)}" for r in runs)


__all__ = ["eval_section"]
