"""Reading a run directory for the report: whatever is there, up to its last complete line.

A directory is a run when it holds metrics.jsonl or config.yaml (anything else is a ConfigError,
exit 2, naming it). A run still being written is read up to its last complete line; a line that is
not a JSON object (cut by a crash, or being written right now) is skipped and counted, never raised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpolab.util.fields import ConfigError
from grpolab.util.fileio import iter_jsonl
from grpolab.util.text import safe_data


@dataclass
class RunData:
    """Everything the report shows about one run."""

    path: Path
    label: str  # the name on plots and in tables (directory name, made unique among the runs)
    config: dict = field(default_factory=dict)
    config_text: str = ""
    metrics: list[dict] = field(default_factory=list)  # one record per step, in step order
    skipped: dict[str, list[str]] = field(default_factory=dict)  # file -> "FILE:LINE" of skipped lines
    samples: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    machine: dict | None = None
    wall_s: float | None = None  # config.yaml written -> newest file written (file times)

    @property
    def finished(self) -> bool:
        """summary.json has its final form (grpolab train writes `steps` only at the very end) for
        every step there is, and every planned step is there (a resumed run with more steps is not)."""
        planned = self.steps_planned
        steps = len(self.step_rows)  # a row of step 0 (the evaluation before training) is not a step
        return self.summary.get("steps") == steps > 0 and (
            planned is None or steps >= planned or bool(self.summary.get("stopped_early"))
        )

    @property
    def step_rows(self) -> list[dict]:
        """The metrics of the training steps (step >= 1), without the evaluation row of step 0."""
        return [m for m in self.metrics if m["step"] >= 1]

    @property
    def steps_planned(self) -> int | None:
        steps = self.config.get("steps")
        return steps if isinstance(steps, int) else None

    def series(self, key: str, fill: float | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; a null (non-finite) value is NaN, a missing one is left out
        (or is `fill`: a count logged only at the steps where it is not 0)."""
        xs, ys = [], []
        for m in self.metrics:
            if key in m or fill is not None:
                v = m.get(key, fill)
                xs.append(m["step"])
                ys.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan"))
        return xs, ys


def read_records(path: Path, *, need_step: bool) -> tuple[list[dict], list[str]]:
    """(records, skipped "FILE:LINE" places). Only complete lines count: a last line without its
    newline is the one being written (or cut by a crash) and is skipped like any other bad line."""
    if not path.exists():
        return [], []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")  # the last element is "" when the file ends with a newline
    partial = lines[-1] if lines[-1].strip() else None
    complete = lines[:-1]
    kept: list[dict] = []
    good: set[str] = set()
    for where, rec in iter_jsonl(complete, str(path), strict=False):
        try:
            rec, _ = safe_data(rec)  # JSON's "\ud800" escape: a lone surrogate no UTF-8 page can hold
        except RecursionError:
            continue
        if need_step and not (isinstance(rec.get("step"), int) and not isinstance(rec.get("step"), bool)):
            continue
        kept.append(rec)
        good.add(where)
    skipped = [f"{path}:{n}" for n, line in enumerate(complete, start=1) if line.strip() and f"{path}:{n}" not in good]
    if partial is not None:
        skipped.append(f"{path}:{len(lines)} (incomplete last line)")
    return kept, skipped


def _by_step(records: list[dict]) -> list[dict]:
    """One record per step (the last one written wins, as after a resume), in step order."""
    out: dict[int, dict] = {}
    for r in records:
        out[r["step"]] = r
    return [out[s] for s in sorted(out)]


def load_run(path: str | Path, label: str | None = None) -> RunData:
    """The run in directory `path`; ConfigError (exit 2) when it is not a run directory."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{p}: not a grpolab run directory (no such directory)")
    if not (p / "metrics.jsonl").exists() and not (p / "config.yaml").exists():
        raise ConfigError(f"{p}: not a grpolab run directory (no metrics.jsonl or config.yaml)")
    run = RunData(path=p, label=label or p.resolve().name)
    cfg_path = p / "config.yaml"
    if cfg_path.exists():
        run.config_text = cfg_path.read_text(encoding="utf-8", errors="replace")
        try:
            loaded = yaml.safe_load(run.config_text)
        except yaml.YAMLError:
            loaded = None
        run.config = safe_data(loaded)[0] if isinstance(loaded, dict) else {}
    metrics, skipped = read_records(p / "metrics.jsonl", need_step=True)
    run.metrics = _by_step(metrics)
    samples, s_skipped = read_records(p / "samples.jsonl", need_step=True)
    run.samples = samples
    run.skipped = {k: v for k, v in (("metrics.jsonl", skipped), ("samples.jsonl", s_skipped)) if v}
    for name, attr in (("summary.json", "summary"), ("machine.json", "machine")):
        try:
            data = json.loads((p / name).read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            setattr(run, attr, safe_data(data)[0])
    times = [os.stat(p / n).st_mtime for n in ("metrics.jsonl", "samples.jsonl", "summary.json") if (p / n).exists()]
    if cfg_path.exists() and times:
        run.wall_s = max(0.0, max(times) - os.stat(cfg_path).st_mtime)
    return run


def load_runs(paths: list[str | Path]) -> list[RunData]:
    """Every run, labelled by its directory name; equal names get their parent's name too."""
    if not paths:
        raise ConfigError("report: give at least one run directory")
    resolved = [Path(x).resolve() for x in paths]
    names = [r.name for r in resolved]
    labels = [f"{r.parent.name}/{r.name}" if names.count(r.name) > 1 else r.name for r in resolved]
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):  # still equal (same directory twice): number them
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[i] = f"{lab} ({seen[lab]})"
    return [load_run(p, lab) for p, lab in zip(paths, labels)]


__all__ = ["RunData", "load_run", "load_runs", "read_records"]
