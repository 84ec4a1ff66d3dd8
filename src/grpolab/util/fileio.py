"""Files grpolab writes and reads: one atomic write, one JSONL reader."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from grpolab.util.fields import ConfigError


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename inside it is durable (best effort: not every OS allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: str | bytes, *, fsync: bool = True) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never half.

    The bytes go to a temporary file in the same directory, are fsynced, and replace `path` with
    os.replace (atomic on POSIX within one file system). On any error the temporary file is removed
    and `path` is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)


def iter_jsonl(lines: Iterable[str], source: str, *, strict: bool) -> Iterator[tuple[str, dict]]:
    """("SOURCE:LINE", record) for each non-blank line, lazily (a large file is read only as far as
    the caller iterates).

    strict=True: a line that is not JSON, or not a JSON object, is a ConfigError naming SOURCE:LINE.
    strict=False: such lines are skipped (a line cut by a crash at the end of a log).
    """
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if strict:
                raise ConfigError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
            continue
        if not isinstance(rec, dict):
            if strict:
                raise ConfigError(f"{where}: expected a JSON object per line, got {type(rec).__name__}")
            continue
        yield where, rec


def parse_jsonl(text: str, source: str, *, strict: bool) -> list[tuple[str, dict]]:
    """[("SOURCE:LINE", record)] for each non-blank line of `text` (see iter_jsonl)."""
    return list(iter_jsonl(text.splitlines(), source, strict=strict))


def read_jsonl(path: str | Path, *, strict: bool = False) -> list[dict]:
    """The JSON objects of a JSONL file, in order. strict: see parse_jsonl (default: skip bad lines)."""
    path = Path(path)
    return [rec for _, rec in parse_jsonl(path.read_text(encoding="utf-8"), str(path), strict=strict)]


__all__ = ["atomic_write", "fsync_dir", "iter_jsonl", "parse_jsonl", "read_jsonl"]
