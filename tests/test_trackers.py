"""Experiment trackers (report_to): the setting's parsing and its old `tensorboard` switch, each tracker's
local files read back (TensorBoard events, the offline W&B run, MLflow's SQLite store, trackio's store)
holding the config, every metric row including evaluation rows, and the tables; a resumed logger continuing
the same tracked runs; a missing extra refused before the run (exit 2); a failing tracker costing only a
warning; and a tiny `grpolab train` run with all four trackers and no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tracker_readers as readers
import yaml

from grpolab.app.cli import main
from grpolab.training.config import build_config
from grpolab.training.metrics import MetricsLogger, read_jsonl
from grpolab.training.trackers import TRACKERS, TrackerSpec, resolve_report_to
from grpolab.training.trackers.base import flat_config, scalars, table_data
from grpolab.training.trackers.mlflow_store import mlflow_name
from grpolab.training.trackers.tensorboard_events import markdown_table
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ALL = ["tensorboard", "wandb", "mlflow", "trackio"]


def offline_prefix() -> list[str]:
    """`unshare -n` (a network namespace with no interface up: any connection fails) where permitted."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n"]
    return []


# Loaded first in each child: refuses and records any Python connection to an address off this machine.
GUARD = textwrap.dedent("""
    import socket, sys
    ATTEMPTS = []
    _connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            if not (host.startswith("127.") or host in ("::1", "localhost")):
                ATTEMPTS.append(str(address))
                sys.stderr.write(f"NETWORK ATTEMPT {address}\\n")
                raise OSError("network disabled in this test")
        return _connect(self, address)

    socket.socket.connect = guarded
""")


def child_env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    (tmp / "guard").mkdir(exist_ok=True)
    (tmp / "guard" / "sitecustomize.py").write_text(GUARD)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "guard"), str(ROOT / "src"), str(ROOT / "tests")])
    env["HOME"] = str(tmp / "home")  # nothing lands in the real home (wandb's settings, trackio's default store)
    return env


# --- the setting -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, tensorboard, expected",
    [
        ("wandb", None, ["wandb"]),
        (["wandb", "mlflow"], None, ["wandb", "mlflow"]),
        (["WandB", "wandb"], None, ["wandb"]),  # case and repeats
        ("none", None, []),
        ([], None, []),
        (["wandb"], True, ["tensorboard", "wandb"]),  # the old switch adds tensorboard ...
        (["tensorboard", "trackio"], False, ["trackio"]),  # ... or takes it away
        (["tensorboard"], None, ["tensorboard"]),
    ],
)
def test_report_to_names_and_the_old_tensorboard_switch(value, tensorboard, expected):
    assert resolve_report_to(value, tensorboard) == expected


def test_report_to_all_is_tensorboard_and_every_installed_tracker():
    assert resolve_report_to("all") == ALL  # the test extra installs every tracker


@pytest.mark.parametrize(
    "value, needle",
    [
        ("wandbb", "unknown tracker 'wandbb'. Did you mean wandb?"),
        (["none", "wandb"], "`none` means no tracker"),
        (3, "expected a tracker name or a list"),
    ],
)
def test_report_to_refuses_what_it_cannot_mean(value, needle):
    with pytest.raises(ConfigError, match="report_to") as e:
        resolve_report_to(value)
    assert needle in str(e.value)


