"""Which checkpoints a run keeps (grpolab.training.retention): the last by default, every one on request,
the best model besides; TRL's save_total_limit mapped as transformers' Trainer reads it, and pruned as
its rotate_checkpoints prunes; a run resumes from what is kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpolab.app.cli import main
from grpolab.training.checkpoint import CHECKPOINTS, LATEST, MANIFEST, _step_dirs, checkpoint_name
from grpolab.training.config import Config, build_config, validate
from grpolab.training.retention import checkpoints_to_delete
from grpolab.util.fields import ConfigError

pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry

FAST = [
    "batch_size=4",
    "G=2",
    "max_new_tokens=4",
    "micro_batch=4",
    "progress=false",
    "tensorboard=false",
    "report=false",
    "rewards=[{name: test_varied}]",
]


def fake_checkpoints(root: Path, steps) -> list[Path]:
    """Complete-looking step checkpoints (the files _step_dirs looks for), oldest first."""
    out = []
    for s in steps:
        d = root / checkpoint_name(s)
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"step": s}))
        (d / MANIFEST).write_text("{}")
        (d / "model.safetensors").write_bytes(b"")
        out.append(d)
    return out


def prune_checkpoints(root: Path, keep_last, *, keep: Path, protect=()) -> list[Path]:
    """What save_checkpoint does after a write: list the complete checkpoints, delete what the rule says."""
    gone = checkpoints_to_delete([p for _, p in _step_dirs(root)], keep_last, keep=keep, protect=protect)
    for p in gone:
        shutil.rmtree(p)
    return gone


def kept(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_prune_keeps_the_newest_the_one_just_written_the_protected_and_every_other_name(tmp_path):
    root = tmp_path / CHECKPOINTS
    dirs = fake_checkpoints(root, [1, 2, 3, 4, 5])
    (root / "best").mkdir()  # save_best's copy: not a step checkpoint, never listed
    (root / ".tmp-step-000006-x").mkdir()  # a write in progress: not complete, never listed
    gone = prune_checkpoints(root, 2, keep=dirs[-1], protect=[dirs[1]])
    # 4 others, the newest keep_last - 1 = 1 of them kept (4), the protected step 2 never deleted
    assert gone == [dirs[0], dirs[2]]
    assert kept(root) == [".tmp-step-000006-x", "best", "step-000002", "step-000004", "step-000005"]
    assert prune_checkpoints(root, 1, keep=dirs[-1]) == [dirs[1], dirs[3]]
    assert kept(root) == [".tmp-step-000006-x", "best", "step-000005"]


@pytest.mark.parametrize("keep_last", [None, 0])
def test_none_or_zero_keeps_every_checkpoint(tmp_path, keep_last):
    root = tmp_path / CHECKPOINTS
    dirs = fake_checkpoints(root, [1, 2, 3])
    assert prune_checkpoints(root, keep_last, keep=dirs[-1]) == []
    assert kept(root) == ["step-000001", "step-000002", "step-000003"]


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_pruning_matches_transformers_rotate_checkpoints(tmp_path, limit):
    """The same steps under TRL's names (checkpoint-N) and grpolab's: transformers' rotate_checkpoints
    (no best model) and prune_checkpoints keep the same steps."""
    from transformers.trainer_utils import rotate_checkpoints

    steps = [2, 4, 6, 8, 10]
    trl_dir = tmp_path / "trl"
    for s in steps:
        (trl_dir / f"checkpoint-{s}").mkdir(parents=True)
    rotate_checkpoints(str(trl_dir), save_total_limit=limit)
    theirs = sorted(int(p.name.split("-")[1]) for p in trl_dir.iterdir())
    root = tmp_path / "ours" / CHECKPOINTS
    dirs = fake_checkpoints(root, steps)
    prune_checkpoints(root, limit, keep=dirs[-1])
    assert sorted(int(p.name.split("-")[1]) for p in root.iterdir()) == theirs


def test_the_default_keeps_the_last_and_zero_every_one_and_negative_is_refused():
    assert Config().keep_checkpoints == 1
    validate(Config(keep_checkpoints=0))
    with pytest.raises(ConfigError, match="keep_checkpoints.*>= 0"):
        validate(Config(keep_checkpoints=-1))


@pytest.mark.parametrize(("limit", "keep"), [(None, 0), (0, 0), (-1, 0), (1, 1), (3, 3)])
def test_trls_save_total_limit_maps_as_transformers_reads_it(limit, keep):
    """transformers' Trainer prunes nothing for save_total_limit None or <= 0 (rotate_checkpoints)."""
    from grpolab.app.trl_compat import GRPOConfig
    from grpolab.app.trl_compat.config import trl_recipe

    cfg = build_config(trl_recipe(GRPOConfig(output_dir="runs/x", save_total_limit=limit))[0])
    assert cfg.keep_checkpoints == keep


def test_a_run_keeps_its_last_checkpoint_and_the_best_model_and_resumes_from_them(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    every = ["steps=3", "save_every=1", "eval_size=4", "eval_steps=1", "save_best=eval/accuracy"]
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *FAST, *every]) == 0
    root = out / CHECKPOINTS
    assert kept(root) == ["best", "step-000003"]  # the last, and the best model besides
    assert (root / LATEST).read_text().strip() == "step-000003"
    assert main(["train", "--resume", str(out), "steps=4"]) == 0
    restarts = [json.loads(line) for line in (out / "restarts.jsonl").read_text().splitlines()]
    assert restarts[-1]["checkpoint"] == "step-000003" and restarts[-1]["step"] == 3
    assert kept(root) == ["best", "step-000004"]
    again = tmp_path / "all"
    assert main(["train", f"model={tiny_model_dir}", f"out={again}", *FAST, "steps=3", "save_every=1"]) == 0
    assert kept(again / CHECKPOINTS) == ["step-000003"]
    every_one = tmp_path / "every"
    args = [f"model={tiny_model_dir}", f"out={every_one}", *FAST, "steps=3", "save_every=1", "keep_checkpoints=0"]
    assert main(["train", *args]) == 0
    assert kept(every_one / CHECKPOINTS) == ["step-000001", "step-000002", "step-000003"]
