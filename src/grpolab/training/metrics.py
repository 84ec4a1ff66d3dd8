"""Where numbers go: metrics.jsonl (one object per step), samples.jsonl, TensorBoard, the console.

read_jsonl (re-exported from grpolab.util.fileio) reads them back, skipping a line cut by a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

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


__all__ = ["JsonlWriter", "MetricsLogger", "read_jsonl", "truncate_after_step", "weighted_mean"]
