"""Multi-turn runs through the real CLI on the tiny model: every algorithm preset,
LoRA, an exact resume, evaluation, and two data-parallel ranks under torchrun.

A tiny random model never answers an arithmetic question, so these runs add the registered test reward
that varies within groups (tests/conftest.py: test_varied) to give every estimator a signal; the
environment (retry_arithmetic) still decides the turns: every wrong answer gets "try again".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e_helpers import changed, read_jsonl, weights
from safetensors.torch import load_file

from grpolab.algo.presets import ALGOS
from grpolab.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
AGENT = [
    "steps=2",
    "batch_size=8",
    "G=4",
    "micro_batch=4",
    "eval_size=2",
    "progress=false",
    "report=false",
    "tensorboard=false",
    "env.name=retry_arithmetic",
    "env.max_turns=2",
    "env.max_turn_tokens=4",
    "env.max_model_tokens=8",
    "rewards=[{name: test_varied}]",
]

pytestmark = pytest.mark.usefixtures("varied_reward")


@pytest.fixture(scope="module")
def chatty_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model whose generation config counts every even token id as an end of turn, so that its
    turns are short and end (a random model almost never samples the real <|im_end|>): the environment
    then answers and trajectories really have several turns."""
    from scripted_envs import chatty_copy

    return chatty_copy(tiny_model_dir, tmp_path_factory.mktemp("chatty") / "model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tiny_model_dir: Path, out: Path, *extra: str) -> Path:
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *AGENT, *extra]) == 0
    return out


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_every_preset_trains_in_an_environment(name, chatty_model_dir, tmp_path):
    out = train(chatty_model_dir, tmp_path / name, f"algo={name}")
    rows = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        assert m["update/seqs_computed"] > 0 and m["update/skipped"] == 0, name
        assert math.isfinite(m["loss/policy"]) and m["grad_norm"] > 0, name
        assert 1.0 < m["env/turns_mean"] <= 2.0 and 0.0 < m["env/env_token_frac"] < 1.0
        assert m["completion/length_mean"] <= 8  # the model's tokens only, within env.max_model_tokens
    assert changed(weights(chatty_model_dir), weights(out / "checkpoints" / "step-000002")), name


def test_lora_agent_run_resumes_exactly_and_evaluates(chatty_model_dir, tmp_path, capsys):
    """Two steps straight equal one step, then a resume for the second, bit for bit (LoRA adapter and all);
    `grpolab eval` of the run runs the environment."""
    lora = ["lora.r=4", "save_every=1", "keep_checkpoints=0"]
    straight = train(chatty_model_dir, tmp_path / "straight", *lora)
    part = train(chatty_model_dir, tmp_path / "part", *lora, "steps=1")
    assert main(["train", "--resume", str(part), "steps=2"]) == 0
    a, b = (load_file(str(r / "checkpoints" / "step-000002" / "adapter_model.safetensors")) for r in (straight, part))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first = load_file(str(straight / "checkpoints" / "step-000001" / "adapter_model.safetensors"))
    assert any(not torch.equal(first[k], a[k]) for k in a)  # the second step moved the adapter
    capsys.readouterr()
    assert main(["eval", str(straight), "eval_size=2"]) == 0
    result = json.loads(capsys.readouterr().out.split("\n}")[0] + "}")
    assert result["n"] == 2 and result["turns"] > 1.0  # evaluated in the environment, over several turns


def test_two_ranks_train_in_an_environment(chatty_model_dir, tmp_path):
    """torchrun -m grpolab with two gloo ranks: each rank rolls out its share in its own environments."""
    out = tmp_path / "ddp"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "grpolab",
        "train",
        f"model={chatty_model_dir}",
        f"out={out}",
        *AGENT,
        "steps=1",
        "rewards=[{name: format}]",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert len(rows) == 1 and rows[0]["env/turns_mean"] > 1.0
    assert (out / "checkpoints" / "step-000001").exists()


def test_audit_reports_turns_and_calls_in_an_environment(chatty_model_dir):
    from grpolab.app.audit import audit
    from grpolab.training.config import build_config

    cfg = build_config(
        None,
        [
            f"model={chatty_model_dir}",
            "G=4",
            "batch_size=8",
            "env.name=retry_arithmetic",
            "env.max_turns=2",
            "env.max_turn_tokens=4",
            "env.max_model_tokens=8",
            "rewards=[{name: math, weight: 0.0}]",
        ],
    )  # as recipes/agent.yaml: the environment scores
    lines: list[str] = []
    res = audit(cfg, n_prompts=2, log=lines.append)
    env = res["env"]
    assert 1.0 < env["turns_mean"] <= 2.0 and env["tool_calls_mean"] == 0 and env["calls_parsed"] is None
    assert sum(v for k, v in env.items() if k.startswith("stopped_")) == pytest.approx(1.0)
    assert res["main_reward"] == "env" and not res["gold_failures"]  # gold answers checked by math, not the env
    text = "\n".join(lines)
    assert "turns per trajectory" in text and "suggested env.max_model_tokens" in text


def _agent_cli(model: Path, out: Path, *args: str) -> subprocess.Popen:
    """`python -m grpolab train` of an agent run in its own session, so that signals reach only it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    base = [a for a in AGENT if not a.startswith(("steps=", "rewards="))] + ["rewards=[{name: format}]"]
    return subprocess.Popen(
        [sys.executable, "-m", "grpolab", "train", f"model={model}", f"out={out}", *base, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def _wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{out}: fewer than {n} steps after {timeout}s")


def test_sigterm_then_sigkill_of_an_agent_run_resume_exactly(chatty_model_dir, tmp_path):
    """SIGTERM mid-run finishes the step, checkpoints and exits 143; a SIGKILL later loses at most the step
    in flight; resumed each time, the final weights equal an uninterrupted agent run's, bit for bit."""
    steps = ["steps=5", "save_every=1", "keep_checkpoints=0"]
    straight = tmp_path / "straight"
    proc = _agent_cli(chatty_model_dir, straight, *steps)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    out = tmp_path / "stopped"
    proc = _agent_cli(chatty_model_dir, out, *steps)
    _wait_for_steps(out, 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and f"--resume {out}" in err and "Traceback" not in err, err[-3000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    resume = [sys.executable, "-m", "grpolab", "train", "--resume", str(out)]
    proc = subprocess.Popen(
        resume, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _wait_for_steps(out, 3, proc)
    with contextlib.suppress(ProcessLookupError):  # (a resume that already finished: nothing to kill)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc = subprocess.run(resume, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = Path("checkpoints") / "step-000005"
    assert not changed(weights(straight / last), weights(out / last)), "a stopped, killed and resumed agent run drifted"
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4, 5]
