"""On --resume a run directory is data: nothing read from it chooses where a tracker writes or sends, no link
under a tracker's directory is followed out of it, and an invalid trackers.json is a usage error
(grpolab.training.trackers.state; docs/security.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpolab.training.metrics import MetricsLogger
from grpolab.training.trackers import installed
from grpolab.training.trackers.state import check_tracker_links, read_saved
from grpolab.util.fields import ConfigError


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"wandb": "x"}', "\ud800".encode("utf-8", "surrogatepass")])
def test_an_invalid_trackers_json_is_a_usage_error_naming_it(tmp_path, text):
    """Before: --resume exited 1 with a JSONDecodeError traceback."""
    path = tmp_path / "trackers.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match="trackers.json"):
        read_saved(path)
    with pytest.raises(ConfigError, match="trackers.json: .*delete it"):
        MetricsLogger(tmp_path, report_to=["tensorboard"], resume_step=1, log=lambda *_: None)


@pytest.mark.parametrize(
    "saved",
    [
        {"wandb": {"id": "../../elsewhere"}},
        {"mlflow": {"run_id": "'; drop table runs; --"}},
        {"trackio": {"name": "../x"}},
        {"trackio": {"name": "a\nb"}},
    ],
)
def test_saved_run_ids_must_have_their_librarys_form(tmp_path, saved):
    path = tmp_path / "trackers.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="is not a .* run id"):
        read_saved(path)


def test_trackers_json_is_never_read_through_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    (tmp_path / "out").mkdir()
    os.symlink(real, tmp_path / "out" / "trackers.json")
    with pytest.raises(ConfigError, match="symbolic link is never followed"):
        read_saved(tmp_path / "out" / "trackers.json")


@pytest.mark.skipif(not installed("mlflow"), reason="the mlflow extra is not installed")
def test_a_resumed_mlflow_run_never_writes_where_trackers_json_says(tmp_path, monkeypatch):
    """A planted `sqlite:///<elsewhere>/x.db` made the resumed run create and fill a database outside the run."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    logger = MetricsLogger(out, report_to=["mlflow"], log=lambda *_: None)
    logger.log({"step": 1, "reward/mean": 0.5})
    logger.close()
    saved = json.loads((out / "trackers.json").read_text())
    saved["mlflow"]["tracking_uri"] = f"sqlite:///{elsewhere / 'x.db'}"
    (out / "trackers.json").write_text(json.dumps(saved))
    logger = MetricsLogger(out, report_to=["mlflow"], resume_step=1, log=lambda *_: None)
    logger.log({"step": 2, "reward/mean": 0.75})
    logger.close()
    assert list(elsewhere.iterdir()) == []
    assert (out / "mlflow.db").stat().st_size > 0


def plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


@pytest.mark.parametrize(
    "where,names",
    [
        ("trackio/grpolab.db", ["trackio"]),
        ("mlartifacts/1/abc/artifacts/tables", ["mlflow"]),
        ("mlflow.db-journal", ["mlflow"]),
        ("wandb/offline-run-1-x/files/config.yaml", ["wandb"]),
        ("tb/events.out.tfevents.1", ["tensorboard"]),
    ],
)
def test_a_link_out_of_a_tracker_directory_is_refused(tmp_path, where, names):
    """Before: `trackio/grpolab.db -> <elsewhere>` got 192,512 bytes of SQLite written into the target."""
    out, target = tmp_path / "run", tmp_path / "victim"
    target.write_text("untouched")
    out.mkdir()
    plant(out / where, target)
    with pytest.raises(ConfigError, match="outside"):
        check_tracker_links(out, names)
    with pytest.raises(ConfigError, match="symbolic link"):
        MetricsLogger(out, report_to=names, resume_step=1, log=lambda *_: None)
    assert target.read_text() == "untouched"


def test_links_inside_a_tracker_directory_and_wandbs_own_are_allowed(tmp_path):
    out = tmp_path / "run"
    run = out / "wandb" / "offline-run-20260101_000000-abc"
    (run / "logs").mkdir(parents=True)
    plant(out / "wandb" / "latest-run", Path(run.name))  # relative, as wandb makes it
    plant(run / "logs" / "debug-core.log", tmp_path / "home" / ".cache" / "wandb" / "core.log")
    check_tracker_links(out, ["wandb", "mlflow", "trackio", "tensorboard"])
