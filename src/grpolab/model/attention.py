"""Attention of the policy's own forward passes on a CPU: grouped-query attention by two matrix products.

    A = softmax(Q K^T * s + mask) V,   Q (b, nh, L, d), K and V (b, nkv, S, d), nh = nkv * rep

The rep query heads that share one key/value head are laid side by side, Q -> (b, nkv, rep L, d), so
K and V are never repeated; the softmax computes in fp32 (on fp32 scores, or inside torch's softmax
kernel on bf16 scores under autocast); masked positions get the dtype's most negative number instead
of -inf (a query that may look nowhere, a left-padding position, then gets a finite uniform row
instead of NaN, and its gradient stays 0). On a CPU the update's forward+backward runs faster this
way than with PyTorch's scaled_dot_product_attention, whose CPU flash kernel is slow for these short
masked sequences (docs/performance.md, "The update on a CPU"). It is installed (`install`) for the
LLAMA_FAMILY model types (Llama, Qwen2, Mistral) on a CPU; on a GPU, sdpa's fused kernels stay.
tests/test_attention.py checks it against sdpa and eager attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

NAME = "grpolab_gqa"
LLAMA_FAMILY = ("llama", "qwen2", "mistral")
"""The model types whose forward is the Llama network: this attention installs on them, and the lean
decode step (grpolab.engine.native.decoder) runs them. The one list of them in grpolab."""


def grouped_query_attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: returns ((b, L, nh, d), None).

    attention_mask: what sdpa would get: a bool (b or 1, 1, L, S) mask, True where a query may look,
    or None for plain causal attention (the L queries are the last L of the S positions)."""
    b, nh, L, d = query.shape
    nkv, S = key.shape[1], key.shape[2]
    rep = nh // nkv
    scale = scaling if scaling is not None else d**-0.5
    raw = (query.reshape(b, nkv, rep * L, d) @ key.transpose(-1, -2)).view(b, nkv, rep, L, S)
    if attention_mask is None:
        attention_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(S - L)[None, None]
    if attention_mask.dtype == torch.bool:
        # masked in the product's own dtype, in place (the product's backward needs only q and k): the
        # dtype's most negative number stays far below every score, so the softmax is the same
        masked = ~attention_mask[:, :, None]
        if raw.dtype == value.dtype != torch.float32:
            # bf16/fp16 under autocast: scaled (before the mask, so nothing overflows) and soft-maxed in
            # that dtype (torch's CPU softmax computes in fp32 inside, and p is rounded to value's dtype
            # for the product either way). Autograd then keeps one low-precision p for both backwards
            # instead of an fp32 and a bf16 copy: 12.7 MB less per layer for 16 sequences of 173 keys
            p = torch.softmax(raw.mul_(scale).masked_fill_(masked, torch.finfo(raw.dtype).min), dim=-1)
        else:
            p = torch.softmax(raw.masked_fill_(masked, torch.finfo(raw.dtype).min).float().mul_(scale), dim=-1).to(
                value.dtype
            )
    else:  # an additive float mask
        p = torch.softmax(raw.float().mul_(scale) + attention_mask[:, :, None].float(), dim=-1).to(value.dtype)
    p = p.view(b, nkv, rep * L, S)
    if dropout > 0.0 and module.training:
        p = F.dropout(p, p=dropout)
    out = (p @ value).view(b, nh, L, d).transpose(1, 2).contiguous()  # (b, L, nh, d)
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_query_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets: bool, or None when causal


def install(model, device: torch.device) -> bool:
    """Use grouped_query_attention in `model`'s forward when it is a supported type on a CPU running
    sdpa (an explicit other choice stays). Returns whether it did."""
    cfg = getattr(model, "config", None)
    if device.type != "cpu" or getattr(cfg, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(NAME)
    return True
