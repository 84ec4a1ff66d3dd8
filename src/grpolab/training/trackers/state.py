"""What a resumed run reads of its trackers from the run directory, as data that chooses nothing.

A run directory may come from elsewhere (copied, downloaded, prepared by someone else), so on `--resume`:

- OUT/trackers.json must be a JSON object of objects (else a usage error naming the file, exit 2), read
  without following a link (O_NOFOLLOW); each tracker's saved ids are checked against the form its
  library gives them (`valid_state`: an MLflow run id is 32 hex digits, a W&B run id letters, digits,
  `-` and `_`, a trackio run name printable text): anything else is a usage error naming the entry.
- Where a tracker writes or sends is never read from it: MLflow's tracking URI is MLFLOW_TRACKING_URI or
  OUT/mlflow.db (the `tracking_uri` it holds is a record, not a setting), trackio's store TRACKIO_DIR or
  OUT/trackio, W&B's directory OUT.
- No link under the trackers' directories leads out of them (`check_tracker_links`: every entry of OUT/tb,
  OUT/wandb, OUT/mlartifacts, OUT/trackio, walked without following links, and the files beside
  OUT/mlflow.db): a link whose target lies outside its tracker's directory is a usage error naming it.
  W&B's own links (`latest-run`, `debug.log`) point inside OUT/wandb; the one it makes to its core's log
  in ~/.cache/wandb (`<run>/logs/debug-core.log`, never written through on resume) is allowed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from grpolab.util.fields import ConfigError

TRACKER_DIRS = {"tensorboard": "tb", "wandb": "wandb", "mlflow": "mlartifacts", "trackio": "trackio"}
"""Tracker -> its directory under OUT (walked for links)."""
MAX_STATE_BYTES = 1 << 20

ID_FORMS = {
    "mlflow": {"run_id": re.compile(r"[0-9a-f]{32}")},
    "wandb": {"id": re.compile(r"[A-Za-z0-9_-]{1,64}")},
    "trackio": {"name": re.compile(r"[^\x00-\x1f\x7f/\\]{1,200}")},
}
"""Tracker -> saved key -> the whole-string form its value must have to be used on resume."""


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path}: {why}; it records the trackers' run ids for --resume: repair it, or delete it to continue "
        "the run in new tracker runs (docs/security.md)"
    )


def valid_state(name: str, state: object, path: Path) -> dict:
    """A tracker's saved state, checked (ConfigError naming the entry when it is not the form its library
    gives it)."""
    if not isinstance(state, dict):
        raise _refuse(path, f"the entry {name!r} is a {type(state).__name__}, not an object")
    for key, form in ID_FORMS.get(name, {}).items():
        value = state.get(key)
        if value is not None and not (isinstance(value, str) and form.fullmatch(value)):
            raise _refuse(path, f"{name}.{key} = {str(value)[:80]!r} is not a {name} run id")
    return state


def read_saved(path: Path) -> dict:
    """OUT/trackers.json as {tracker: its saved state} ({} where it does not exist), read without following a
    link; ConfigError (exit 2) when it is not a JSON object of objects of the expected forms."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise _refuse(path, f"cannot be read ({e.strerror or e}; a symbolic link is never followed)") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise _refuse(path, f"is larger than {MAX_STATE_BYTES} bytes")
    try:
        saved = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _refuse(path, f"is not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(saved, dict):
        raise _refuse(path, f"holds a {type(saved).__name__}, not an object")
    return {str(k): valid_state(str(k), v, path) for k, v in saved.items()}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_tracker_links(out: Path, names: list[str]) -> None:
    """ConfigError naming the first link under a tracker's directory (or beside OUT/mlflow.db) whose target
    lies outside that directory (see the module docstring)."""
    out = Path(out)
    if "mlflow" in names and out.is_dir():
        for entry in os.scandir(out):
            if entry.name.startswith("mlflow.db") and entry.is_symlink():  # its journal, WAL, shared memory
                raise _link_error(Path(entry.path), out)
    for name in names:
        top = out / TRACKER_DIRS.get(name, "")
        if name not in TRACKER_DIRS or top.is_symlink() or not top.is_dir():
            continue  # a link at the top is refused with the run's other entries (RUN_ENTRIES)
        root = os.path.realpath(top)
        for here, dirs, files in os.walk(top, followlinks=False):
            for entry in dirs + files:
                p = os.path.join(here, entry)
                if os.path.islink(p) and not _inside(os.path.realpath(p), root) and not _own_link(name, top, p):
                    raise _link_error(Path(p), top)


OWN_LINKS = {"wandb": re.compile(r"(offline-)?run-[^/]+/logs/debug-core\.log")}
"""Links a tracker makes itself that lead out of its directory and that it never writes through: W&B links
each run's logs/debug-core.log to its core's log in ~/.cache/wandb (a resumed run gets a new run directory)."""


def _own_link(name: str, top: Path, path: str) -> bool:
    form = OWN_LINKS.get(name)
    return form is not None and form.fullmatch(os.path.relpath(path, top).replace(os.sep, "/")) is not None


def _link_error(path: Path, root: Path) -> ConfigError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return ConfigError(
        f"{path} is a symbolic link to {target}, outside {root}: a tracker would write through it; grpolab "
        "follows no link out of a run directory (remove it, or choose another out=DIR; docs/security.md)"
    )


__all__ = ["ID_FORMS", "TRACKER_DIRS", "check_tracker_links", "read_saved", "valid_state"]
