"""Read back what each tracker wrote under a run directory, with the trackers' own readers where they
have one (MLflow's client, TensorBoard's EventAccumulator) and the documented file formats where they do
not (W&B's offline run file, trackio's SQLite store).

    tensorboard_scalars(out)  {tag: [(step, value), ...]}
    wandb_history(out)        ([{"_step": 1, "reward/mean": ...}, ...], config dict, {table name: [steps]})
    mlflow_run(out)           ({metric: [(step, value), ...]}, params dict, [artifact paths])
    trackio_rows(out)         ([(step, {metric: value}), ...], config dict)
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def tensorboard_texts(out: Path) -> dict[str, list[int]]:
    """Text entries (config, tables): {tag: [steps]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    return {t: [e.step for e in acc.Tensors(t)] for t in acc.Tags()["tensors"]}


def _wandb_records(path: Path):
    """The records of a W&B run file (.wandb): a 7-byte header (":W&B", magic 0xBEE1, version 0), then
    LevelDB-log records in 32 KiB blocks, each with a 7-byte header (CRC32C, length, type: 1 full,
    2 first, 3 middle, 4 last), a block's tail shorter than a header left zero. Each full record is a
    wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding
            pos += left
            continue
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            yield rec
            pending = b""


def wandb_history(out: Path) -> tuple[list[dict], dict, dict[str, list[int]]]:
    (run_file,) = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    rows, config, tables = [], {}, {}
    for rec in _wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row: dict = {}
            for i in rec.history.item:  # a key, or a nested key: ["samples", "_type"] -> row["samples"]["_type"]
                path = [i.key] if i.key else list(i.nested_key)
                node = row
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = json.loads(i.value_json)
            for k, v in row.items():
                if isinstance(v, dict) and v.get("_type") == "table-file":
                    tables.setdefault(k, []).append(row["_step"])
            rows.append(row)
        elif kind in ("run", "config"):
            for i in (rec.run.config if kind == "run" else rec.config).update:
                config[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return rows, config, tables


def mlflow_run(out: Path) -> tuple[dict[str, list[tuple[int, float]]], dict, list[str]]:
    from mlflow.tracking import MlflowClient

    saved = json.loads((out / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=saved["tracking_uri"])
    run = client.get_run(saved["run_id"])
    metrics = {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics
    }

    def files(path=None) -> list[str]:
        got = []
        for f in client.list_artifacts(run.info.run_id, path):
            got += files(f.path) if f.is_dir else [f.path]
        return got

    return metrics, run.data.params, files()


def trackio_rows(out: Path, project: str = "grpolab") -> tuple[list[tuple[int, dict]], dict]:
    con = sqlite3.connect(out / "trackio" / f"{project}.db")
    try:
        rows = [(step, json.loads(m)) for step, m in con.execute("SELECT step, metrics FROM metrics ORDER BY id")]
        (config,) = [json.loads(c) for (c,) in con.execute("SELECT config FROM configs")]
    finally:
        con.close()
    return rows, config
