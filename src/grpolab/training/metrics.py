"""Where numbers go: metrics.jsonl (one object per step), samples.jsonl, the trackers (TensorBoard, W&B,
MLflow, trackio: grpolab.training.trackers), the console; and which run directory they may go into
(check_out_dir; docs/security.md, "The run directory").

read_jsonl (re-exported from grpolab.util.fileio) reads them back, skipping a line cut by a crash."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write, not_a_link_error, open_append, parse_jsonl, read_jsonl


def _clean(v):
    """JSON-safe value: NaN/inf become null, also inside dicts and lists (a number we do not have is
    not printed as one, and `NaN` is not JSON)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlWriter:
    """Append-only JSONL file, flushed after every record so a killed run loses at most one line."""

    def __init__(self, path: Path, keep_until_step: int | None = None):
        self.path = Path(path)
        if self.path.is_symlink():
            raise not_a_link_error(self.path)
        if keep_until_step is not None and self.path.exists():
            truncate_after_step(self.path, keep_until_step)
        self.f = open_append(self.path)  # never through a symbolic link

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(_clean(record), ensure_ascii=False, allow_nan=False) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def truncate_after_step(path: Path, step: int) -> None:
    """Keep only records with step <= `step` (resume after a crash must not duplicate steps). Atomic."""
    text = Path(path).read_text(encoding="utf-8")
    keep = [rec for _, rec in parse_jsonl(text, str(path), strict=False) if rec.get("step", 0) <= step]
    atomic_write(path, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in keep))


class MetricsLogger:
    """Where every metrics row and table of a run goes: metrics.jsonl and the trackers of `report_to`
    (grpolab.training.trackers: TensorBoard, W&B, MLflow, trackio), then the listeners (the run's callbacks).

        logger.log(row)                       a row of metrics.jsonl ({"step": 3, "reward/mean": ...}),
                                              also sent to every tracker and listener
        logger.track(row)                     a row for the trackers and listeners only, not metrics.jsonl
                                              (the held-out evaluation before and after training)
        logger.log_table("samples", rows, 3)  a table (the step's samples, an evaluation's completions)

    Any row is forwarded whole: evaluation rows (eval/accuracy, eval/pass@1, eval/pass@1_ci_low, ...) reach
    the trackers exactly as training rows do. report_to: tracker names (True: ["tensorboard"], False: []).
    A tracker that raises is dropped with one warning: a tracker never costs the run.
    """

    STATE = "trackers.json"

    def __init__(
        self,
        out: Path,
        report_to=("tensorboard",),
        resume_step: int | None = None,
        *,
        config: dict | None = None,
        run_name: str = "",
        project: str = "grpolab",
        log=print,
        listeners=(),
    ):
        from grpolab.training.trackers import TRACKERS, TrackerContext, build_tracker
        from grpolab.training.trackers.state import check_tracker_links, read_saved

        out = Path(out)
        self.jsonl = JsonlWriter(out / "metrics.jsonl", keep_until_step=resume_step)
        self.log_fn = log
        self.listeners = list(listeners)
        names = (["tensorboard"] if report_to else []) if isinstance(report_to, bool) else list(report_to)
        state_path = out / self.STATE
        for entry in ([out / "tb"] if "tensorboard" in names else []) + [state_path]:
            if entry.is_symlink():
                raise not_a_link_error(entry)
        check_tracker_links(out, names)  # nothing under OUT chooses where a tracker writes (docs/security.md)
        saved = read_saved(state_path) if resume_step is not None else {}
        self.trackers, where = [], []
        for name in names:
            try:
                tracker = build_tracker(name)
            except ConfigError as e:  # found before the run but failing to import: not worth the run
                log(f"warning: {e}; the run goes on without it")
                continue
            ctx = TrackerContext(
                out=out,
                config=config or {},
                run_name=run_name or out.resolve().name,
                project=project,
                resume_step=resume_step,
                saved=saved.get(name) or {},
            )
            self.trackers.append(tracker)
            state = self._call(tracker, "start", ctx)
            if state is not None:  # None: it failed and was dropped
                saved[name] = state
                place = state.get("store") or state.get("tracking_uri") or out / TRACKERS[name].files
                where.append(f"{name} ({place})")
        if names:
            atomic_write(state_path, json.dumps(saved, indent=2) + "\n")
        if any(t.name != "tensorboard" for t in self.trackers):
            log("trackers: " + ", ".join(where))

    def _call(self, tracker, hook: str, *args):
        """tracker.hook(*args); a failure warns once and drops the tracker (returns None)."""
        try:
            result = getattr(tracker, hook)(*args)
            return {} if result is None else result
        except Exception as e:  # noqa: BLE001 (a full disk, a server that refuses: the run goes on)
            self.log_fn(
                f"warning: {tracker.name}: {hook} failed ({type(e).__name__}: {e}); "
                f"{tracker.name} logs nothing more for this run (metrics.jsonl is still written)"
            )
            if tracker in getattr(self, "trackers", ()):
                self.trackers.remove(tracker)
            return None

    def log(self, record: dict) -> None:
        self.jsonl.write(record)
        self.track(record)

    def track(self, record: dict) -> None:
        step = int(record["step"])
        for t in list(self.trackers):
            self._call(t, "log_metrics", record, step)
        for listener in self.listeners:
            listener(record)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        for t in list(self.trackers):
            self._call(t, "log_table", name, rows, step)

    def close(self) -> None:
        self.jsonl.close()
        for t in list(self.trackers):
            self._call(t, "finish")
        self.trackers = []


