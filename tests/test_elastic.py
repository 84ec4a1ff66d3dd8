"""resume=auto: the same command starts a run or continues its newest verified checkpoint,
and each continuation is recorded in OUT/restarts.jsonl. One process, in-process, on the tiny model;
the torchrun cases (a SIGKILLed worker under --max-restarts, a lost host) are in test_distributed.py."""

from __future__ import annotations

import pytest
from e2e_helpers import changed, read_jsonl, varied_score, weights

import grpolab
from grpolab import rewards as rewards_mod
from grpolab.app.cli import main

FAST = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=6",
    "micro_batch=8",
    "eval_size=0",
    "progress=false",
    "tensorboard=false",
    "samples_per_step=0",
    "report=false",
    "lr=1e-3",
    "threads=1",
    "rewards=[{name: test_varied}]",
]


@pytest.fixture(autouse=True)
def varied_reward():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        yield


def test_resume_auto_starts_a_run_then_continues_it(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    cmd = ["train", f"model={tiny_model_dir}", f"out={out}", *FAST, "save_every=1", "keep_checkpoints=0", "resume=auto"]
    assert main([*cmd, "steps=1"]) == 0  # nothing there yet: a new run, no restart recorded
    assert not (out / "restarts.jsonl").exists()
    # the same settings again (steps raised), through the Python API: continues after step 1
    summary = grpolab.train(overrides=[a for a in cmd[1:] if a != "resume=auto"] + ["steps=2"], resume="auto")
    assert summary["steps"] == 2
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    (rec,) = read_jsonl(out / "restarts.jsonl")
    assert rec["step"] == 1 and rec["checkpoint"] == "step-000001" and rec["how"] == "resume=auto"
    assert rec["torchelastic_restart_count"] is None and rec["steps_redone"] == [] and "run again" in rec["cause"]
    assert rec["time"] > 0 and rec["world_size"] == 1
    # the same run uninterrupted ends with the same weights, bit for bit
    straight = tmp_path / "straight"
    assert (
        main(
            [
                "train",
                f"model={tiny_model_dir}",
                f"out={straight}",
                *FAST,
                "save_every=1",
                "keep_checkpoints=0",
                "steps=2",
            ]
        )
        == 0
    )
    last = "checkpoints/step-000002"
    assert not changed(weights(straight / last), weights(out / last))
    capsys.readouterr()
    # without resume=auto the same directory is refused, and the message names the setting
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *FAST, "steps=3"]) == 2
    assert "resume=auto" in capsys.readouterr().err


def test_resume_auto_after_a_kill_before_the_first_checkpoint_and_a_bad_value(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("steps: 1\n")  # a run killed after recording its settings, before a checkpoint
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *FAST, "steps=1", "resume=auto"]) == 0
    (rec,) = read_jsonl(out / "restarts.jsonl")
    assert rec["step"] == 0 and rec["checkpoint"] is None
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]
    capsys.readouterr()
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'x'}", "resume=sometimes"]) == 2
    assert "resume: must be one of never, auto; got 'sometimes'" in capsys.readouterr().err
