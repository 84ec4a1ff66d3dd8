"""Weights & Biases, offline: a W&B run under OUT/wandb/offline-run-*/ (`wandb sync OUT/wandb/offline-run-*`
uploads it later).

The mode is WANDB_MODE when set (WANDB_MODE=online logs to the server as the run goes), else offline: the
run writes its local files and opens no connection. W&B's system-metrics sampler, git and code capture are
off. The config is the run's config; every metrics row is logged at its step; a table is a wandb.Table
under its name. A resumed run continues the same W&B run (its id is kept in OUT/trackers.json).
"""

from __future__ import annotations

import os

import wandb

from grpolab.training.trackers.base import Tracker, TrackerContext, scalars, table_data


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, ctx: TrackerContext) -> dict:
        mode = os.environ.get("WANDB_MODE") or "offline"
        wanted = dict(
            mode=mode,
            console="off",
            silent=True,
            disable_git=True,
            save_code=False,
            disable_code=True,
            x_disable_stats=True,
            x_disable_meta=True,
            x_save_requirements=False,
        )
        known = getattr(wandb.Settings, "model_fields", wanted)  # the settings this wandb version has
        settings = wandb.Settings(**{k: v for k, v in wanted.items() if k in known})
        run_id = ctx.saved.get("id") if ctx.resume_step is not None else None
        self.run = wandb.init(
            project=ctx.project,
            name=ctx.run_name,
            dir=str(ctx.out),
            config=ctx.config,
            id=run_id,
            resume="allow" if run_id else None,
            settings=settings,
        )
        return {"id": self.run.id}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        values = scalars(metrics)
        if values:
            self.run.log(values, step=step)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            cols, data = table_data(rows)
            self.run.log({name: wandb.Table(columns=cols, data=data)}, step=step)

    def finish(self) -> None:
        self.run.finish()


TRACKER = WandbTracker
