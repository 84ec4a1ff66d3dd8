"""Checkpoints: round trip of weights / optimizer / scheduler / RNG, atomicity under a crash, pruning."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import grpolab.training.checkpoint as ckpt
from grpolab.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


def _tiny(tie: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    return model, opt, sched


def _train_step(model, opt, sched):
    ids = torch.randint(0, 64, (2, 5))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _clone_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tie", [False, True])
def test_round_trip(tmp_path, tie):
    model, opt, sched = _tiny(tie)
    _train_step(model, opt, sched)
    _train_step(model, opt, sched)
    weights = _clone_state(model)
    opt_state = opt.state_dict()
    exp_avg = {k: v["exp_avg"].clone() for k, v in opt_state["state"].items()}
    sched_state = sched.state_dict()

    random.seed(123)
    torch.manual_seed(456)
    path = save_checkpoint(tmp_path, 2, model, None, opt, sched, {"metrics_line": 2, "note": "x"})
    assert path == tmp_path / "checkpoints" / "step-000002"
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert {"optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json"} <= {p.name for p in path.iterdir()}
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert latest_checkpoint(tmp_path) == path
    expected_py, expected_torch = random.random(), torch.rand(3)

    # Mutate everything, then restore.
    _train_step(model, opt, sched)
    random.seed(0)
    torch.manual_seed(0)
    assert any(not torch.equal(weights[k], v) for k, v in model.state_dict().items())

    state = load_checkpoint(path, model, opt, sched)
    assert state["step"] == 2 and state["metrics_line"] == 2 and state["note"] == "x"
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    if tie:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    restored = opt.state_dict()
    assert restored["param_groups"] == opt_state["param_groups"]
    for k, v in restored["state"].items():
        assert torch.equal(v["exp_avg"], exp_avg[k]) and int(v["step"]) == 2
    assert sched.state_dict() == sched_state
    # RNG streams continue exactly as after the save.
    assert random.random() == expected_py
    assert torch.equal(torch.rand(3), expected_torch)

    # A fresh model + optimizer also resumes (the usual case), and loads into a loaded HF directory.
    fresh, fresh_opt, fresh_sched = _tiny(tie, seed=1)
    load_checkpoint(path, fresh, fresh_opt, fresh_sched)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert fresh_sched.last_epoch == sched.last_epoch
    assert torch.equal(
        LlamaForCausalLM.from_pretrained(path).model.embed_tokens.weight, weights["model.embed_tokens.weight"]
    )


def test_numpy_rng_restored(tmp_path):
    np = pytest.importorskip("numpy")
    model, opt, sched = _tiny()
    np.random.seed(7)
    path = save_checkpoint(tmp_path, 1, model, None, opt, sched, {})
    expected = np.random.rand(4)
    np.random.seed(0)
    load_checkpoint(path, model, None, None)
    assert np.array_equal(np.random.rand(4), expected)


def test_crash_mid_write_keeps_latest(tmp_path, monkeypatch):
    model, opt, sched = _tiny()
    first = save_checkpoint(tmp_path, 1, model, None, opt, sched, {"a": 1})

    real_save = torch.save
    calls = {"n": 0}

    def crashing_save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # optimizer.pt written, scheduler.pt crashes
            raise OSError("disk full")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", crashing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model, None, opt, sched, {"a": 2})
    monkeypatch.setattr(ckpt.torch, "save", real_save)

    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text().strip() == "step-000001"
    assert not (root / "step-000002").exists()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]  # temp dir cleaned
    assert latest_checkpoint(tmp_path) == first
    assert load_checkpoint(first, model, opt, sched)["a"] == 1


def test_hard_crash_leftovers_ignored_and_cleaned(tmp_path, monkeypatch):
    model, opt, sched = _tiny()
    first = save_checkpoint(tmp_path, 1, model, None, opt, sched, {})
    root = tmp_path / "checkpoints"

    # A process killed before the rename: its temp dir stays, `latest` is untouched.
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", lambda *a, **k: None)  # no cleanup: like SIGKILL
    monkeypatch.setattr(ckpt.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model, None, opt, sched, {})
    monkeypatch.undo()
    leftovers = [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers and latest_checkpoint(tmp_path) == first

    # A partial directory with a step name (e.g. copied by hand) is not taken as a checkpoint.
    (root / "step-000009").mkdir()
    (root / "step-000009" / "config.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == first

    # The next save cleans the leftovers.
    save_checkpoint(tmp_path, 3, model, None, opt, sched, {})
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert latest_checkpoint(tmp_path) == root / "step-000003"


def test_latest_falls_back_when_pointer_missing_or_stale(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    model, opt, sched = _tiny()
    save_checkpoint(tmp_path, 1, model, None, opt, sched, {})
    save_checkpoint(tmp_path, 5, model, None, opt, sched, {})
    root = tmp_path / "checkpoints"
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step-000005"
    (root / "latest").write_text("step-000777\n")
    assert latest_checkpoint(tmp_path) == root / "step-000005"


def test_pruning_and_resave(tmp_path):
    model, opt, sched = _tiny()
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, None, opt, sched, {"s": step}, keep_last=2)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000003", "step-000004"]
    save_checkpoint(tmp_path, 5, model, None, opt, sched, {}, keep_last=1)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000005"]
    for step in (6, 7):
        save_checkpoint(tmp_path, step, model, None, opt, sched, {}, keep_last=None)
    assert len(list(root.glob("step-*"))) == 3
    # Saving the same step again replaces it.
    save_checkpoint(tmp_path, 7, model, None, opt, sched, {"again": True}, keep_last=None)
    assert json.loads((root / "step-000007" / "trainer_state.json").read_text())["again"] is True
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_tokenizer_saved_and_bad_state(tmp_path):
    class Tok:
        def save_pretrained(self, d):
            (__import__("pathlib").Path(d) / "tokenizer_config.json").write_text("{}")

    model, opt, sched = _tiny()
    path = save_checkpoint(tmp_path, 1, model, Tok(), None, None, {})
    assert (path / "tokenizer_config.json").is_file() and not (path / "optimizer.pt").exists()
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 2, model, None, opt, sched, {"bad": object()})
    assert latest_checkpoint(tmp_path) == path


def test_load_rejects_mismatch(tmp_path):
    model, opt, sched = _tiny()
    path = save_checkpoint(tmp_path, 1, model, None, opt, sched, {})
    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(RuntimeError, match="lacks weights"):
        load_checkpoint(path, other, None, None)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path, model, None, None)
