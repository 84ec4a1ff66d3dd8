"""Console output: a live progress bar with reward, length and KL, and the end-of-run summary."""

from __future__ import annotations

import math
from pathlib import Path


def _fmt(x, nd=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{nd}f}"


class Progress:
    """A rich progress bar when the console is a terminal (or forced), one plain line per step otherwise."""

    def __init__(self, total: int, start: int, *, enabled: bool = True, console=None):
        from rich.console import Console

        self.console = console or Console()
        self.enabled = enabled
        self.bar = None
        if enabled and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RP

            self.bar = RP(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
            )
            self.task = self.bar.add_task("", total=total, completed=start)
            self.bar.start()

    def advance(self, m: dict) -> None:
        text = (
            f"reward {_fmt(m.get('reward/mean'))}  len {_fmt(m.get('completion/length_mean'), 1)}  "
            f"kl {_fmt(m.get('kl'), 4)}  zero-std {_fmt(m.get('groups/zero_std_frac'), 2)}  "
            f"{_fmt(m.get('time/step_s'), 1)}s/step"
        )
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=text)
        elif self.enabled:
            self.console.print(f"step {m['step']:>4}  {text}", highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_summary(s: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    from grpolab.training.evaluation import is_share

    console = console or Console()
    t = Table(title=f"grpolab run summary ({s['steps']} steps, {s['time_s']:.0f} s of training)")
    t.add_column("")
    t.add_column("start", justify="right")
    t.add_column("end", justify="right")
    t.add_row("reward (mean of first / last 5 steps)", _fmt(s["reward_first"]), _fmt(s["reward_last"]))
    t.add_row("completion length (tokens)", _fmt(s["length_first"], 1), _fmt(s["length_last"], 1))
    b, a = s.get("eval_before"), s.get("eval_after")
    if b and a:
        how = (
            "greedy"
            if b.get("samples_per_prompt", 1) == 1 and not b.get("temperature")
            else f"{b['samples_per_prompt']} samples each"
        )
        share = is_share(b) and is_share(a)
        what = "accuracy" if share else "mean score"
        t.add_row(
            f"held-out {what} ({b['n']} prompts, {how}, {b['main_reward']}; 95% interval)",
            _pct(b, share),
            _pct(a, share),
        )
    console.print(t)
    change = (s.get("eval_change") or {}).get("accuracy")
    if change:
        console.print(change["sentence"], highlight=False)
    if s.get("stopped_early"):
        console.print(f"stopped early: {s['stopped_early']['reason']}", highlight=False)
    if s.get("best"):
        console.print(
            f"best model: {s['best']['metric']} = {s['best']['value']:.4g} at step {s['best']['step']} "
            f"({s['best']['path']})",
            highlight=False,
        )
    if s.get("stopped"):
        console.print(f"stopped after step {s['stopped']['step']}: {s['stopped']['reason']}")
    report = ", report.html (open it in a browser)" if "report.html" in s.get("files", {}) else ""
    tb = f"tb/ (tensorboard --logdir {s['out']}/tb), " if Path(s["out"], "tb").is_dir() else ""
    console.print(
        f"files in {s['out']}: metrics.jsonl, samples.jsonl, config.yaml, {tb}checkpoints/, summary.json{report}"
    )


def _pct(ev: dict, share: bool = True) -> str:
    """An evaluation's accuracy in percent (share) or its mean score as a number (a main reward scoring
    outside [0, 1]: grpolab.training.evaluation.is_share), with its 95% interval when it has one; "–" when
    the main reward scored no completion (accuracy None)."""
    if not isinstance(ev.get("accuracy"), (int, float)):
        return "–"
    ci = ev.get("accuracy_ci")
    if not share:
        return f"{ev['accuracy']:.4g}" + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")
    return f"{100 * ev['accuracy']:.1f}%" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")
