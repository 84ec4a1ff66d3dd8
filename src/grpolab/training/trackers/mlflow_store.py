"""MLflow: a run in a local SQLite store, OUT/mlflow.db with its artifacts in OUT/mlartifacts (`mlflow ui
--backend-store-uri sqlite:///OUT/mlflow.db`), or in the store MLFLOW_TRACKING_URI names when it is set.

SQLite is MLflow's recommended local backend (its ./mlruns file store is in maintenance mode, and it cannot
hold a metric `kl` beside a metric `kl/beta`: one would be a file, the other a directory of the same name).
The config is logged as the run's params (dotted keys, algo.beta) and as config.json; every metric at its
step, under a name MLflow accepts (`mlflow_name`: eval/pass@1 -> eval/pass_at_1); a table is one JSON
artifact per step it was logged at, tables/NAME/step-NNNNNN.json, in the {"columns", "data"} form of MLflow's
log_table. A resumed run continues the same MLflow run (its id is kept in OUT/trackers.json).
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from grpolab.training.trackers.base import Tracker, TrackerContext, flat_config, scalars, table_data

PARAM_VALUE_MAX = 6000  # MLflow's limit on a param's value
BATCH = 100  # params per log_batch call (MLflow's limit)


def mlflow_name(key: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, `_ - . : /` and spaces): `@` becomes `_at_`,
    any other character `_`. eval/pass@1 -> eval/pass_at_1."""
    return re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key.replace("@", "_at_"))


def check_artifacts(artifact_uri: str, out: Path) -> None:
    """In OUT's own store the run's artifacts must go under OUT/mlartifacts: the store (OUT/mlflow.db) is data
    of the run directory, and an experiment's artifact location read from it chooses nothing (a
    ValueError, which drops the tracker with a warning, before anything is logged)."""
    root = (out / "mlartifacts").as_uri()
    if not (artifact_uri == root or artifact_uri.startswith(root + "/")):
        raise ValueError(
            f"the MLflow store in {out / 'mlflow.db'} puts this run's artifacts at {artifact_uri[:200]!r}, "
            f"outside {out / 'mlartifacts'}: refused (a run directory does not choose where to write)"
        )


class MlflowTracker(Tracker):
    name = "mlflow"

    def start(self, ctx: TrackerContext) -> dict:
        out = ctx.out.resolve()
        resuming = ctx.resume_step is not None
        chosen = os.environ.get("MLFLOW_TRACKING_URI")
        # never the `tracking_uri` saved in OUT/trackers.json: a run directory does not choose where to write
        uri = chosen or f"sqlite:///{out / 'mlflow.db'}"
        for name in ("alembic", "mlflow.store.db.utils"):  # creating the database's tables: not news
            logging.getLogger(name).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=uri)
        run_id = ctx.saved.get("run_id") if resuming else None
        if run_id and ctx.saved.get("tracking_uri", uri) != uri:
            run_id = None  # it was tracked in another store: a new run in this one
        if run_id:
            run = self.client.get_run(run_id)
            if not chosen:
                check_artifacts(run.info.artifact_uri, out)
            self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        else:
            exp = self.client.get_experiment_by_name(ctx.project)
            exp_id = (
                exp.experiment_id
                if exp is not None
                else self.client.create_experiment(ctx.project, artifact_location=(out / "mlartifacts").as_uri())
            )
            info = self.client.create_run(exp_id, run_name=ctx.run_name).info
            if not chosen:
                check_artifacts(info.artifact_uri, out)
            run_id = info.run_id
            params = [Param(mlflow_name(k), str(v)[:PARAM_VALUE_MAX]) for k, v in flat_config(ctx.config).items()]
            for i in range(0, len(params), BATCH):
                self.client.log_batch(run_id, params=params[i : i + BATCH])
            self.client.log_dict(run_id, ctx.config, "config.json")
        self.run_id = run_id
        return {"run_id": run_id, "tracking_uri": uri}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), now, step) for k, v in scalars(metrics).items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit on metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            cols, data = table_data(rows)
            self.client.log_dict(
                self.run_id, {"columns": cols, "data": data}, f"tables/{mlflow_name(name)}/step-{step:06d}.json"
            )

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKER = MlflowTracker
__all__ = ["TRACKER", "mlflow_name"]
