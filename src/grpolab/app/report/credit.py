"""The token-level credit view: each completion token coloured by a per-token value (advantage by
default; entropy, log-prob, ratio or KL on a click), with a tooltip and a table of every value.

The per-token values come from samples.jsonl (`tokens`, written by grpolab.training.token_credit). Tokens of
a row the update never computed (a zero-advantage group) are grey and say so: their log-prob,
ratio, entropy and KL were not measured, and are not shown as zeros. In a multi-turn sample the
environment's tokens (tool results, replies, the chat template's role headers; `env` in the record) stand
in place among the model's, greyed: context the model read, never sampled, so no credit.
"""

from __future__ import annotations

import math
from html import escape

from grpolab.app.report.load import RunData

CLIP = {0: "", 1: "clipped high", -1: "clipped low", 2: "dual-clipped"}
MODES = [("adv", "advantage"), ("entropy", "entropy"), ("logp", "log-prob"), ("ratio", "ratio"), ("kl", "KL")]


def _phase_steps(run: RunData) -> list[tuple[str, list[int]]]:
    """Steps that have samples, cut in thirds: start, middle, end."""
    steps = sorted({s["step"] for s in run.samples})
    if not steps:
        return []
    k = len(steps)
    cuts = [
        ("start", steps[: max(1, k // 3)]),
        ("middle", steps[k // 3 : max(k // 3 + 1, 2 * k // 3)]),
        ("end", steps[max(0, 2 * k // 3) :] or steps[-1:]),
    ]
    seen: set[int] = set()
    out = []
    for name, part in cuts:
        part = [s for s in part if s not in seen]
        seen.update(part)
        if part:
            out.append((name, part))
    return out


def pick(run: RunData, per_phase: int = 2) -> list[tuple[str, dict]]:
    """A few samples with per-token values: per phase the computed one with the largest and the one
    with the smallest advantage (what the update pushed up, and down); uncomputed ones only if a
    phase has nothing else."""
    out = []
    for name, steps in _phase_steps(run):
        pool = [s for s in run.samples if s["step"] in steps and isinstance(s.get("tokens"), dict)]
        computed = [s for s in pool if s["tokens"].get("computed")]
        if computed:
            by_adv = sorted(computed, key=lambda s: _adv(s))
            chosen = [by_adv[-1]] + ([by_adv[0]] if per_phase > 1 and by_adv[0] is not by_adv[-1] else [])
        else:
            chosen = pool[:1]
        out += [(name, s) for s in chosen]
    return out


def _adv(sample: dict) -> float:
    vals = [a for a in sample["tokens"].get("adv") or [] if isinstance(a, (int, float))]
    return sum(vals) / len(vals) if vals else 0.0


def _num(x, fmt: str = "{:.3f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def _int(x, default: int) -> int:
    """A count from samples.jsonl: an int as it is, anything else (a string, a bool) `default`."""
    return x if isinstance(x, int) and not isinstance(x, bool) else default


def _val(tokens: dict, key: str, t: int):
    vals = tokens.get(key)
    return vals[t] if isinstance(vals, list) and t < len(vals) else None


def _colour(a, scale: float) -> str:
    """Background for advantage a: green when positive, red when negative, stronger with |a|."""
    if not isinstance(a, (int, float)) or scale <= 0:
        return "transparent"
    alpha = min(1.0, abs(a) / scale) * 0.75 + 0.08
    return f"rgba(46,160,67,{alpha:.2f})" if a > 0 else f"rgba(215,58,73,{alpha:.2f})" if a < 0 else "transparent"


def _shown(text: str) -> str:
    return escape(text.replace("\n", "\u21b5\n")) if text else "\u2205"


ENV_TIP = "environment token (tool result, reply or chat-template text): context the model read, not sampled, no credit"


def _is_env(tokens: dict, t: int) -> bool:
    """Token t is the environment's (multi-turn records carry `env`, one boolean per shown token)."""
    return _val(tokens, "env", t) is True


def sample_view(sample: dict, phase: str, scale: float, uid: str) -> str:
    tokens = sample["tokens"]
    computed = bool(tokens.get("computed"))
    multi = isinstance(tokens.get("env"), list)
    spans, rows = [], []
    for t, text in enumerate(tokens.get("text") or []):
        a, clip = _val(tokens, "adv", t), _val(tokens, "clip", t)
        vals = {k: _val(tokens, k, t) for k, _ in MODES}
        if _is_env(tokens, t):
            spans.append(f'<span class="tok env" title="{escape(f"{text!r}  {ENV_TIP}")}">{_shown(text)}</span>')
            rows.append(
                f'<tr class="env"><td>{t}</td><td><code>{escape(repr(text))}</code></td><td>environment</td>'
                + "<td>–</td>" * 6
                + "</tr>"
            )
            continue
        if computed:
            tip = (
                f"{text!r}  A {_num(a, '{:+.3f}')} | ratio {_num(vals['ratio'], '{:.4f}')}"
                f"{' (' + CLIP.get(clip, '') + ')' if clip else ' (not clipped)'} | entropy "
                f"{_num(vals['entropy'])} | KL {_num(vals['kl'], '{:.4f}') if vals['kl'] is not None else 'no reference'}"
                f" | log p {_num(vals['logp'])}"
            )
            style = f"background:{_colour(a, scale)}"
        else:
            tip = (
                f"{text!r}  A {_num(a, '{:+.3f}')} | not computed: its group had zero advantage, the update skipped it"
            )
            style = ""
        data = " ".join(f'data-{k}="{v}"' for k, v in vals.items() if isinstance(v, (int, float)))
        cls = "tok" + (" clip" if clip else "") + ("" if computed else " skip")
        spans.append(f'<span class="{cls}" style="{style}" {data} title="{escape(tip)}">{_shown(text)}</span>')
        owner = "<td>model</td>" if multi else ""
        rows.append(
            f"<tr><td>{t}</td><td><code>{escape(repr(text))}</code></td>{owner}<td>{_num(a, '{:+.3f}')}</td>"
            f"<td>{_num(vals['logp'])}</td><td>{_num(vals['ratio'], '{:.4f}')}</td>"
            f"<td>{escape(CLIP.get(clip, '')) if computed else '–'}</td><td>{_num(vals['entropy'])}</td>"
            f"<td>{_num(vals['kl'], '{:.4f}')}</td></tr>"
        )
    n, shown = _int(tokens.get("n"), len(spans)), _int(tokens.get("shown"), len(spans))  # never markup
    note = (
        ""
        if computed
        else (
            '<p class="note">Not computed: every completion of this group had the same '
            "reward, so the advantage is 0 and the update skipped the group; its log-probs, "
            "ratios, entropies and KL were never measured.</p>"
        )
    )
    more = f" (first {shown} of {n} tokens)" if shown < n else ""
    if multi:
        n_env = _int(tokens.get("n_env"), sum(x is True for x in tokens["env"]))
        more = f" after the prompt: {n - n_env} the model's, {n_env} the environment's (greyed, no credit)" + (
            f"; the first {shown} shown" if shown < n else ""
        )
    rewards = ", ".join(f"{escape(k)} {_num(v)}" for k, v in (sample.get("rewards") or {}).items())
    return f"""<div class="credit" id="{uid}">
<div class="meta"><b>{escape(phase)}</b> · step {sample.get("step")} · reward {_num(sample.get("reward"))}
({rewards}) · advantage {_num(_adv(sample), "{:+.3f}")} · {n} tokens{more}</div>
<div class="prompt">{escape(str(sample.get("prompt", "")))}</div>
<div class="tokens">{"".join(spans)}</div>{note}
<details><summary>every token's values</summary><table class="toktable"><tr><th>#</th><th>token</th>{"<th>whose</th>" if multi else ""}<th>A</th>
<th>log p</th><th>ratio</th><th>clip</th><th>entropy</th><th>KL</th></tr>{"".join(rows)}</table></details>
</div>"""


SCRIPT = """
(function () {
  function colour(mode, v, scale) {
    if (v === undefined || v === null || isNaN(v)) return "";
    var a;
    if (mode === "adv") { a = Math.min(1, Math.abs(v) / scale) * 0.75 + 0.08;
      return v > 0 ? "rgba(46,160,67," + a + ")" : v < 0 ? "rgba(215,58,73," + a + ")" : ""; }
    if (mode === "ratio") { var d = Math.abs(Math.log(v)); a = Math.min(1, d / scale) * 0.75;
      return v >= 1 ? "rgba(46,120,216," + a + ")" : "rgba(230,140,20," + a + ")"; }
    var x = mode === "logp" ? -v : v;
    a = Math.min(1, Math.abs(x) / scale) * 0.8;
    return "rgba(130,80,200," + a + ")";
  }
  function paint(view, mode) {
    var toks = view.querySelectorAll(".tok:not(.skip):not(.env)"), scale = 0;
    toks.forEach(function (t) { var v = parseFloat(t.dataset[mode]);
      if (!isNaN(v)) scale = Math.max(scale, mode === "ratio" ? Math.abs(Math.log(v)) : Math.abs(v)); });
    if (scale === 0) scale = 1;
    toks.forEach(function (t) { t.style.background = colour(mode, parseFloat(t.dataset[mode]), scale); });
    view.querySelectorAll(".modes button").forEach(function (b) {
      b.classList.toggle("on", b.dataset.mode === mode); });
  }
  document.querySelectorAll(".creditview").forEach(function (view) {
    view.querySelectorAll(".modes button").forEach(function (b) {
      b.addEventListener("click", function () { paint(view, b.dataset.mode); }); });
  });
})();
"""


def _missing(mode: str) -> str:
    return "no reference model in this run (beta = 0)" if mode == "kl" else "not measured for these samples"


def credit_section(run: RunData, index: int) -> str:
    """The credit view of one run (HTML), or a note saying why there is none."""
    chosen = pick(run)
    if not chosen:
        why = (
            (
                "this run's samples.jsonl has no per-token values (written before grpolab saved them, "
                "or with sample_tokens=0)"
            )
            if run.samples
            else "this run has no samples yet"
        )
        return f'<p class="note">No token-level view: {why}.</p>'
    scale = (
        max([abs(a) for _, s in chosen for a in s["tokens"].get("adv") or [] if isinstance(a, (int, float))] + [0.0])
        or 1.0
    )
    has = {
        k for _, smp in chosen for k, _ in MODES if any(isinstance(v, (int, float)) for v in smp["tokens"].get(k) or [])
    }
    buttons = "".join(
        f'<button data-mode="{k}"{" class=on" if k == "adv" else ""}'
        f"{'' if k in has else ' disabled title=' + chr(34) + escape(_missing(k)) + chr(34)}>"
        f"{escape(lab)}</button>"
        for k, lab in MODES
    )
    legend = (
        "<b>advantage</b>: green where the update pushed the token up, red where it pushed it down, "
        "stronger with |A|; <b>entropy</b>, <b>log-prob</b> (as surprise, -log p) and <b>KL</b>: darker "
        "= larger; <b>ratio</b>: blue above 1, orange below. A black outline marks a clipped token; grey "
        "tokens were not computed. Hover a token for its values."
    )
    if any(_is_env(s["tokens"], t) for _, s in chosen for t in range(len(s["tokens"].get("text") or []))):
        legend += (
            ' <span class="tok env">Grey</span> tokens are the environment\'s (tool results, replies, the '
            "chat template's role headers): the model read them as context but never sampled them, so they "
            "carry no credit and are left out of the loss."
        )
    views = "".join(sample_view(s, phase, scale, f"credit-{index}-{j}") for j, (phase, s) in enumerate(chosen))
    return f'<div class="creditview"><div class="modes">colour by {buttons}</div><p class="legend">{legend}</p>{views}</div>'


__all__ = ["SCRIPT", "credit_section", "pick"]
