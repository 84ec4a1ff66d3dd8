"""Experiment trackers: where a run's config, metrics, tables and samples go besides metrics.jsonl.

    report_to=[tensorboard, wandb, mlflow, trackio]     (or one name, `none`, or `all`)

Each tracker is one small module behind grpolab.training.trackers.base.Tracker, listed in TRACKERS with
the package it needs and the extra that installs it. Every one writes local files under OUT, with nothing
sent over the network unless its own environment variable asks for it (docs/metrics.md, "Trackers"):

    tensorboard   OUT/tb/            event files (the core install)
    wandb         OUT/wandb/         an offline W&B run (WANDB_MODE=offline unless set), `pip install grpolab[wandb]`
    mlflow        OUT/mlflow.db      MLflow's local SQLite store (unless MLFLOW_TRACKING_URI is set), grpolab[mlflow]
    trackio       OUT/trackio/       trackio's local SQLite store (unless TRACKIO_DIR is set), grpolab[trackio]
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
from dataclasses import dataclass

from grpolab.training.trackers.base import Tracker, TrackerContext
from grpolab.util.fields import ConfigError


@dataclass(frozen=True)
class TrackerSpec:
    """A tracker's module, the packages it imports, and the extra of grpolab that installs them."""

    module: str
    packages: tuple[str, ...]
    extra: str | None
    files: str


TRACKERS: dict[str, TrackerSpec] = {
    "tensorboard": TrackerSpec("grpolab.training.trackers.tensorboard_events", ("tensorboard",), None, "tb/"),
    "wandb": TrackerSpec("grpolab.training.trackers.wandb_offline", ("wandb",), "wandb", "wandb/"),
    "mlflow": TrackerSpec(
        "grpolab.training.trackers.mlflow_store", ("mlflow", "sqlalchemy", "alembic"), "mlflow", "mlflow.db"
    ),
    "trackio": TrackerSpec("grpolab.training.trackers.trackio_store", ("trackio",), "trackio", "trackio/"),
}
"""Tracker name -> its spec. A new tracker is a module with a `Tracker` subclass named TRACKER, and one line here."""

# Each library's own switch for the usage reports it would otherwise send (set unless the user set them).
QUIET_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "WANDB_DISABLE_CODE": "true",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


def resolve_report_to(value, tensorboard: bool | None = None) -> list[str]:
    """The trackers a run reports to, as a list of known names without repeats.

    value: a name, a list of names, "none" (no tracker) or "all" (tensorboard and every other tracker whose
    package is installed); tensorboard: the older switch, folded in (True adds tensorboard, False removes
    it, None leaves the list as it is). Raises ConfigError naming an unknown tracker."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"report_to: expected a tracker name or a list of them ({', '.join(TRACKERS)}, none, all), got {value!r}"
        )
    names = [v.strip().lower() for v in value]
    if "none" in names and len(names) > 1:
        raise ConfigError(f"report_to: `none` means no tracker and cannot be listed with others ({value!r})")
    out: list[str] = []
    for n in names:
        if n == "none":
            continue
        expanded = [t for t in TRACKERS if t == "tensorboard" or installed(t)] if n == "all" else [n]
        for t in expanded:
            if t not in TRACKERS:
                close = difflib.get_close_matches(t, [*TRACKERS, "none", "all"], n=1)
                hint = f" Did you mean {close[0]}?" if close else ""
                raise ConfigError(f"report_to: unknown tracker {t!r}.{hint} Known: {', '.join(TRACKERS)}, none, all")
            if t not in out:
                out.append(t)
    if tensorboard is True and "tensorboard" not in out:
        out.insert(0, "tensorboard")
    if tensorboard is False and "tensorboard" in out:
        out.remove("tensorboard")
    return out


def missing(name: str) -> list[str]:
    """The packages tracker `name` needs that cannot be found (looked up, not imported)."""

    def found(package: str) -> bool:
        try:
            return importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a parent that fails, or sys.modules[package] = None
            return False

    return [p for p in TRACKERS[name].packages if not found(p)]


def installed(name: str) -> bool:
    """Whether every package tracker `name` needs can be found."""
    return not missing(name)


def missing_message(name: str, error: BaseException | None = None) -> str:
    spec = TRACKERS[name]
    gone = missing(name) or list(spec.packages)
    how = f"pip install 'grpolab[{spec.extra}]'" if spec.extra else f"pip install {' '.join(gone)}"
    why = f" ({type(error).__name__}: {error})" if error is not None else ""
    what = " and ".join(f"`{p}`" for p in gone)
    return (
        f"report_to: {name} needs {what}, not installed{why}; install the `{spec.extra or spec.packages[0]}` "
        f"extra: {how}, or leave {name} out of report_to"
    )


def check_installed(names: list[str]) -> None:
    """Before the run loads or writes anything: ConfigError (exit 2) naming the extra to install for the
    first tracker whose packages cannot be found."""
    for n in names:
        if not installed(n):
            raise ConfigError(missing_message(n))


def quiet_environment() -> None:
    """Turn off the trackers' usage reports (os.environ.setdefault: a value the user set is kept)."""
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)


def build_tracker(name: str) -> Tracker:
    """A new tracker by name (its module is imported now: an uninstalled package raises ConfigError)."""
    spec = TRACKERS[name]
    quiet_environment()
    try:
        module = importlib.import_module(spec.module)
    except ImportError as e:
        raise ConfigError(missing_message(name, e)) from e
    return module.TRACKER()


__all__ = [
    "TRACKERS",
    "Tracker",
    "TrackerContext",
    "TrackerSpec",
    "build_tracker",
    "check_installed",
    "installed",
    "missing",
    "missing_message",
    "quiet_environment",
    "resolve_report_to",
]
