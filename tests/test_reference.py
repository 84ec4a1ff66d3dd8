"""The reference policy (grpolab.model.reference): a frozen copy whose linear layers are stored in the autocast
dtype gives the same log-probs, bit for bit, as the fp32 copy under autocast, in less memory."""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import padded_sequences

from grpolab.model.logprobs import grouped_completion_logp
from grpolab.model.reference import FrozenCopy, reference_for
from grpolab.training.config import build_config


def _logp(model):
    p_ids, p_mask, c_ids, c_mask = padded_sequences(model.config.vocab_size, (2, 6), (8, 5), 0, pad=(1, 2), cut=(3, 3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return grouped_completion_logp(model, p_ids, p_mask, c_ids, c_mask, 4, temperature=0.8)[0]


def test_linear_layers_in_bf16_give_the_same_log_probs_under_autocast(tiny_model):
    ref = FrozenCopy(tiny_model)
    before = _logp(ref.frozen)
    fp32_bytes = sum(p.numel() * p.element_size() for p in ref.frozen.parameters())
    converted = ref.store_linear_in(torch.bfloat16)
    assert torch.equal(_logp(ref.frozen), before)
    m = ref.frozen
    linears = [mod for name, mod in m.named_modules() if type(mod) is torch.nn.Linear and name != "lm_head"]
    assert linears and all(mod.weight.dtype == torch.bfloat16 for mod in linears)
    assert converted == sum(mod.weight.numel() for mod in linears)
    # the head is tied to the embeddings: both stay fp32 (the lookup feeds the fp32 residual stream)
    assert m.lm_head.weight is m.model.embed_tokens.weight and m.lm_head.weight.dtype == torch.float32
    assert sum(p.numel() * p.element_size() for p in m.parameters()) == fp32_bytes - 2 * converted
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())  # the policy is untouched


def test_setup_stores_the_reference_in_the_update_dtype(tiny_model_dir, tmp_path):
    from grpolab.training.trainer import setup

    args = [
        f"model={tiny_model_dir}",
        f"out={tmp_path / 'run'}",
        "algo=grpo",
        "algo.beta=0.04",
        "eval_size=0",
        "progress=false",
        "tensorboard=false",
    ]
    run = setup(build_config(None, [*args, "precision=bf16"]), log=lambda *_: None)
    assert run.amp_dtype == torch.bfloat16
    assert run.ref.frozen.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    run = setup(build_config(None, [*args, "precision=fp32", f"out={tmp_path / 'run32'}"]), log=lambda *_: None)
    assert run.ref.frozen.model.layers[0].mlp.down_proj.weight.dtype == torch.float32


def test_reference_for_builds_the_kind_it_is_given(tiny_model):
    """None for "none", a frozen copy for "copy"; "adapter_off" of a model without an adapter is refused
    (it would be the policy itself, not pi_ref)."""
    assert reference_for(tiny_model, "none") is None
    ref = reference_for(tiny_model, "copy")
    assert isinstance(ref, FrozenCopy) and ref.frozen is not tiny_model
    assert all(not p.requires_grad for p in ref.frozen.parameters())
    with pytest.raises(ValueError, match="adapter_off needs the LoRA"):
        reference_for(tiny_model, "adapter_off")
