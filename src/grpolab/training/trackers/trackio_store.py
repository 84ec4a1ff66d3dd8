"""trackio: a run in trackio's local SQLite store OUT/trackio/PROJECT.db (`TRACKIO_DIR=OUT/trackio trackio
show --project PROJECT` opens its dashboard), or in the directory TRACKIO_DIR names when it is set.

trackio reads TRACKIO_DIR once, when it is first imported: this module sets it to OUT/trackio before that
import. In a process that had already imported trackio (a notebook that trains twice), the store stays
where trackio put it, and the run says where. The config, every metric at its step, and each table as a
trackio.Table under its name are logged; a resumed run continues the trackio run of the same name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import os
import sys

from grpolab.training.trackers.base import Tracker, TrackerContext, scalars, table_data

if importlib.util.find_spec("trackio") is None:  # imported in start(), once TRACKIO_DIR is set
    raise ImportError("No module named 'trackio'")


class TrackioTracker(Tracker):
    name = "trackio"

    def start(self, ctx: TrackerContext) -> dict:
        if "trackio" not in sys.modules:
            os.environ.setdefault("TRACKIO_DIR", str((ctx.out / "trackio").resolve()))
        import trackio
        from trackio.utils import TRACKIO_DIR

        self.trackio = trackio
        self.store = TRACKIO_DIR
        if ctx.resume_step is not None and ctx.saved.get("name"):
            name, resume = ctx.saved["name"], "allow"
        else:
            name, resume = ctx.run_name, "never"
        options = dict(embed=False, auto_log_cpu=False, auto_log_gpu=False)  # no dashboard, no system sampler
        known = inspect.signature(trackio.init).parameters
        with contextlib.redirect_stdout(io.StringIO()):  # its dashboard hints assume the default store
            self.run = trackio.init(
                project=ctx.project,
                name=name,
                config=ctx.config,
                resume=resume,
                **{k: v for k, v in options.items() if k in known},
            )
        return {"name": name, "store": str(TRACKIO_DIR)}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        values = scalars(metrics)
        if values:
            self.run.log(values, step=step)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            cols, data = table_data(rows)
            self.run.log({name: self.trackio.Table(columns=cols, data=data)}, step=step)

    def finish(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()
        current = getattr(self.trackio, "context_vars", None)
        if current is not None and current.current_run.get() is self.run:
            current.current_run.set(None)  # finished: trackio's exit handler has nothing left to finish


TRACKER = TrackioTracker
