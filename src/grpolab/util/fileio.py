"""Files grpolab writes and reads: one atomic write, one JSONL reader."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

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


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once, at import (os.umask can only be read by setting it)


def not_a_link_error(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} is a symbolic link: grpolab does not follow links to the files of a run "
        f"directory (remove it, or choose another out=DIR; docs/security.md)"
    )


def open_append(path: str | Path):
    """`path` opened for appending text (created 0666 & ~umask if missing), never through a symbolic
    link (O_NOFOLLOW): a link there is a ConfigError, whatever it points to."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise not_a_link_error(path) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def atomic_write(path: str | Path, data: str | bytes, *, fsync: bool = True) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never half.

    The bytes go to a temporary file in the same directory, created with an unpredictable name and
    O_EXCL (tempfile.mkstemp: never an existing file or a planted link), are fsynced, and replace
    `path` with os.replace (atomic on POSIX within one file system; a link at `path` is replaced, not
    followed). The file gets mode 0666 & ~umask, as open() would give it. On any error the temporary
    file is removed and `path` is untouched.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
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
        except RecursionError as e:
            if strict:
                raise ConfigError(f"{where}: JSON nested too deeply") from e
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


__all__ = ["atomic_write", "fsync_dir", "iter_jsonl", "not_a_link_error", "open_append", "parse_jsonl", "read_jsonl"]
