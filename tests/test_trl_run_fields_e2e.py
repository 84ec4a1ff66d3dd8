"""Runs on the tiny model with the settings TRL's run fields map to: save_only_model (checkpoints that load with
from_pretrained and that no run resumes from), eval_delay (no evaluation row before it), ignore_data_skip (a
resumed epoch starts again from its first row) and full_determinism (a run under torch's deterministic
algorithms). What each field means in transformers and TRL is checked in tests/test_trl_run_fields.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from e2e_helpers import read_jsonl

from grpolab import GRPOConfig
from grpolab.app.cli import main
from grpolab.app.trl_compat import trl_recipe
from grpolab.model import numerics
from grpolab.training.checkpoint import verify_checkpoint

pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry

SMALL = [
    "batch_size=4",
    "G=2",
    "micro_batch=4",
    "max_new_tokens=4",
    "eval_size=0",
    "progress=false",
    "report=false",
    "tensorboard=false",
    "lr=1e-3",
    "samples_per_step=4",
    "rewards=[{name: test_varied}]",
]


def _train(capsys, model, out, *args) -> tuple[int, str]:
    code = main(["train", f"model={model}", f"out={out}", *SMALL, *args])
    cap = capsys.readouterr()
    return code, " ".join((cap.out + cap.err).split())


def test_save_only_model_checkpoints_load_and_refuse_to_resume(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    assert trl_recipe(GRPOConfig(save_only_model=True))[0]["save_only_model"] is True
    out = tmp_path / "run"
    code, text = _train(
        capsys, tiny_model_dir, out, "steps=2", "save_every=1", "keep_checkpoints=0", "save_only_model=true"
    )
    assert code == 0, text
    for name in ("step-000001", "step-000002"):
        ck = out / "checkpoints" / name
        files = {p.name for p in ck.iterdir()}
        assert not files & {"optimizer.pt", "scheduler.pt", "rng.pt"} and "model.safetensors" in files, files
        assert json.loads((ck / "trainer_state.json").read_text())["model_only"] is True
        assert verify_checkpoint(ck) is None
    model = AutoModelForCausalLM.from_pretrained(str(out / "checkpoints" / "step-000002"))
    assert model.num_parameters() > 0
    assert main(["train", "--resume", str(out), "steps=3"]) == 2
    said = " ".join("".join(capsys.readouterr()).split())
    assert "save_only_model=true" in said and "no run resumes from it" in said and "from_pretrained" in said
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]  # nothing trained on


def test_eval_delay_leaves_out_the_evaluations_before_it(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, text = _train(
        capsys, tiny_model_dir, out, "steps=4", "save_every=0", "eval_size=2", "eval_steps=1", "eval_delay=3"
    )
    assert code == 0, text
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 3, 4]  # the one before training stays
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3, 4]


def _prompts(out, step: int) -> list:
    return sorted({json.dumps(s["prompt"]) for s in read_jsonl(out / "samples.jsonl") if s["step"] == step})


def test_ignore_data_skip_starts_the_resumed_epoch_again(tiny_model_dir, tmp_path, capsys):
    """6 rows, 2 prompts a step, in file order: steps 1-2 take rows 0-3. Resumed after step 2, step 3 takes rows
    4-5; with ignore_data_skip the epoch starts again, rows 0-1 (step 1's), and a later resume keeps that shift."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {k}.", "answer": str(k)}) + "\n" for k in range(6)))
    first = tmp_path / "first"
    rows = ["task=dataset", f"task_args.path={data}", "num_train_epochs=3", "shuffle=false", "save_every=1"]
    code, text = _train(capsys, tiny_model_dir, first, "steps=2", *rows)
    assert code == 0, text
    skipped = tmp_path / "skipped"
    shutil.copytree(first, skipped)
    assert main(["train", "--resume", str(first), "steps=3"]) == 0
    assert main(["train", "--resume", str(skipped), "steps=3", "ignore_data_skip=true"]) == 0
    assert main(["train", "--resume", str(skipped), "steps=4", "ignore_data_skip=false"]) == 0
    capsys.readouterr()
    assert _prompts(first, 3) != _prompts(first, 1)
    assert _prompts(skipped, 3) == _prompts(first, 1) and _prompts(skipped, 4) == _prompts(first, 2)
    state = json.loads((skipped / "checkpoints" / "step-000004" / "trainer_state.json").read_text())
    assert state["data_shift"] == 4
    assert trl_recipe(GRPOConfig(ignore_data_skip=True))[0]["ignore_data_skip"] is True


@pytest.fixture()
def deterministic_restored(monkeypatch):
    for k in numerics.DETERMINISM_ENV:
        monkeypatch.delenv(k, raising=False)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_a_run_under_full_determinism_trains_as_without(tiny_model_dir, tmp_path, capsys, deterministic_restored):
    """On a CPU torch's deterministic algorithms are the ones it runs anyway: the same metrics, step for step."""
    code, text = _train(capsys, tiny_model_dir, tmp_path / "plain", "steps=2", "save_every=0", "threads=1")
    assert code == 0, text
    assert not torch.are_deterministic_algorithms_enabled()
    code, text = _train(
        capsys, tiny_model_dir, tmp_path / "det", "steps=2", "save_every=0", "threads=1", "full_determinism=true"
    )
    assert code == 0, text
    assert torch.are_deterministic_algorithms_enabled()  # as transformers leaves it, for the rest of the process
    keys = ("loss/policy", "reward/mean", "grad_norm", "entropy")
    plain, det = read_jsonl(tmp_path / "plain" / "metrics.jsonl"), read_jsonl(tmp_path / "det" / "metrics.jsonl")
    assert [[r.get(k) for k in keys] for r in det] == [[r.get(k) for k in keys] for r in plain]
