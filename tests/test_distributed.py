"""Data parallelism on the CPU with the gloo backend: 2 ranks x k prompts reach the same parameters as
1 rank x 2k prompts from the same seed and data order (tests/ddp_worker.py fixes the completions as a
function of the prompt, so both see the same data; the sampling itself is per rank)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
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


def torchrun(nproc: int, *target: str) -> list[str]:
    """The command line of `torchrun --nproc_per_node nproc TARGET...` on this host, on a free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *target,
    ]


def run(out: Path, model: Path, prompts: int, nproc: int, *extra: str, check: bool = True):
    return launch(nproc, str(out), str(model), str(prompts), *extra, check=check)


def launch(nproc: int, *args: str, check: bool = True):
    """tests/ddp_worker.py ARGS as one process, or under torchrun with nproc processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    cmd = [sys.executable, str(WORKER), *args] if nproc == 1 else torchrun(nproc, str(WORKER), *args)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if check:
        assert res.returncode == 0, res.stderr[-4000:]
    return res


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    run(root / "one", tiny_model_dir, 4, 1, "steps=2", "save_every=1", "keep_checkpoints=0")
    run(root / "two", tiny_model_dir, 2, 2, "steps=2", "save_every=1", "keep_checkpoints=0")
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
    res = subprocess.run(
        [sys.executable, str(WORKER), "--resume", str(out), "steps=3"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    run(
        out, tiny_model_dir, 2, 2, "steps=2", "save_every=1", "keep_checkpoints=0", "fsdp=true"
    )  # beta 0.04: a sharded reference too
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
    run(
        out,
        tiny_model_dir,
        2,
        2,
        "--sampled",
        "steps=2",
        "save_every=1",
        "keep_checkpoints=0",
        "fsdp=true",
        "algo.beta=0",
        "rewards=[{name: test_uneven}]",
        "eval_size=4",
    )
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
    part = GroupSlice(
        torch.arange(4),
        torch.randint(100, 5000, (2, 5), generator=g),
        torch.ones(2, 5, dtype=torch.long),
        torch.randint(100, 5000, (4, 1), generator=g),
        torch.ones(4, 1),
        2,
    )
    spec = PassSpec(torch.device("cpu"), None, temperature=0.7)
    narrow, narrow_entropy = slice_logp(spec, tiny_model, part, with_entropy=True)
    setattr(tiny_model, sharding._MARK, {"layers": [], "root": None, "depth": 0})  # as if sharded
    wide, wide_entropy = policy_logp(spec, tiny_model, part, with_entropy=True)
    assert wide.shape == narrow.shape == (4, 1)
    assert torch.allclose(wide, narrow, atol=1e-6) and torch.allclose(wide_entropy, narrow_entropy, atol=1e-5)


# Elastic runs: resume=auto under torchrun --max-restarts, and two hosts on one machine.


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return {**env, **extra}


def _elastic_env(**extra: str) -> dict:
    # A fresh worker store for each round of the rendezvous: with torch's shared agent store (its
    # default), restarted workers met the previous attempt's gloo addresses ("connectFullMesh failed:
    # Connection refused") and a replacement host waited for an address the survivor never wrote
    # (docs/distributed.md, "Restarts").
    return _clean_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **extra)


def _wait_for_pid(path: Path, procs, timeout: float = 120.0) -> int:
    """The pid a worker held by GRPOLAB_TEST_HOLD (tests/ddp_worker.py) wrote into `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        assert all(p.poll() is None for p in procs), "the job ended before reaching the step to hold"
        time.sleep(0.1)
    raise AssertionError(f"no worker held after {timeout}s")


def _same_step_two(a_dir: Path, b_dir: Path) -> None:
    a, b = (weights(p / "checkpoints" / "step-000002") for p in (a_dir, b_dir))
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    oa, ob = (torch.load(p / "checkpoints" / "step-000002" / "optimizer.pt", weights_only=True) for p in (a_dir, b_dir))
    assert all(torch.equal(oa["state"][i]["exp_avg_sq"], ob["state"][i]["exp_avg_sq"]) for i in oa["state"])


def test_a_sigkilled_worker_is_restarted_by_torchrun_and_the_run_resumes_exactly(pair, tiny_model_dir, tmp_path):
    """torchrun --max-restarts 1, resume=auto: rank 1's worker is SIGKILLed from outside at the start of
    step 2 (after the step-1 checkpoint); torchrun restarts both workers with the same command, which
    continues the step-1 checkpoint; the job succeeds with the uninterrupted run's weights, bit for bit."""
    _, two = pair
    out, hold = tmp_path / "elastic", tmp_path / "hold.pid"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(WORKER),
        str(out),
        str(tiny_model_dir),
        "2",
        "steps=2",
        "save_every=1",
        "keep_checkpoints=0",
        "resume=auto",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_elastic_env(GRPOLAB_TEST_HOLD=f"1:2:{hold}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        pid = _wait_for_pid(hold, [proc])
        os.kill(pid, signal.SIGKILL)
        log, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log[-4000:]
    assert f"failed (exitcode: -9) local_rank: 1 (pid: {pid})" in log  # torchrun saw the kill and restarted
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    (rec,) = read_jsonl(out / "restarts.jsonl")
    assert (rec["step"], rec["checkpoint"], rec["torchelastic_restart_count"], rec["world_size"]) == (
        1,
        "step-000001",
        1,
        2,
    ), rec
    assert "torchrun restarted" in rec["cause"] and rec["steps_redone"] == []
    _same_step_two(two, out)


def _two_hosts_or_skip():
    from netns_helpers import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"two hosts on one machine need network namespaces: {why}")


def _close_to(a_dir: Path, b_dir: Path) -> None:
    a, b = weights(a_dir / "checkpoints" / "step-000002"), weights(b_dir / "checkpoints" / "step-000002")
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), (k, (a[k] - b[k]).abs().max())


def test_two_hosts_fsdp_reach_the_parameters_of_one_process(pair, tiny_model_dir, tmp_path):
    """Two network namespaces joined by a veth pair, one torchrun agent in each (--nnodes 2
    --nproc_per_node 1, c10d rendezvous on 10.77.0.1, gloo over the veth): with fsdp=true, after 2
    steps, the parameters of 1 process on the same global batch within the tolerance above."""
    _two_hosts_or_skip()
    from netns_helpers import TwoHosts

    one, _ = pair
    out = tmp_path / "fsdp2hosts"
    args = [
        str(WORKER),
        str(out),
        str(tiny_model_dir),
        "2",
        "steps=2",
        "save_every=1",
        "keep_checkpoints=0",
        "fsdp=true",
    ]
    with TwoHosts() as hosts, open(tmp_path / "host0.log", "w+") as log:
        agents = [hosts.agent(h, [], args, _elastic_env(), log if h == 0 else None) for h in (0, 1)]
        codes = [a.wait(timeout=240) for a in agents]
        log.seek(0)
        assert codes == [0, 0], log.read()[-4000:]
    _close_to(one, out)


def test_two_hosts_survive_a_lost_host(pair, tiny_model_dir, tmp_path):
    """Two hosts as above, plain data parallelism, --max-restarts 1 and resume=auto. At the start of step 2
    (after the step-1 checkpoint) the host running rank 1 is lost: every process in its namespace is
    SIGKILLed. The surviving agent restarts its worker and waits in the rendezvous; the lost host's
    command is run again (a replacement machine); the job finishes from the step-1 checkpoint, and its
    step-2 parameters equal one process's on the same global batch within the tolerance above."""
    _two_hosts_or_skip()
    from netns_helpers import TwoHosts

    one, _ = pair
    out, hold = tmp_path / "ddp2hosts", tmp_path / "hold.pid"
    args = [
        str(WORKER),
        str(out),
        str(tiny_model_dir),
        "2",
        "steps=2",
        "save_every=1",
        "keep_checkpoints=0",
        "resume=auto",
    ]
    env = _elastic_env(GRPOLAB_TEST_HOLD=f"1:2:{hold}")
    with TwoHosts() as hosts:
        agents = [hosts.agent(h, ["--max-restarts", "1"], args, env) for h in (0, 1)]
        lost = hosts.host_of(_wait_for_pid(hold, agents))
        # c10d ranks the machines by address: rank 1 runs on host 1, and host 0, which holds the
        # rendezvous store the survivor and the replacement meet in, survives
        assert lost == 1
        hosts.kill_host(lost)
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-000001"]
        replacement = hosts.agent(lost, ["--max-restarts", "1"], args, env)
        codes = [agents[1 - lost].wait(timeout=240), replacement.wait(timeout=240)]
        assert codes == [0, 0]
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    (rec,) = read_jsonl(out / "restarts.jsonl")
    assert rec["step"] == 1 and rec["checkpoint"] == "step-000001" and rec["torchelastic_restart_count"] == 1
    _close_to(one, out)


def test_trl_fsdp_under_torchrun_shards_the_run(tiny_model_dir, tmp_path):
    """TRL's fsdp (grpolab.app.trl_compat.fields_fsdp) under torchrun: `torchrun --nproc_per_node 2 -m grpolab
    train --trl fsdp=full_shard ...` runs sharded with FSDP2 (its idle-pass count is in the step's row)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT / "src")
    cmd = torchrun(
        2,
        "-m",
        "grpolab",
        "train",
        "--trl",
        "fsdp=full_shard",
        "gradient_checkpointing=false",
        f"output_dir={out}",
        f"model={tiny_model_dir}",
        "task=arithmetic",
        "max_steps=1",
        "per_device_train_batch_size=4",  # TRL's global batch 4 x 2 processes: two groups of 4, one per process
        "num_generations=4",
        "max_completion_length=4",
        "learning_rate=1e-3",
        "report_to=none",
        "bf16=false",
        "eval_size=0",
        "progress=false",
        "report=false",
        "threads=1",
    )
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "update/idle_passes" in rows[0]
