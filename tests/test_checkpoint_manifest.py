"""A checkpoint's manifest vouches for the whole directory: nothing it does not list passes
verification, and loading reads only the checkpoint's own files."""

from __future__ import annotations

import json
import os

import pytest
import torch

from grpolab.training.checkpoint import _load_model_weights, save_checkpoint, verify_checkpoint


@pytest.fixture
def ckpt(tiny_model, tmp_path):
    return save_checkpoint(tmp_path / "run", 1, tiny_model, None, None, None, {})


def _evil_weights(tiny_model, tmp_path):
    """A full set of the model's weights, all zero, outside the checkpoint."""
    from safetensors.torch import save_file

    state = {k: torch.zeros_like(v).contiguous() for k, v in tiny_model.state_dict().items() if k != "lm_head.weight"}
    path = tmp_path / "elsewhere" / "evil.safetensors"
    path.parent.mkdir()
    save_file(state, str(path))
    return path


def test_an_added_shard_index_pointing_outside_fails_verification_and_loading(ckpt, tiny_model, tmp_path):
    """An index added after the checkpoint was written, naming weights outside it: it passed the
    manifest (which listed only its own files) and those weights were loaded on resume."""
    assert verify_checkpoint(ckpt) is None
    evil = _evil_weights(tiny_model, tmp_path)
    rel = os.path.relpath(evil, ckpt)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": rel}}))
    problem = verify_checkpoint(ckpt)
    assert problem is not None and "model.safetensors.index.json: not in the manifest" in problem
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with pytest.raises(RuntimeError, match="not a file of the checkpoint"):
        _load_model_weights(ckpt, tiny_model)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": str(evil)}}))
    with pytest.raises(RuntimeError, match="not a file of the checkpoint"):
        _load_model_weights(ckpt, tiny_model)
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())


def test_links_unlisted_files_and_names_outside_fail_verification(ckpt, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    (ckpt / "extra.safetensors").symlink_to(outside)
    assert "a symbolic link" in verify_checkpoint(ckpt)
    (ckpt / "extra.safetensors").unlink()
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "notes.txt").write_text("x")
    assert "sub/notes.txt: not in the manifest" in verify_checkpoint(ckpt)
    (ckpt / "sub" / "notes.txt").unlink()
    (ckpt / "sub").rmdir()
    assert verify_checkpoint(ckpt) is None
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["../outside.bin"] = {"size": 1, "sha256": "0" * 64}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert "malformed entry '../outside.bin'" in verify_checkpoint(ckpt)
    (ckpt / "manifest.json").write_text("[1, 2]")
    assert "not a manifest" in verify_checkpoint(ckpt)