def test_config_reads_one_name_or_a_list_and_records_the_result(tmp_path):
    assert build_config({}, []).report_to == ["tensorboard"]
    assert build_config({}, ["report_to=wandb"]).report_to == ["wandb"]  # a single string on the command line
    assert build_config({"report_to": "mlflow"}).report_to == ["mlflow"]  # and in a recipe
    cfg = build_config({}, ["report_to=[wandb, trackio]", "tensorboard=true"])
    assert cfg.report_to == ["tensorboard", "wandb", "trackio"] and cfg.tensorboard is None
    assert build_config({"tensorboard": False}).report_to == []  # a recipe of before report_to existed
    from grpolab.training.config import save_config, to_dict

    save_config(cfg, tmp_path / "config.yaml")  # resuming reads the folded list back unchanged
    again = build_config(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert to_dict(again) == to_dict(cfg)
    with pytest.raises(ConfigError, match="project"):
        build_config({}, ["project="])


# --- the conversions ---------------------------------------------------------------------------------------


def test_values_the_trackers_are_given():
    assert scalars(
        {"step": 3, "a": 1, "b": 0.5, "flag": True, "name": "x", "nan": float("nan"), "none": None, "inf": float("inf")}
    ) == {"a": 1, "b": 0.5}
    cols, data = table_data([{"p": "x", "r": {"math": 1.0}}, {"p": "y", "extra": float("nan")}])
    assert cols == ["p", "r", "extra"] and data == [["x", '{"math": 1.0}', None], ["y", None, None]]
    assert flat_config({"algo": {"beta": 0.04, "name": "grpo"}, "lr": 1e-5, "task_args": {}}) == {
        "algo.beta": 0.04,
        "algo.name": "grpo",
        "lr": 1e-5,
        "task_args": {},
    }
    assert mlflow_name("eval/pass@1_ci_low") == "eval/pass_at_1_ci_low"
    assert mlflow_name("reward/my fn (v2)!") == "reward/my fn _v2__"
    assert markdown_table([{"a": "x|y", "b": "line1\nline2"}]) == "| a | b |\n|---|---|\n| x\\|y | line1<br>line2 |"


# --- every tracker's files, through the logger -------------------------------------------------------------

LOGGER_SCRIPT = """
import json, sys
from pathlib import Path
from grpolab.training.metrics import MetricsLogger
out, phase = Path(sys.argv[1]), sys.argv[2]
config = {"steps": 3, "algo": {"name": "grpo", "beta": 0.04}, "report_to": %(all)r}
if phase == "first":
    log = MetricsLogger(out, %(all)r, config=config, run_name="logger-test")
    log.track({"step": 0, "eval/accuracy": 0.25, "eval/n": 8})
    for step in (1, 2):
        log.log({"step": step, "reward/mean": step / 4, "kl": 0.01 * step, "kl/beta": 0.04, "note": "text"})
        log.log_table("samples", [{"step": step, "prompt": "1+1", "completion": "2", "reward": 1.0,
                                   "rewards": {"math": 1.0}}], step)
    # an evaluation row as an evaluation during the run logs it, with its table
    log.log({"step": 2, "eval/pass@1": 0.5, "eval/pass@1_ci_low": 0.3, "eval/pass@1_ci_high": 0.7})
    log.log_table("eval/samples", [{"prompt": "2+2", "completion": "4", "correct": True}], 2)
else:  # resumed after step 2
    log = MetricsLogger(out, %(all)r, resume_step=2, config=config, run_name="logger-test")
    log.log({"step": 3, "reward/mean": 0.75, "kl": 0.03, "kl/beta": 0.04})
log.close()
import sitecustomize
print("RESULT " + json.dumps({"network_attempts": sitecustomize.ATTEMPTS}))
""" % {"all": ALL}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The logger writing to all four trackers in a child process (trackio reads its directory when first
    imported), then a second process continuing after step 2; both with no network."""
    tmp = tmp_path_factory.mktemp("trackers")
    out = tmp / "run"
    out.mkdir()
    (tmp / "logger.py").write_text(LOGGER_SCRIPT)
    env = child_env(tmp)
    ids = []
    for phase in ("first", "resume"):
        res = subprocess.run(
            [*offline_prefix(), sys.executable, str(tmp / "logger.py"), str(out), phase],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        (result,) = [line[len("RESULT ") :] for line in res.stdout.splitlines() if line.startswith("RESULT ")]
        assert json.loads(result) == {"network_attempts": []}
        ids.append(json.loads((out / "trackers.json").read_text()))
    return out, ids


def test_logger_writes_metrics_jsonl_without_the_tracked_only_rows(logged):
    out, _ = logged
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 2, 3]  # track(): trackers only


def test_tensorboard_holds_every_metric_eval_rows_config_and_tables(logged):
    out, _ = logged
    tb = readers.tensorboard_scalars(out)
    assert tb["reward/mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert tb["eval/accuracy"] == [(0, 0.25)] and tb["eval/pass@1_ci_low"] == [(2, pytest.approx(0.3))]
    assert "note" not in tb and tb["kl/beta"] == [
        (1, pytest.approx(0.04)),
        (2, pytest.approx(0.04)),
        (3, pytest.approx(0.04)),
    ]
    texts = readers.tensorboard_texts(out)
    assert texts["config/text_summary"] == [0]
    assert texts["samples/text_summary"] == [1, 2] and texts["eval/samples/text_summary"] == [2]


def test_wandb_offline_run_has_the_history_config_and_tables(logged):
    out, ids = logged
    assert ids[0]["wandb"]["id"] == ids[1]["wandb"]["id"]  # the resumed process continued the same W&B run
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(ids[0]["wandb"]["id"]) for r in runs)
    # each process's run file holds its own part of the history
    history, configs, tables = [], [], {}
    for run in runs:
        scratch = out.parent / f"read-{run.name}"
        (scratch / "wandb" / run.name).mkdir(parents=True, exist_ok=True)
        for f in run.glob("run-*.wandb"):
            shutil.copy(f, scratch / "wandb" / run.name / f.name)
        rows, config, tbl = readers.wandb_history(scratch)
        history += rows
        configs.append(config)
        for k, v in tbl.items():
            tables.setdefault(k, []).extend(v)
    by_step = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    assert [by_step[s].get("reward/mean") for s in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert by_step[0]["eval/accuracy"] == 0.25 and by_step[2]["eval/pass@1"] == 0.5
    assert by_step[2]["eval/pass@1_ci_low"] == 0.3 and "note" not in by_step[1]
    assert configs[0]["algo"] == {"name": "grpo", "beta": 0.04} and configs[0]["steps"] == 3
    assert tables == {"samples": [1, 2], "eval/samples": [2]}
    table_files = sorted(p.name for p in runs[0].rglob("*.table.json"))
    assert len(table_files) == 3
    sample = json.loads(next(runs[0].rglob("samples_1_*.table.json")).read_text())
    assert sample["columns"] == ["step", "prompt", "completion", "reward", "rewards"]
    assert sample["data"] == [[1, "1+1", "2", 1.0, '{"math": 1.0}']]


def test_mlflow_store_has_the_metrics_params_and_tables(logged):
    out, ids = logged
    assert ids[0]["mlflow"]["run_id"] == ids[1]["mlflow"]["run_id"]
    assert ids[0]["mlflow"]["tracking_uri"] == f"sqlite:///{out.resolve() / 'mlflow.db'}"
    metrics, params, files = readers.mlflow_run(out)
    assert metrics["reward/mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert metrics["kl"] == [(1, 0.01), (2, 0.02), (3, 0.03)] and len(metrics["kl/beta"]) == 3
    assert metrics["eval/accuracy"] == [(0, 0.25)]
    assert metrics["eval/pass_at_1"] == [(2, 0.5)] and metrics["eval/pass_at_1_ci_low"] == [(2, 0.3)]
    assert params["algo.beta"] == "0.04" and params["steps"] == "3"
    assert sorted(files) == [
        "config.json",
        "tables/eval/samples/step-000002.json",
        "tables/samples/step-000001.json",
        "tables/samples/step-000002.json",
    ]
    assert (out / "mlartifacts").is_dir() and not (Path.cwd() / "mlruns").exists()


def test_trackio_store_has_the_metrics_config_and_tables(logged):
    out, ids = logged
    assert ids[0]["trackio"]["store"] == str((out / "trackio").resolve())
    rows, config = readers.trackio_rows(out)
    steps = {}
    for step, metrics in rows:
        steps.setdefault(step, {}).update(metrics)
    assert [steps[s]["reward/mean"] for s in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert steps[0]["eval/accuracy"] == 0.25 and steps[2]["eval/pass@1_ci_high"] == 0.7
    assert steps[1]["samples"]["_type"] == "trackio.table" and steps[2]["eval/samples"]["_value"] == [
        {"prompt": "2+2", "completion": "4", "correct": True}
    ]
    assert config["algo"] == {"name": "grpo", "beta": 0.04}


# --- failures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tracker, hidden, extra",
    [("wandb", "wandb", "wandb"), ("trackio", "trackio", "trackio"), ("mlflow", "sqlalchemy", "mlflow")],
)
def test_a_missing_extra_is_refused_before_anything_is_written(tracker, hidden, extra, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, hidden, None)  # `import hidden` fails as if it were not installed
    out = tmp_path / "run"
    code = main(
        ["train", "model=/nonexistent-not-loaded", f"out={out}", "steps=1", f"report_to=[tensorboard, {tracker}]"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"report_to: {tracker} needs `{hidden}`" in err and f"pip install 'grpolab[{extra}]'" in err
    assert not out.exists()


def test_a_tracker_that_fails_costs_a_warning_not_the_run(tmp_path, monkeypatch):
    (tmp_path / "flaky_tracker.py").write_text(
        textwrap.dedent("""
        from grpolab.training.trackers.base import Tracker

        class Flaky(Tracker):
            name = "flaky"
            def log_metrics(self, metrics, step):
                if step == 2:
                    raise OSError(28, "No space left on device")

        TRACKER = Flaky
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TRACKERS, "flaky", TrackerSpec("flaky_tracker", ("json",), None, "nowhere"))
    said = []
    log = MetricsLogger(tmp_path, ["flaky"], log=said.append)
    for step in (1, 2, 3):
        log.log({"step": step, "x": float(step)})
    log.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert len(said) == 2 and "flaky: log_metrics failed (OSError" in said[1] and "logs nothing more" in said[1]
    assert log.trackers == []


