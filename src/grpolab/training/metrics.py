"""Where numbers go: metrics.jsonl (one object per step), samples.jsonl, TensorBoard, the console; and
which run directory they may go into (check_out_dir; docs/security.md, "The run directory").

read_jsonl (re-exported from grpolab.util.fileio) reads them back, skipping a line cut by a crash."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from grpolab.util.fields import ConfigError
from grpolab.util.fileio import (
    atomic_write,
    not_a_link_error,
    open_append,
    parse_jsonl,
    read_jsonl,
)


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
    """metrics.jsonl + TensorBoard scalars, one call per step."""

    def __init__(self, out: Path, tensorboard: bool, resume_step: int | None = None):
        self.jsonl = JsonlWriter(out / "metrics.jsonl", keep_until_step=resume_step)
        self.tb = None
        if tensorboard and (out / "tb").is_symlink():
            raise not_a_link_error(out / "tb")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tb"), purge_step=(resume_step + 1) if resume_step is not None else None)
            except ImportError:  # tensorboard is a declared dependency; be graceful if it is gone
                print("warning: tensorboard is not installed; pip install tensorboard (metrics.jsonl is still written)")

    def log(self, record: dict) -> None:
        self.jsonl.write(record)
        if self.tb is not None:
            step = record["step"]
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


# What grpolab writes directly in a run directory. None of them may be a symbolic link (nor `out` hold
# anything else when a new run starts): a directory prepared with `samples.jsonl -> victim` or
# `tb -> victim_dir` would have the trainer append to or write into the link's target.
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "restarts.jsonl",
               "precision.json", "machine.json", "report.html", "report_plots", "dataset.jsonl", "tb", "checkpoints")
NEW_RUN_LEFTOVERS = ("dataset.jsonl",)  # written by grpolab.train before the run itself starts


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
        hint = (f" torchrun restarted this worker (restart {restarted}): start the job with resume=auto so that a "
                f"restart continues the newest checkpoint (docs/distributed.md);" if restarted else "")
        raise ConfigError(f"out: {out} already holds a run;{hint} continue it with `grpolab train --resume {out}` "
                          f"(or run the same command with resume=auto) or choose another out=DIR (nothing was written)")
    if out.is_dir():
        try:
            names = sorted(os.listdir(out))
        except OSError as e:
            raise ConfigError(f"out: cannot read {out} ({e.strerror}); choose a new or empty directory for out=DIR") from e
        other = [n for n in names if n not in NEW_RUN_LEFTOVERS or not (out / n).is_file()]
        if other:
            shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
            raise ConfigError(f"out: {out} is not empty and holds no run ({shown}); a new run is written only into a "
                              f"new or empty directory: choose another out=DIR (nothing was written)")
    return False


def make_out_dir(out: Path) -> None:
    """Create the run directory (ConfigError, exit 2, when it cannot be: `out=/proc/x`, a read-only disk)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"out: cannot create {out} ({e.strerror or e}); choose a writable directory for out=DIR") from e


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


__all__ = ["NEW_RUN_LEFTOVERS", "RUN_ENTRIES", "JsonlWriter", "MetricsLogger", "check_out_dir", "make_out_dir", "read_jsonl", "truncate_after_step", "weighted_mean"]
