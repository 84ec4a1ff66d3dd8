"""Data parallelism on the CPU with the gloo backend: 2 ranks x k prompts reach the same parameters as
1 rank x 2k prompts from the same seed and data order (tests/ddp_worker.py fixes the completions as a
function of the prompt, so both see the same data; the sampling itself is per rank)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from e2e_helpers import read_jsonl, weights

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(out: Path, model: Path, prompts: int, nproc: int, *extra: str, check: bool = True):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), str(out), str(model), str(prompts), *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(out), str(model), str(prompts), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if check:
        assert res.returncode == 0, res.stderr[-4000:]
    return res


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    run(root / "one", tiny_model_dir, 4, 1, "steps=2", "save_every=1")
    run(root / "two", tiny_model_dir, 2, 2, "steps=2", "save_every=1")
    return root / "one", root / "two"


def test_two_ranks_reach_the_parameters_of_one_process_on_the_global_batch(pair):
    one, two = pair
    a = weights(one / "checkpoints" / "step-000002")
    b = weights(two / "checkpoints" / "step-000002")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), (k, (a[k] - b[k]).abs().max())
    first = weights(one / "checkpoints" / "step-000001")
    init_moved = any(not torch.equal(first[k], a[k]) for k in a)
    assert init_moved, "the updates did nothing: the comparison would prove nothing"


def test_metrics_are_of_the_global_batch_and_written_once(pair):
    one, two = pair
    m1, m2 = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [m["step"] for m in m2] == [1, 2]  # rank 0 alone writes: no duplicated lines
    for x, y in zip(m1, m2):
        assert x["reward/mean"] == pytest.approx(y["reward/mean"])  # the mean of the two halves' means
        assert x["tokens/generated"] == y["tokens/generated"]  # a count: summed over ranks
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)  # the global norm on every rank


def test_resuming_with_another_world_size_is_refused(pair, tiny_model_dir, tmp_path):
    import shutil

    _, two = pair
    out = tmp_path / "again"
    shutil.copytree(two, out)
    res = run(out, tiny_model_dir, 4, 1, "steps=3", check=False)  # a fresh run in an existing dir: refused
    assert res.returncode == 2
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    res = subprocess.run([sys.executable, str(WORKER), "--resume", str(out), "steps=3"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "was written by 2 processes and this run has 1" in res.stderr, res.stderr[-2000:]


def test_what_data_parallelism_does_not_support_is_refused(tiny_model_dir, tmp_path):
    res = run(tmp_path / "ppo", tiny_model_dir, 2, 2, "algo=ppo", "steps=1", check=False)
    # each rank exits 2 with the message (torchrun itself then reports its children's failure)
    assert res.returncode != 0 and "PPO's critic is not supported under torchrun" in res.stderr, res.stderr[-2000:]
    assert "exitcode: 2" in res.stderr
