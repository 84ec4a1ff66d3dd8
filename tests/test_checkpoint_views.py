"""OUT/checkpoint-N beside grpolab's checkpoints (grpolab.training.checkpoint_views): hard links to a complete
checkpoint's model files and transformers' trainer_state.json, found by get_last_checkpoint and loaded by
from_pretrained; written atomically, never for an incomplete checkpoint, and removed with its checkpoint."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TrainerState
from transformers.trainer_utils import get_last_checkpoint

from grpolab.training import checkpoint_views as views
from grpolab.training.checkpoint import save_checkpoint, verify_checkpoint


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(cfg)


def _state(global_step: int) -> TrainerState:
    state = TrainerState(global_step=global_step, max_steps=8)
    state.log_history = [{"loss": 0.1 * s, "step": s} for s in range(1, global_step + 1)]
    return state


def _save(out, step, model, keep_last=None):
    """A grpolab checkpoint of generation `step`, then its view at optimizer step 2 x step."""
    ck = save_checkpoint(out, step, model, None, None, None, {}, keep_last=keep_last)
    return ck, views.write_view(out, ck, 2 * step, _state(2 * step))


def test_a_view_links_the_model_files_and_holds_transformers_state(tmp_path):
    model = _model()
    ck, view = _save(tmp_path, 1, model)
    assert view == tmp_path / "checkpoint-2" and get_last_checkpoint(str(tmp_path)) == str(view)
    for name in ("config.json", "model.safetensors"):  # hard links: the same file, no disk of its own
        assert not (view / name).is_symlink() and os.path.samefile(view / name, ck / name)
    assert not any((view / n).exists() for n in ("optimizer.pt", "rng.pt", "manifest.json"))
    loaded = AutoModelForCausalLM.from_pretrained(str(view))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    state = TrainerState.load_from_json(str(view / "trainer_state.json"))
    assert state.global_step == 2 and [r["step"] for r in state.log_history] == [1, 2]
    assert views.shown(view) == ck.name and views.saved_state(ck).global_step == 2
    assert verify_checkpoint(ck) is None  # the grpolab checkpoint is untouched
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 1


def test_retention_removes_a_checkpoint_with_its_view(tmp_path):
    model = _model()
    for step in (1, 2, 3):
        _save(tmp_path, step, model, keep_last=1)
    assert [n for n, _ in views.views(tmp_path)] == [6]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000003"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_no_view_for_an_incomplete_checkpoint(tmp_path):
    ck = save_checkpoint(tmp_path, 1, _model(), None, None, None, {})
    with open(ck / "model.safetensors", "r+b") as f:
        f.truncate(10)  # its manifest lists another size
    assert views.write_view(tmp_path, ck, 2, _state(2)) is None
    (ck / "manifest.json").unlink()
    assert views.write_view(tmp_path, ck, 2, _state(2)) is None
    assert views.views(tmp_path) == [] and get_last_checkpoint(str(tmp_path)) is None


def test_a_failed_write_leaves_the_earlier_view_whole(tmp_path):
    model = _model()
    ck, view = _save(tmp_path, 1, model)

    class Broken(TrainerState):
        def save_to_json(self, path):
            raise OSError("No space left on device")

    with pytest.raises(OSError):
        views.write_view(tmp_path, ck, 2, Broken(global_step=2))
    assert TrainerState.load_from_json(str(view / "trainer_state.json")).global_step == 2  # the earlier one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    again = views.write_view(tmp_path, ck, 2, _state(2))  # rewritten in place, atomically
    assert again == view and [n for n, _ in views.views(tmp_path)] == [2]


def test_a_link_named_checkpoint_n_is_not_read_as_a_view(tmp_path):
    ck, _ = _save(tmp_path, 1, _model())
    (tmp_path / "checkpoint-9").symlink_to(tmp_path / "checkpoint-2")
    assert [n for n, _ in views.views(tmp_path)] == [2]
    assert views.saved_state(ck).global_step == 2