# --- a real run --------------------------------------------------------------------------------------------


def test_a_tiny_run_reports_to_every_tracker_offline(tiny_model_dir, tmp_path):
    """`grpolab train report_to=[tensorboard, wandb, mlflow, trackio]` in a child with no network: each
    tracker holds each step's reward/mean as metrics.jsonl has it, the held-out evaluation before and after
    (eval/accuracy at steps 0 and 2), the samples table of each step, and the config."""
    out = tmp_path / "run"
    script = (
        "import sys, sitecustomize; from grpolab.app.cli import main; code = main(sys.argv[1:]); "
        "print('ATTEMPTS', sitecustomize.ATTEMPTS); sys.exit(code)"
    )
    res = subprocess.run(
        [
            *offline_prefix(),
            sys.executable,
            "-c",
            script,
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            "steps=2",
            "batch_size=8",
            "G=4",
            "max_new_tokens=6",
            "micro_batch=8",
            "eval_size=4",
            "progress=false",
            "samples_per_step=2",
            "save_every=0",
            "report=false",
            "report_to=[tensorboard, wandb, mlflow, trackio]",
            "run_name=tiny",
        ],
        capture_output=True,
        text=True,
        env=child_env(tmp_path),
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "ATTEMPTS []" in res.stdout
    said = " ".join(res.stdout.split())  # the console wraps long lines
    assert "trackers: tensorboard" in said and "logs nothing more" not in said  # no tracker failed
    rewards = [(r["step"], r["reward/mean"]) for r in read_jsonl(out / "metrics.jsonl")]
    assert [s for s, _ in rewards] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    evals = [(0, summary["eval_before"]["accuracy"]), (2, summary["eval_after"]["accuracy"])]

    tb = readers.tensorboard_scalars(out)
    assert tb["reward/mean"] == [(s, pytest.approx(v)) for s, v in rewards]
    assert tb["eval/accuracy"] == [(s, pytest.approx(v)) for s, v in evals]

    rows, config, tables = readers.wandb_history(out)
    by_step = {}
    for row in rows:
        by_step.setdefault(row["_step"], {}).update(row)
    assert [(s, by_step[s]["reward/mean"]) for s, _ in rewards] == [(s, pytest.approx(v)) for s, v in rewards]
    assert [(s, by_step[s]["eval/accuracy"]) for s, _ in evals] == [(s, pytest.approx(v)) for s, v in evals]
    assert tables == {"samples": [1, 2]} and config["steps"] == 2 and config["report_to"] == ALL

    metrics, params, files = readers.mlflow_run(out)
    assert metrics["reward/mean"] == [(s, pytest.approx(v)) for s, v in rewards]
    assert metrics["eval/accuracy"] == [(s, pytest.approx(v)) for s, v in evals]
    assert params["G"] == "4" and "tables/samples/step-000002.json" in files

    trows, tconfig = readers.trackio_rows(out)
    got = {}
    for step, m in trows:
        got.setdefault(step, {}).update(m)
    assert [(s, got[s]["reward/mean"]) for s, _ in rewards] == [(s, pytest.approx(v)) for s, v in rewards]
    assert got[2]["eval/accuracy"] == pytest.approx(evals[1][1]) and got[1]["samples"]["_type"] == "trackio.table"
    assert tconfig["run_name"] == "tiny" and tconfig["batch_size"] == 8
