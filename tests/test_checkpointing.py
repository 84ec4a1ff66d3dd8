"""Activation checkpointing of the update pass (grpolab.model.checkpointing): the same log-probs and
gradients as the plain pass, far fewer saved tensors, nothing left on the model, and a real run.

Tolerances: in fp32 the replayed layer computes the same operations on the same inputs, so the
gradients agree to float rounding (measured here: max |difference| 0, asserted below 1e-6 of the
largest gradient entry). Under bf16 autocast the same holds (the replay casts the same fp32 weights
again; measured: 0 as well); asserted below 1e-3 relative, the rounding of one bf16 product.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import liven

from grpolab.model.checkpointing import checkpointed, decoder_layers
from grpolab.model.logprobs import grouped_completion_logp


def _batch(vocab: int, B: int = 2, G: int = 3, P: int = 7, C: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p_ids = torch.randint(3, vocab, (B, P), generator=g)
    p_mask = torch.ones_like(p_ids)
    p_mask[1, :2] = 0  # a left-padded prompt
    c_ids = torch.randint(3, vocab, (B * G, C), generator=g)
    c_mask = torch.ones(B * G, C)
    c_mask[2, 5:] = 0  # a completion that ended early
    w = torch.randn(B * G, C, generator=g)
    return p_ids, p_mask, c_ids, c_mask, G, w


def _grads(model, batch, *, ckpt: bool, amp: torch.dtype | None = None):
    p_ids, p_mask, c_ids, c_mask, G, w = batch
    model.train()
    model.zero_grad(set_to_none=True)
    with checkpointed(model, ckpt), torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
        logp, ent = grouped_completion_logp(model, p_ids, p_mask, c_ids, c_mask, G, with_entropy=True)
    (logp.float() * w * c_mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def _assert_same(a, b, rel: float):
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = a, b
    assert torch.allclose(lp_a, lp_b, atol=1e-6) and torch.allclose(ent_a, ent_b, atol=1e-6)
    assert g_a.keys() == g_b.keys() and len(g_a) > 5
    scale = max(float(g.abs().max()) for g in g_a.values())
    worst = max(float((g_a[k] - g_b[k]).abs().max()) for k in g_a)
    assert worst <= rel * scale, (worst, scale)


def test_fp32_gradients_equal_the_plain_pass(tiny_model):
    model = liven(tiny_model)
    batch = _batch(model.config.vocab_size)
    _assert_same(_grads(model, batch, ckpt=False), _grads(model, batch, ckpt=True), rel=1e-6)


def test_bf16_autocast_gradients_equal_the_plain_pass(tiny_model):
    model = liven(tiny_model)
    batch = _batch(model.config.vocab_size, seed=1)
    plain = _grads(model, batch, ckpt=False, amp=torch.bfloat16)
    ckpt = _grads(model, batch, ckpt=True, amp=torch.bfloat16)
    _assert_same(plain, ckpt, rel=1e-3)


def test_lora_gradients_equal_the_plain_pass(tiny_model):
    pytest.importorskip("peft")
    from grpolab.model.lora import LoraConfig, attach

    model = attach(liven(tiny_model), LoraConfig(r=4, dropout=0.1))  # dropout: the replay must draw the same mask
    with torch.no_grad():  # B = 0 at start gives zero A-gradients; make the adapter live
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    batch = _batch(model.config.vocab_size, seed=2)
    torch.manual_seed(5)
    plain = _grads(model, batch, ckpt=False)
    torch.manual_seed(5)
    ckpt = _grads(model, batch, ckpt=True)
    assert all("lora_" in k for k in plain[2])
    _assert_same(plain, ckpt, rel=1e-6)


def _saved_bytes(model, batch, ckpt: bool) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward (parameters excluded)."""
    p_ids, p_mask, c_ids, c_mask, G, _ = batch
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), checkpointed(model, ckpt):
        grouped_completion_logp(model, p_ids, p_mask, c_ids, c_mask, G)
    return sum(seen.values())


def test_checkpointing_keeps_far_fewer_tensors_for_the_backward():
    # a small vocabulary, so that the LM head's kept logits (which checkpointing leaves as they are)
    # do not hide the layers; the layers are what grpolab.training.plan.memory counts, so the counts are checked too
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpolab.model.attention import install

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    install(model, torch.device("cpu"))  # the CPU attention the update runs
    batch = _batch(64, B=2, G=4, P=24, C=40)
    plain, ckpt = _saved_bytes(model, batch, False), _saved_bytes(model, batch, True)
    assert ckpt < 0.25 * plain, (plain, ckpt)


def test_the_context_leaves_nothing_on_the_model_and_skips_passes_without_gradients(tiny_model):
    layers = decoder_layers(tiny_model)
    assert len(layers) == tiny_model.config.num_hidden_layers
    with checkpointed(tiny_model):
        assert all("forward" in layer.__dict__ for layer in layers)
        clone = copy.deepcopy(tiny_model)  # a copy made inside the context runs its own weights
        assert all(a is not b for a, b in zip(decoder_layers(clone), layers))
        with torch.no_grad():  # generation / reference: no checkpoint, the cache works as usual
            out = tiny_model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True)
        assert out.past_key_values.get_seq_length() == 3
    assert not any("forward" in layer.__dict__ for layer in layers)
    with checkpointed(tiny_model, enabled=False):
        assert not any("forward" in layer.__dict__ for layer in layers)