def eval_row(step: int, result: dict) -> dict:
    """A held-out evaluation's numbers as a row for the trackers and callbacks: {"step": step,
    "eval/accuracy": ..., "eval/reward": ..., "eval/length": ..., "eval/n": ...} (its text fields left out)."""
    return {
        "step": step,
        **{f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
    }


def sample_table(records: list[dict]) -> list[dict]:
    """samples.jsonl records as the trackers' "samples" table: without the per-token values (`tokens`),
    which stay in samples.jsonl and the report."""
    return [{k: v for k, v in r.items() if k != "tokens"} for r in records]


# What grpolab writes directly in a run directory. None of them may be a symbolic link (nor `out` hold
# anything else when a new run starts): a directory prepared with `samples.jsonl -> victim` or
# `tb -> victim_dir` would have the trainer append to or write into the link's target.
RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "summary.json",
    "restarts.jsonl",
    "precision.json",
    "threads.json",
    "machine.json",
    "report.html",
    "report_plots",
    "dataset.jsonl",
    "eval_dataset.jsonl",
    "tb",
    "checkpoints",
    "trackers.json",
    "wandb",
    "mlflow.db",
    "mlartifacts",
    "trackio",
)
NEW_RUN_LEFTOVERS = ("dataset.jsonl", "eval_dataset.jsonl")  # written by grpolab.train before the run itself starts


def check_out_dir(out: Path, resume: bool, auto: bool = False) -> bool:
    """Refuse to overwrite an existing run (exit 2) unless resuming it. Returns whether the run in `out`
    is continued: `resume` (--resume), or `auto` (resume=auto) and `out` holds a run (its config.yaml).

    A new run goes into a directory that does not exist yet, an empty one, or one holding only what
    grpolab.train wrote for it (dataset.jsonl); any other content is a ConfigError. No entry of
    RUN_ENTRIES may be a symbolic link, in a new run or a resumed one (docs/security.md)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is not a directory; choose a new or empty directory for out=DIR")
    for name in RUN_ENTRIES:
        if (out / name).is_symlink():
            raise not_a_link_error(out / name)
    if auto and not resume:
        resume = (out / "config.yaml").exists()
    if resume:
        if not (out / "config.yaml").exists():
            from grpolab.training.config import not_a_run_message

            raise ConfigError(not_a_run_message(out))
        return True
    if out.exists() and any((out / n).exists() for n in ("metrics.jsonl", "config.yaml", "checkpoints")):
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        hint = (
            f" torchrun restarted this worker (restart {restarted}): start the job with resume=auto so that a "
            f"restart continues the newest checkpoint (docs/distributed.md);"
            if restarted
            else ""
        )
        raise ConfigError(
            f"out: {out} already holds a run;{hint} continue it with `grpolab train --resume {out}` "
            f"(or run the same command with resume=auto) or choose another out=DIR (nothing was written)"
        )
    if out.is_dir():
        try:
            names = sorted(os.listdir(out))
        except OSError as e:
            raise ConfigError(
                f"out: cannot read {out} ({e.strerror}); choose a new or empty directory for out=DIR"
            ) from e
        other = [n for n in names if n not in NEW_RUN_LEFTOVERS or not (out / n).is_file()]
        if other:
            shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
            raise ConfigError(
                f"out: {out} is not empty and holds no run ({shown}); a new run is written only into a "
                f"new or empty directory: choose another out=DIR (nothing was written)"
            )
    return False


def make_out_dir(out: Path) -> None:
    """Create the run directory (ConfigError, exit 2, when it cannot be: `out=/proc/x`, a read-only disk)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"out: cannot create {out} ({e.strerror or e}); choose a writable directory for out=DIR"
        ) from e


def weighted_mean(items: list[tuple[dict, float]]) -> dict:
    """Average dicts of floats with weights (micro-batch metrics weighted by their token count)."""
    tot: dict[str, float] = {}
    wsum: dict[str, float] = {}
    for d, w in items:
        for k, v in d.items():
            v = float(v)
            tot[k] = tot.get(k, 0.0) + v * w
            wsum[k] = wsum.get(k, 0.0) + w
    return {k: tot[k] / wsum[k] for k in tot if wsum[k] > 0}


class NoFile:
    """metrics.jsonl / samples.jsonl of a rank other than 0: written by rank 0 only."""

    def log(self, record: dict) -> None:
        pass

    def track(self, record: dict) -> None:
        pass

    def log_table(self, name: str, rows: list, step: int) -> None:
        pass

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


__all__ = [
    "NEW_RUN_LEFTOVERS",
    "RUN_ENTRIES",
    "JsonlWriter",
    "MetricsLogger",
    "NoFile",
    "check_out_dir",
    "eval_row",
    "make_out_dir",
    "read_jsonl",
    "sample_table",
    "truncate_after_step",
    "weighted_mean",
]
