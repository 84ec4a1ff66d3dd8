"""What the miniatures (`grpolab lab aha`, `grpolab lab tools`) share: a tiny model pre-trained once and
cached, runs of the real `grpolab train` on it, and per-block summaries of the runs' curves.

    cached_model(kind, spec, build)   the model directory for these settings, built once
                                      ($GRPOLAB_CACHE/lab/KIND-<hash of spec>)
    train_run(name, cfg)              one `grpolab train` run (its summary in OUT/train.log);
                                      (metrics records, sample records, seconds)
    blocks(rows, n)                   means of each column over n consecutive blocks of steps
    plot_curves(arms, path, panels)   one PNG of per-step curves, one panel per column
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def cached_model(kind: str, spec: dict, build: Callable[[Path, Path], dict], log=print) -> tuple[Path, dict]:
    """The cached model directory for `spec` and its info (OUT/pretrain.json). Built once by
    `build(directory, target)`, which writes the model into `directory` and returns its info; the
    directory is a temporary one, renamed to `target` once built, so that an interrupted build leaves
    nothing behind."""
    from grpolab.model.load import cache_dir

    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_dir() / "lab" / f"{kind}-{key}"
    if (target / "pretrain.json").exists():
        return target, json.loads((target / "pretrain.json").read_text())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        info = build(tmp, target)
        (tmp / "pretrain.json").write_text(json.dumps(info, indent=2))
        try:
            os.replace(tmp, target)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, info


def train_run(name: str, cfg) -> tuple[list[dict], list[dict], float]:
    """One `grpolab train` run into cfg.out (a previous lab run's output there is replaced); the
    trainer's own summary goes to OUT/train.log, its warnings are printed; OUT/report.html is written
    as by the command line when cfg.report. Returns (metrics records, sample records, seconds)."""
    from grpolab.training.trainer import train
    from grpolab.util.fileio import read_jsonl

    run_dir = Path(cfg.out)
    if (run_dir / "metrics.jsonl").exists():
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    buf = io.StringIO()
    writer = None
    if cfg.report:
        from grpolab.app.report import write_run_report as writer
    with contextlib.redirect_stdout(buf):
        train(cfg, report=writer)
    (run_dir / "train.log").write_text(buf.getvalue())
    for line in buf.getvalue().splitlines():
        if line.startswith("warning:"):
            print(f"  [{name}] {line}")
    return read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "samples.jsonl"), time.perf_counter() - t0


def mean(xs) -> float:
    """Mean of the finite numbers among xs (NaN if none)."""
    xs = [x for x in xs if isinstance(x, (int, float)) and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def blocks(rows: list[dict], n_blocks: int) -> list[dict]:
    """Means of each column over n_blocks consecutive blocks of steps (rows carry "step")."""
    n = len(rows)
    out = []
    for b in range(n_blocks):
        part = rows[b * n // n_blocks : (b + 1) * n // n_blocks]
        if part:
            out.append(
                {
                    "steps": f"{part[0]['step']}-{part[-1]['step']}",
                    **{k: mean([r[k] for r in part]) for k in part[0] if k != "step"},
                }
            )
    return out


def plot_curves(arms: dict[str, list[dict]], path: Path, panels: list[tuple[str, str, str]]) -> str | None:
    """Per-step curves of every arm, one panel per (column, title, y label); returns a message when
    matplotlib is missing (nothing is written then)."""
    try:
        import matplotlib
    except ImportError:
        return "no PNG written: matplotlib is not installed (pip install 'grpolab[report]', or pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (key, title, ylabel) in zip(axes, panels):
        for name, rows in arms.items():
            ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=name)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def finish(
    res: dict,
    main_arm: str,
    rows_by_arm: dict[str, list[dict]],
    out: Path,
    name: str,
    plot: Callable[[dict, Path], str | None],
    t0: float,
    also: tuple[Path, ...] = (),
) -> dict:
    """The end of a miniature lab: its plot (OUT/NAME.png, or the note why none was drawn), the verdict of
    the main arm, the per-step rows, OUT/NAME.json, and the closing lines. Returns `res`, completed."""
    note = plot(rows_by_arm, out / f"{name}.png")
    res["png"] = None if note else str(out / f"{name}.png")
    if note:
        print(note)
    res["time_s"] = time.perf_counter() - t0
    res["verdict"] = res["arms"][main_arm]["verdict"]
    res["per_step"] = rows_by_arm
    (out / f"{name}.json").write_text(json.dumps(res, indent=2, default=float))
    print(f"\n{res['verdict']}")
    files = [out / f"{name}.json", *([res["png"]] if res["png"] else []), *(p for p in also if Path(p).exists())]
    print(f"({res['time_s']:.0f} s in all; " + ", ".join(str(f) for f in files) + ")")
    return res
