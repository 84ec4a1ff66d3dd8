"""Runs that stop early: signals, non-finite updates, a full disk, damaged checkpoints, a run killed
before it recorded anything, degenerate batches, and random SIGKILLs that must still resume exactly.

Signal and kill tests run the real CLI in a subprocess (`python -m grpolab train`) on the tiny model,
with a built-in reward that varies within groups (`rewards=[{name: code}]` would need the sandbox, so
the tests register nothing in the child: they use the arithmetic task's math reward with a tiny
model, which scores 0, plus `algo.beta` so that the KL term gives the update work, or the in-process
runs below with a varied test reward).
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e_helpers import changed, read_jsonl, varied_score, weights

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.training.checkpoint import latest_good_checkpoint, verify_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=6",
    "micro_batch=8",
    "eval_size=0",
    "progress=false",
    "tensorboard=false",
    "samples_per_step=1",
    "lr=1e-3",
    "algo.beta=0.04",
]


@pytest.fixture(autouse=True)
def varied_reward():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        yield


def cli(model: Path, out: Path, *args: str) -> subprocess.Popen:
    """`python -m grpolab train` in a subprocess (its own session, so signals reach only it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "grpolab", "train", f"model={model}", f"out={out}", *FAST, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{out}: fewer than {n} steps after {timeout}s")


def all_checkpoints_verify(out: Path) -> list[str]:
    root = out / "checkpoints"
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) if root.exists() else []
    for name in names:
        assert verify_checkpoint(root / name) is None, name
    return names


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_checkpoints_and_says_how_to_resume(sig, code, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = cli(tiny_model_dir, out, "steps=200", "save_every=0")
    wait_for_steps(out, 2, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"Continue with: grpolab train --resume {out}" in err and "Traceback" not in err
    steps = [m["step"] for m in read_jsonl(out / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 200
    assert all_checkpoints_verify(out) == [f"step-{steps[-1]:06d}"]  # the step it finished, saved
    assert (out / "report.html").is_file()  # the report of what it did
    # and the resume command works from there
    assert main(["train", "--resume", str(out), f"steps={steps[-1] + 1}"]) == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")][-1] == steps[-1] + 1


def test_a_second_signal_stops_at_once_leaving_complete_checkpoints(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = cli(tiny_model_dir, out, "steps=200", "save_every=1")
    wait_for_steps(out, 2, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" in err
    names = all_checkpoints_verify(out)  # whatever was being written when it stopped is not there
    assert names and not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_random_sigkills_still_resume_bitwise_exactly(tiny_model_dir, tmp_path):
    """SIGKILL at random moments (seeded: somewhere in the step after steps 2, 4 and 6, checkpoint writes
    included), resume each time: the final weights equal an uninterrupted run's, bit for bit (same
    machine)."""
    steps = ["steps=9", "save_every=1"]
    straight = tmp_path / "straight"
    assert main(["train", f"model={tiny_model_dir}", f"out={straight}", *FAST, *steps]) == 0
    out = tmp_path / "killed"
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    kills = 0
    proc = cli(tiny_model_dir, out, *steps)
    for target in (2, 4, 6):
        wait_for_steps(out, target, proc)
        time.sleep(rng.uniform(0.0, 0.3))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpolab", "train", "--resume", str(out)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert kills == 3
    last = Path("checkpoints") / "step-000009"
    assert not changed(weights(straight / last), weights(out / last)), "a killed and resumed run drifted"
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == list(range(1, 10))


# -- non-finite updates ----------------------------------------------------------------------------


def train_in_process(model: Path, out: Path, *args: str) -> int:
    """Every checkpoint is kept (keep_checkpoints=0): these tests compare earlier steps' weights."""
    return main(
        ["train", f"model={model}", f"out={out}", *FAST, "rewards=[{name: test_varied}]", "keep_checkpoints=0", *args]
    )


def test_a_nan_log_prob_skips_the_update_and_counts_it(tiny_model_dir, tmp_path, monkeypatch):
    from grpolab.training import update as update_mod

    real = update_mod.policy_logp
    calls = [0]

    def poisoned(spec, policy, part, **kw):
        logp, ent = real(spec, policy, part, **kw)
        calls[0] += 1
        if calls[0] == 1:  # the first policy pass of the run
            logp = logp + float("nan")
        return logp, ent

    monkeypatch.setattr(update_mod, "policy_logp", poisoned)
    out = tmp_path / "nan"
    assert train_in_process(tiny_model_dir, out, "steps=2", "save_every=1") == 0
    m1, m2 = read_jsonl(out / "metrics.jsonl")
    assert m1["update/nonfinite_skipped"] == 1 and m2["update/nonfinite_skipped"] == 0
    assert "grad_norm" not in m1  # no update was made, so no norm of an update to report
    init, ck1 = weights(tiny_model_dir), weights(out / "checkpoints" / "step-000001")
    assert not changed(init, ck1), "the poisoned update moved the weights"
    assert changed(ck1, weights(out / "checkpoints" / "step-000002")), "the next update did not happen"


def test_a_nan_gradient_is_skipped_and_k_in_a_row_stop_the_run(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpolab.training import trainer as trainer_mod

    real_setup = trainer_mod.setup

    def setup_with_nan_grads(cfg, **kw):
        run = real_setup(cfg, **kw)
        first = next(run.policy.parameters())
        first.register_hook(lambda g: torch.full_like(g, float("nan")) if run.nan_grads else g)
        run.nan_grads = False
        trainer_mod._test_run = run
        return run

    monkeypatch.setattr(trainer_mod, "setup", setup_with_nan_grads)
    real_step = trainer_mod.train_step

    def step_then_poison(run, step):
        run.nan_grads = step >= 2  # step 1 is clean (checkpointed), steps 2.. have NaN gradients
        return real_step(run, step)

    monkeypatch.setattr(trainer_mod, "train_step", step_then_poison)
    out = tmp_path / "stop"
    rc = train_in_process(tiny_model_dir, out, "steps=10", "save_every=1", "max_nonfinite_updates=2")
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "2 optimizer updates in a row had a non-finite loss or gradient norm" in err
    assert f"the last good checkpoint is {out / 'checkpoints' / 'step-000002'}" in err
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3] and [m["update/nonfinite_skipped"] for m in lines] == [0, 1, 1]
    # the NaN steps never touched the weights: every checkpoint holds step 1's weights
    assert all_checkpoints_verify(out) == ["step-000001", "step-000002"]  # the stopping step writes none
    assert not changed(weights(out / "checkpoints" / "step-000001"), weights(out / "checkpoints" / "step-000002"))


# -- the disk refuses a checkpoint ------------------------------------------------------------------


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpolab.training import checkpoint as ck_mod

    real_save = torch.save
    saves = [0]

    def full_disk(obj, path, *a, **k):
        if Path(path).name == "optimizer.pt":
            saves[0] += 1
            if saves[0] == 2:  # the second checkpoint: the disk is full half-way through it
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ck_mod.torch, "save", full_disk)
    out = tmp_path / "full"
    rc = train_in_process(tiny_model_dir, out, "steps=4", "save_every=1")
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "could not write the checkpoint of step 2 (No space left on device; is the disk full?)" in err
    assert f"the previous checkpoint {out / 'checkpoints' / 'step-000001'} is intact" in err
    assert f"grpolab train --resume {out}" in err
    assert all_checkpoints_verify(out) == ["step-000001"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    monkeypatch.setattr(ck_mod.torch, "save", real_save)
    assert main(["train", "--resume", str(out)]) == 0  # space is back: it continues from step 1


def test_a_real_file_size_limit_stops_the_run_cleanly(tiny_model_dir, tmp_path):
    """RLIMIT_FSIZE (SIGXFSZ ignored, so writes fail with EFBIG) smaller than the tiny model's weights:
    the first checkpoint cannot be written; the run says so and leaves no partial checkpoint."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))  # 2 MiB; the weights are ~6 MiB

    out = tmp_path / "small"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab",
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            *FAST,
            "steps=2",
            "save_every=1",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=limit,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    assert "could not write the checkpoint of step 1" in res.stderr and "no earlier checkpoint exists" in res.stderr
    assert "Traceback" not in res.stderr
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]
    assert not list((out / "checkpoints").iterdir()) if (out / "checkpoints").exists() else True


# -- damaged checkpoints ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_checkpoints(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("damaged") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        assert train_in_process(tiny_model_dir, out, "steps=2", "save_every=1") == 0
    return out


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_resume_falls_back_from_a_damaged_checkpoint(damage, two_checkpoints, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    bad = out / "checkpoints" / "step-000002" / ("model.safetensors" if damage == "flip" else "optimizer.pt")
    data = bytearray(bad.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    bad.write_bytes(bytes(data))
    messages = []
    assert latest_good_checkpoint(out, log=messages.append) == out / "checkpoints" / "step-000001"
    assert len(messages) == 1 and str(bad) in messages[0] and "falling back to step-000001" in messages[0]
    assert ("corrupted" if damage == "flip" else "truncated") in messages[0]
    # resume continues from step 1: step 2 is trained again, exactly as before
    assert main(["train", "--resume", str(out), "steps=2"]) == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert not changed(
        weights(two_checkpoints / "checkpoints" / "step-000002"), weights(out / "checkpoints" / "step-000002")
    )


# -- a run that recorded nothing, degenerate batches ---------------------------------------------------


def test_an_overlong_buffer_longer_than_the_limit_is_a_usage_error(capsys):
    assert main(["train", "algo=dapo", "max_new_tokens=4", "out=/nonexistent/x"]) == 2
    assert "algo.overlong_buffer: 6 tokens is longer than max_new_tokens=4" in capsys.readouterr().err


def test_resume_of_a_run_killed_before_it_recorded_anything(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "early"
    out.mkdir()  # what a kill during model loading can leave
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trained no step: there is nothing to resume" in err and f"out={out}" in err
    assert train_in_process(tiny_model_dir, out, "steps=1") == 0  # the directory is accepted as it is


def test_a_run_killed_after_its_config_but_before_a_checkpoint_resumes_from_zero(tiny_model_dir, tmp_path):
    out = tmp_path / "nockpt"
    assert train_in_process(tiny_model_dir, out, "steps=1") == 0
    import shutil

    shutil.rmtree(out / "checkpoints")
    assert main(["train", "--resume", str(out), "steps=2"]) == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def test_every_completion_truncated_is_a_defined_step(tiny_model_dir, tmp_path):
    out = tmp_path / "trunc"
    assert (
        train_in_process(tiny_model_dir, out, "steps=2", "max_new_tokens=1", "algo=dapo", "algo.overlong_buffer=1") == 0
    )
    for m in read_jsonl(out / "metrics.jsonl"):
        assert m["completion/truncated_frac"] == 1.0 and m["completion/length_mean"] == 1.0
        assert m["update/nonfinite_skipped"] == 0 and json.dumps(m)  # every value is a number or null
        assert m["reward/overlong_penalty_mean"] == -1.0  # every completion is at the limit
