"""Data parallelism on the CPU with the gloo backend: 2 ranks x k prompts reach the same parameters as
1 rank x 2k prompts from the same seed and data order (tests/ddp_worker.py fixes the completions as a
function of the prompt, so both see the same data; the sampling itself is per rank)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e2e_helpers import read_jsonl, weights

from grpolab.model.optim import IMPLEMENTATION_KEYS

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(out: Path, model: Path, prompts: int, nproc: int, *extra: str, check: bool = True):
    return launch(nproc, str(out), str(model), str(prompts), *extra, check=check)


def launch(nproc: int, *args: str, check: bool = True):
    """tests/ddp_worker.py ARGS as one process, or under torchrun with nproc processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(WORKER), *args]
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


# FSDP2 (fsdp=true, grpolab.parallel.fsdp): the model sharded over the ranks instead of copied to each.

def test_fsdp_two_ranks_reach_the_parameters_of_one_process_on_the_global_batch(pair, tiny_model_dir, tmp_path):
    one, _ = pair
    out = tmp_path / "fsdp"
    run(out, tiny_model_dir, 2, 2, "steps=2", "save_every=1", "fsdp=true")  # beta 0.04: a sharded reference too
    a, b = weights(one / "checkpoints" / "step-000002"), weights(out / "checkpoints" / "step-000002")
    assert sorted(a) == sorted(b)  # the whole model, saved as one process saves it (the tied head once)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), (k, (a[k] - b[k]).abs().max())
    oa = torch.load(one / "checkpoints" / "step-000002" / "optimizer.pt", weights_only=True)
    ob = torch.load(out / "checkpoints" / "step-000002" / "optimizer.pt", weights_only=True)
    def groups(o):  # the implementation (fused on one process, foreach when sharded) is not state
        return [{k: v for k, v in g.items() if k not in IMPLEMENTATION_KEYS} for g in o["param_groups"]]

    assert groups(oa) == groups(ob) and sorted(oa["state"]) == sorted(ob["state"])
    for i in oa["state"]:
        assert torch.allclose(oa["state"][i]["exp_avg_sq"], ob["state"][i]["exp_avg_sq"], rtol=1e-3, atol=1e-12), i
    for x, y in zip(read_jsonl(one / "metrics.jsonl"), read_jsonl(out / "metrics.jsonl"), strict=True):
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)  # the norm of the sharded gradients
        assert y["update/idle_passes"] == 0


def test_fsdp_uneven_ranks_and_an_exact_resume(tiny_model_dir, tmp_path):
    """With the model's own rollouts and rank 0's evaluation (each on the gathered model): rank 0 has no
    group with signal at step 1 (tests/ddp_worker.py's uneven_score) and runs idle passes to match rank
    1's collectives. A run resumed from its step-1 checkpoint ends with the same step 2, bit for bit."""
    import shutil

    out = tmp_path / "uneven"
    run(out, tiny_model_dir, 2, 2, "--sampled", "steps=2", "save_every=1", "fsdp=true", "algo.beta=0",
        "rewards=[{name: test_uneven}]", "eval_size=4")
    assert json.loads((out / "summary.json").read_text())["eval_after"]["n"] == 4
    idle = [m["update/idle_passes"] for m in read_jsonl(out / "metrics.jsonl")]
    assert idle == [2, 1], idle  # no hang, and the test exercised what it is for
    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step-000002")
    (again / "checkpoints" / "latest").write_text("step-000001\n")
    launch(2, "--sampled", "--resume", str(again), "steps=2")
    first, second = out / "checkpoints" / "step-000002", again / "checkpoints" / "step-000002"
    a, b = weights(first), weights(second)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    oa, ob = (torch.load(p / "optimizer.pt", weights_only=True) for p in (first, second))
    assert all(torch.equal(oa["state"][i]["exp_avg"], ob["state"][i]["exp_avg"]) for i in oa["state"])


def test_fsdp_without_torchrun_is_refused(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpolab.app.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'one'}", "fsdp=true"]) == 2
    assert "fsdp: FSDP2 shards the model over the processes of a torchrun launch" in capsys.readouterr().err
    assert not (tmp_path / "one").exists()  # refused before anything was loaded or written


def test_a_one_column_slice_is_widened_without_changing_its_log_probs(tiny_model):
    """Sharded, a micro-batch of one-token completions gets a masked second column (so that every rank
    makes the same module calls); the log-probs of the real column are those of the narrow pass."""
    from grpolab.batch import GroupSlice
    from grpolab.model.passes import PassSpec, policy_logp, slice_logp
    from grpolab.parallel import fsdp as sharding

    g = torch.Generator().manual_seed(0)
    part = GroupSlice(torch.arange(4), torch.randint(100, 5000, (2, 5), generator=g), torch.ones(2, 5, dtype=torch.long),
                      torch.randint(100, 5000, (4, 1), generator=g), torch.ones(4, 1), 2)
    spec = PassSpec(torch.device("cpu"), None, temperature=0.7)
    narrow, narrow_entropy = slice_logp(spec, tiny_model, part, with_entropy=True)
    setattr(tiny_model, sharding._MARK, {"layers": [], "root": None, "depth": 0})  # as if sharded
    wide, wide_entropy = policy_logp(spec, tiny_model, part, with_entropy=True)
    assert wide.shape == narrow.shape == (4, 1)
    assert torch.allclose(wide, narrow, atol=1e-6) and torch.allclose(wide_entropy, narrow_entropy, atol=1e-5)
