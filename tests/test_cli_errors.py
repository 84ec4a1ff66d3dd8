"""The real `grpolab` command line, in subprocesses: every usage error exits with code 2 and a message
naming the key, before anything is written; --help documents every option; an existing run is never
overwritten.

The error cases are independent processes, so they run concurrently in one module fixture (about 1-2 s
each when run one after another on two cores)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grpolab.training.config import Config

SRC = Path(__file__).resolve().parents[1] / "src"


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.pop("GRPOLAB_CACHE", None)  # the real cache: no test here may dequantise anything
    return env


def grpolab(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpolab.app.cli", *args],
        cwd=cwd,
        env=_env(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# name -> (arguments after `grpolab train`, text the error must contain)
USAGE_ERRORS = {
    "unknown_key": (["stpes=3"], ["stpes", "unknown key", "steps"]),
    "unknown_nested_key": (["algo.bta=0.1"], ["algo.bta", "beta"]),
    "wrong_type": (["steps=abc"], ["steps", "int", "abc"]),
    "wrong_type_float": (["lr=fast"], ["lr", "float"]),
    "G_zero": (["G=0"], ["G:", ">= 1"]),
    "batch_not_divisible": (["batch_size=10", "G=4"], ["batch_size", "G=4", "multiple"]),
    "temperature_zero": (["temperature=0"], ["temperature", "> 0"]),
    "top_p_too_big": (["top_p=1.5"], ["top_p", "(0, 1]"]),
    "bad_precision": (["precision=fp8"], ["precision: must be one of auto, bf16, fp16, fp32; got 'fp8'"]),
    "bad_device": (["device=gpu"], ["device: must be one of auto, cpu, cuda, cuda:N", "'gpu'"]),
    "bad_list_element": (["reflection_phrases=[wait, 3]"], ["reflection_phrases[1]: must be a string, got 3"]),
    "bad_thread_wait": (["thread_wait=spin"], ["thread_wait", "passive", "'spin'"]),
    "unknown_task": (["task=nope"], ["task", "'nope'", "arithmetic"]),
    "unknown_algo": (["algo=nope"], ["algo", "'nope'", "grpo"]),
    "hub_model": (["model=HuggingFaceTB/SmolLM2-135M"], ["model", "HuggingFaceTB/SmolLM2-135M", "never downloads"]),
    "missing_recipe": (["no_such_recipe.yaml"], ["no_such_recipe.yaml", "not found"]),
    "bad_task_args": (["task_args.bogus=1"], ["task_args", "bogus"]),
    "unknown_reward": (["rewards=[{name: nope}]"], ["rewards", "'nope'", "format"]),
    "not_key_value": (["steps=2", "oops"], ["oops", "KEY=VALUE"]),
    "resume_not_a_run": (
        ["--resume", "nowhere"],
        ["nowhere", "no such directory", "grpolab train [RECIPE] out=nowhere"],
    ),
}


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory):
    """Run every usage-error case (each in its own empty working directory, out= inside it)."""
    base = tmp_path_factory.mktemp("cli-errors")

    def one(name):
        args, _ = USAGE_ERRORS[name]
        cwd = base / name
        cwd.mkdir()
        res = grpolab(["train", *args, f"out={cwd / 'run'}"] if "--resume" not in args else ["train", *args], cwd)
        return name, (res, cwd)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, USAGE_ERRORS))


@pytest.mark.parametrize("name", list(USAGE_ERRORS))
def test_usage_error_exits_2_names_the_key_and_writes_nothing(error_runs, name):
    res, cwd = error_runs[name]
    _, expected = USAGE_ERRORS[name]
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    err = res.stderr
    assert "Traceback" not in err, err
    assert err.startswith("grpolab: error:"), err
    for text in expected:
        assert text in err, (text, err)
    assert not (cwd / "run").exists()  # the run directory was not created
    assert list(cwd.iterdir()) == []  # and nothing else was written either


def test_recipe_with_unknown_key(tmp_path):
    (tmp_path / "r.yaml").write_text("steps: 2\nlearning_rate: 0.1\n")
    res = grpolab(["train", "r.yaml", f"out={tmp_path / 'run'}"], tmp_path)
    assert res.returncode == 2
    assert "learning_rate" in res.stderr and "unknown key" in res.stderr
    assert not (tmp_path / "run").exists()


def test_train_help_documents_every_option(tmp_path):
    res = grpolab(["train", "--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for key in ("out", "steps", "seed", "model", "task", "algo"):  # the stable top-level keys
        assert f"{key}=" in out, key
    for f in dataclasses.fields(Config):
        assert f"{f.name}=" in out, f.name
    assert "algo.beta=" in out and "--resume" in out
    assert list(tmp_path.iterdir()) == []


def test_top_level_usage(tmp_path):
    res = grpolab([], tmp_path)
    assert res.returncode == 2 and "train" in res.stdout
    res = grpolab(["--help"], tmp_path)
    assert res.returncode == 0 and "train" in res.stdout and "eval" in res.stdout
    res = grpolab(["frobnicate"], tmp_path)
    assert res.returncode == 2 and "frobnicate" in res.stderr


def test_eval_usage_errors(tmp_path):
    res = grpolab(["eval", "model=some/hub-name"], tmp_path)
    assert res.returncode == 2 and "never downloads" in res.stderr
    res = grpolab(["eval", "stpes=1"], tmp_path)
    assert res.returncode == 2 and "stpes" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_run_is_not_overwritten(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    run.mkdir()
    files = {
        "config.yaml": "steps: 3\n",
        "metrics.jsonl": '{"step": 1, "reward/mean": 0.5}\n',
        "samples.jsonl": '{"step": 1}\n',
    }
    for name, text in files.items():
        (run / name).write_text(text)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    # a tiny model and no evaluation, so that a missing check would not cost much time
    res = grpolab(
        [
            "train",
            f"out={run}",
            "steps=1",
            f"model={tiny_model_dir}",
            "eval_size=0",
            "batch_size=2",
            "G=2",
            "max_new_tokens=2",
            "progress=false",
            "tensorboard=false",
        ],
        tmp_path,
    )
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-2000:])
    assert "out" in res.stderr and "--resume" in res.stderr and str(run) in res.stderr
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    assert after == before


def test_out_that_is_a_file_is_a_usage_error(tmp_path, tiny_model_dir):
    target = tmp_path / "afile"
    target.write_text("keep me\n")
    res = grpolab(["train", f"out={target}", f"model={tiny_model_dir}", "steps=1", "eval_size=0"], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "out" in res.stderr and "not a directory" in res.stderr
    assert target.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
