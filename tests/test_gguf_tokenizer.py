"""The bundled model's tokenizer is shipped (grpolab/data/smollm2-tokenizer), not converted from the GGUF:
transformers 5.17 converts it with EOS = <|im_start|> and no padding token, 5.24 correctly. These tests
run on whatever transformers is installed; the 5.17 run is described in grpolab/data/smollm2-tokenizer/NOTICE.md
and docs/devlog.md."""

from __future__ import annotations

import json
import shutil

from grpolab.model import load as models
from grpolab.model.load import (
    TOKENIZER_FILES,
    _gguf_cache_path,
    _gguf_tokenizer,
    dequantise_gguf,
    find_bundled_gguf,
    load_tokenizer,
    shipped_tokenizer,
)


def test_the_bundled_gguf_has_a_shipped_tokenizer_equal_to_its_cache(real_model_dir):
    shipped = shipped_tokenizer(real_model_dir)
    assert shipped is not None and shipped == shipped_tokenizer(_gguf_cache_path(find_bundled_gguf("smollm2-135m")))
    for name in TOKENIZER_FILES:
        assert (shipped / name).read_bytes() == (real_model_dir / name).read_bytes(), name
    tok = load_tokenizer(shipped)
    cfg = json.loads((real_model_dir / "config.json").read_text())
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == (
        "<|im_end|>",
        cfg["eos_token_id"],
        cfg["pad_token_id"],
    )
    assert len(tok) == cfg["vocab_size"] == 49152
    assert "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_a_cache_holding_the_517_conversion_is_repaired(tmp_path, monkeypatch, real_model_dir):
    """A cache written by transformers 5.17 (EOS <|im_start|>, no pad) gets the shipped files on the next
    hit, without loading the GGUF again."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    gguf = find_bundled_gguf("smollm2-135m")
    target = _gguf_cache_path(gguf)
    target.mkdir(parents=True)
    shutil.copy(real_model_dir / "config.json", target / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(real_model_dir / name, target / name)
    bad = json.loads((target / "tokenizer_config.json").read_text())
    bad.update(eos_token="<|im_start|>", pad_token=None)
    (target / "tokenizer_config.json").write_text(json.dumps(bad))
    assert load_tokenizer(target).eos_token == "<|im_start|>"  # what 5.17's conversion left

    import transformers

    def boom(*a, **k):
        raise AssertionError("the GGUF was loaded again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    assert dequantise_gguf(gguf, log=lambda *_: None) == target
    monkeypatch.undo()
    for name in TOKENIZER_FILES:
        assert (target / name).read_bytes() == (shipped_tokenizer(target) / name).read_bytes(), name
    assert load_tokenizer(target).eos_token_id == 2


def test_a_converted_gguf_tokenizer_gets_eos_and_pad_from_the_config(monkeypatch, tiny_model_dir, tmp_path):
    """Any other GGUF: when the conversion lost the EOS / padding ids (5.17 takes EOS from the BOS id),
    they are set back to the GGUF's own, which transformers puts in the model config."""
    import transformers

    original = transformers.AutoTokenizer.from_pretrained

    def converted(*a, **k):  # what 5.17 gives for a GGUF
        tok = original(str(tiny_model_dir))
        tok.eos_token = "<|im_start|>"
        tok.pad_token = None
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", converted)
    cfg = transformers.AutoConfig.from_pretrained(str(tiny_model_dir))
    tok = _gguf_tokenizer(tmp_path / "any.gguf", cfg)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", cfg.eos_token_id, cfg.pad_token_id)


def test_a_gguf_without_a_shipped_tokenizer_converts_its_own(tmp_path):
    assert shipped_tokenizer(tmp_path / "other-0123456789abcdef") is None
    assert models.SHIPPED_TOKENIZERS  # the bundled one is listed
