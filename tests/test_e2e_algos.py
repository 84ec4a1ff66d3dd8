"""Every policy-gradient method runs `grpolab train algo=NAME steps=2` end to end on the tiny model and
really updates the policy; PPO also trains its critic, and its cost is visible.

A tiny random model scores 0 on every task, so the runs use a registered test reward that varies within
groups ((sum of character codes mod 5) / 4), giving every estimator a non-zero advantage.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from e2e_helpers import changed, read_jsonl, weights

from grpolab.algo.presets import ALGOS
from grpolab.app.cli import main

SMALL = [
    "steps=2",
    "batch_size=8",
    "G=4",
    "max_new_tokens=8",
    "micro_batch=4",
    "eval_size=0",
    "progress=false",
    "samples_per_step=0",
    "tensorboard=false",
    "rewards=[{name: test_varied}]",
]
REQUIRED_METRICS = [
    "step",
    "reward/mean",
    "reward/std",
    "completion/length_mean",
    "kl",
    "clip/frac",
    "groups/zero_std_frac",
    "entropy",
    "time/step_s",
    "params/trained",
    "memory/peak_mb",
]


pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """runs(name, *extra) -> run directory; each distinct run is trained once per module."""
    root = tmp_path_factory.mktemp("algos")
    done: dict[tuple, Path] = {}

    def get(name: str, *extra: str) -> Path:
        key = (name, *extra)
        if key not in done:
            out = root / "-".join(x.replace("=", "_").replace(".", "_") for x in key)
            rc = main(["train", f"model={tiny_model_dir}", f"out={out}", f"algo={name}", *SMALL, *extra])
            assert rc == 0, f"grpolab train algo={name} {' '.join(extra)} exited with {rc}"
            done[key] = out
        return done[key]

    return get


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_algo_trains_two_steps(name, runs, tiny_model_dir):
    out = runs(name)
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, f"{name}: metrics lack {missing}"
        for k in REQUIRED_METRICS:
            assert math.isfinite(m[k]), (name, k, m[k])
        assert m["update/seqs_computed"] > 0 and m["update/skipped"] == 0, name
        assert m["groups/zero_std_frac"] < 1
        assert math.isfinite(m["loss/policy"]) and m["grad_norm"] > 0, name
    diff = changed(weights(tiny_model_dir), weights(out / "checkpoints" / "step-000002"))
    assert diff, f"algo={name}: two steps left every policy weight unchanged"
    assert (out / "checkpoints" / "step-000002" / "critic.pt").exists() == (name == "ppo")
    assert not (out / "critic.pt").exists()  # nothing of a run's state lives outside its checkpoints


def test_ppo_trains_its_critic_and_shows_the_cost(runs, tiny_model_dir):
    out = runs("ppo")
    lines = read_jsonl(out / "metrics.jsonl")
    for m in lines:
        for k in ("value/loss", "value/error", "value/mean"):
            assert k in m and math.isfinite(m[k]), k
    blob = torch.load(out / "checkpoints" / "step-000002" / "critic.pt", weights_only=True)
    critic = blob["critic"]
    assert blob["opt"]["state"], "the critic's optimiser has no state: it never stepped"
    assert critic["value_head.weight"].abs().sum() > 0, "the zero-initialised value head never moved"
    init = weights(tiny_model_dir)
    backbone = {k.replace("backbone.", "model.", 1): v for k, v in critic.items() if k.startswith("backbone.")}
    assert changed(init, backbone), "the critic's backbone (initialised from the policy) never moved"
    # the critic doubles the trained parameters (policy + a copy of its backbone + a scalar head)
    grpo = read_jsonl(runs("grpo") / "metrics.jsonl")
    assert lines[0]["params/trained"] > 1.5 * grpo[0]["params/trained"]


def test_dapo_dynamic_sampling_metrics(runs):
    for m in read_jsonl(runs("dapo") / "metrics.jsonl"):
        for k in ("dapo/groups_sampled", "dapo/groups_dropped", "dapo/groups_kept"):
            assert k in m, k
        assert m["dapo/groups_kept"] == 2  # batch_size / G prompts, refilled if a group was dropped
        assert m["dapo/groups_sampled"] == m["dapo/groups_kept"] + m["dapo/groups_dropped"]
        assert "reward/overlong_penalty_mean" in m  # soft overlong punishment is on in the preset


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_several_updates_per_rollout(name, runs):
    """mu=2: the second update sees a moved policy, so the importance ratio leaves 1."""
    out = runs(name, "algo.mu=2", "lr=1e-3")
    for m in read_jsonl(out / "metrics.jsonl"):
        for k in ("clip/frac", "ratio/mean", "approx_kl"):
            assert k in m and math.isfinite(m[k]), k
        assert m["ratio/mean"] != 1.0 and m["approx_kl"] > 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def test_the_critic_is_saved_pruned_and_resumed_with_its_checkpoint(tiny_model_dir, tmp_path):
    """critic.pt is written inside each atomic checkpoint and pruned with it, so resuming from an older
    checkpoint restores that step's critic (it used to be one file beside the checkpoints, always the
    newest)."""
    from grpolab.training.config import build_config
    from grpolab.training.trainer import resume_state, setup

    out = tmp_path / "ppo"
    args = [
        f"model={tiny_model_dir}",
        f"out={out}",
        "algo=ppo",
        *SMALL,
        "steps=3",
        "save_every=1",
        "keep_checkpoints=2",
        "lr=1e-3",
    ]
    assert main(["train", *args]) == 0
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert ckpts == ["step-000002", "step-000003"]  # step 1 pruned, its critic with it
    critics = {c: torch.load(out / "checkpoints" / c / "critic.pt", weights_only=True)["critic"] for c in ckpts}
    assert changed(critics["step-000002"], critics["step-000003"]), "the critic did not move between steps"
    # resume from step 2: drop the newest checkpoint, as if the run had stopped before writing it
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-000003")
    (out / "checkpoints" / "latest").write_text("step-000002\n")
    run = setup(
        build_config({}, [a for a in args if not a.startswith("model=")] + [f"model={tiny_model_dir}"]),
        resume=True,
        log=lambda *_: None,
    )
    assert resume_state(run) == 2
    loaded = run.components["critic"].model.state_dict()
    assert not changed(critics["step-000002"], loaded), "resume did not restore the step-2 critic"
