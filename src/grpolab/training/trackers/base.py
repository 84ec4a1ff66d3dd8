"""What every tracker implements, and the value conversions they share.

A tracker receives, from grpolab.training.metrics.MetricsLogger on rank 0:

    start(ctx)                          once, before step 1: the run's config (and, resuming, its saved state)
    log_metrics(metrics, step)          every row logged: the finite numbers of a metrics.jsonl row
                                        (training rows, evaluation rows such as eval/accuracy)
    log_table(name, rows, step)         a table: the step's samples ("samples"), an evaluation's completions
    finish()                            once, at the end (also after a stop or a crash)

It returns from start() the small dict it needs to continue the same tracked run when the run is
resumed (its run id); that dict is kept in OUT/trackers.json.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrackerContext:
    """What a tracker knows of the run it follows."""

    out: Path
    """The run directory: every tracker writes its local files under it."""
    config: dict
    """The run's config as plain data (config.yaml's content)."""
    run_name: str
    """The run's name in the tracker (the `run_name` setting, else OUT's directory name)."""
    project: str
    """The W&B project, MLflow experiment and trackio project (the `project` setting)."""
    resume_step: int | None = None
    """The step a resumed run continues after; None for a new run."""
    saved: dict = field(default_factory=dict)
    """What this tracker's start() returned in the run's previous process (OUT/trackers.json), else {}."""


class Tracker:
    """One experiment tracker (see the module docstring). Subclasses set `name` and override the hooks."""

    name = ""

    def start(self, ctx: TrackerContext) -> dict:
        return {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a metrics row, without `step` (booleans, strings, None, NaN and inf are left out:
    a tracker plots numbers, and a number we do not have is not plotted as one)."""
    return {
        k: v
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def table_columns(rows: list[dict]) -> list[str]:
    """The columns of a table: every key of the rows, in the order they first appear."""
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def cell(value):
    """A table cell a tracker stores as it is: a number, a string, a boolean or None; anything else (a dict
    of per-function rewards, a conversation) as its JSON text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return json.dumps(value, ensure_ascii=False, default=str)


def table_data(rows: list[dict]) -> tuple[list[str], list[list]]:
    """(columns, one list of cells per row), missing cells None."""
    cols = table_columns(rows)
    return cols, [[cell(r.get(c)) for c in cols] for r in rows]


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """{"algo": {"beta": 0.04}} -> {"algo.beta": 0.04}: a nested config as dotted keys (MLflow's params)."""
    out: dict[str, object] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{key}."))
        else:
            out[key] = v
    return out


__all__ = ["Tracker", "TrackerContext", "cell", "flat_config", "scalars", "table_columns", "table_data"]
