"""The LM head and log-softmax of the completion positions, a chunk of positions at a time.

A plain pass builds the (M, V) logits of every completion position at once, in fp32 for the
log-softmax, and autograd keeps them (and a softmax of the same size) for the backward: for 16
completions of 128 tokens and SmolLM2's 49,152-token vocabulary that is about 400 MB per copy.
`chunked_token_logp` applies the head to `rows_per_chunk` positions at a time, keeps only the hidden
states and one log-sum-exp per position, and recomputes each chunk's logits in the backward (the cure
Liger's and Unsloth's fused losses use). The numbers are those of the plain pass (same matmul dtype,
logits rounded to it, fp32 log-softmax); tests/test_lmhead.py checks values and gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOGIT_BUDGET = 1 << 24  # fp32 logits held at once: 16M entries (64 MB)


def rows_per_chunk(vocab: int, budget: int = LOGIT_BUDGET) -> int:
    """Positions per chunk so that one chunk's fp32 logits hold at most `budget` entries."""
    return max(1, budget // max(1, vocab))


def _compute_dtype(h: Tensor) -> torch.dtype:
    """The matmul dtype the surrounding autocast would use (h's own dtype without autocast)."""
    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return h.dtype


def _chunk_logits(h: Tensor, w: Tensor, temperature: float) -> Tensor:
    """z = (h W^T) / T in fp32, with the matmul in h's and w's dtype. h (m, H), w (V, H) -> (m, V)."""
    z = (h @ w.T).float()
    return z / temperature if temperature != 1.0 else z


class _ChunkedTokenLogp(torch.autograd.Function):
    """log pi(y_t | s_t) = z_{t, y_t} - logsumexp_v z_{t, v},  z_t = W h_t / T,  chunk by chunk.

    Backward, with g_t the incoming gradient of log pi(y_t | s_t) and p_t = softmax(z_t):
        dL/dz_t = g_t (onehot(y_t) - p_t),   dL/dh_t = (dL/dz_t / T) W,   dL/dW = sum_t (dL/dz_t / T)^T h_t
    recomputing z_t from the saved h_t and logsumexp(z_t).
    """

    @staticmethod
    def forward(ctx, h, w, targets, temperature, chunk, dtype, with_entropy):
        dev = h.device.type
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)
            M = h.shape[0]
            logp = torch.empty(M, dtype=torch.float32, device=h.device)
            lse = torch.empty(M, dtype=torch.float32, device=h.device)
            ent = torch.empty(M, dtype=torch.float32, device=h.device) if with_entropy else None
            for s in range(0, M, chunk):
                z = _chunk_logits(hc[s:s + chunk], wc, temperature)  # (m, V)
                lse_c = torch.logsumexp(z, dim=-1)  # (m,)
                lse[s:s + chunk] = lse_c
                logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1) - lse_c
                if ent is not None:  # H_t = logsumexp(z) - sum_v p_v z_v
                    z_sub = z.sub_(lse_c[:, None])  # log p, in place
                    ent[s:s + chunk] = -(z_sub.exp() * z_sub).sum(-1)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        if ent is None:
            ent = torch.zeros(0, device=h.device)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        h, w, targets, lse = ctx.saved_tensors
        T, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        dev = h.device.type
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
            rows = torch.arange(min(chunk, h.shape[0]), device=h.device)
            for s in range(0, h.shape[0], chunk):
                z = _chunk_logits(hc[s:s + chunk], wc, T)  # (m, V)
                m = z.shape[0]
                g = grad_logp[s:s + chunk].float() / T  # (m,)
                dz = z.sub_(lse[s:s + chunk, None]).exp_().mul_(-g[:, None])  # -g p / T
                dz[rows[:m], targets[s:s + chunk]] += g  # + g onehot(y) / T
                dz = dz.to(dtype)
                if need_h:
                    grad_h[s:s + chunk] = (dz @ wc).to(h.dtype)
                if need_w:
                    grad_w += (dz.T @ hc[s:s + chunk]).float()
        return grad_h, grad_w.to(w.dtype) if need_w else None, None, None, None, None, None


def chunked_token_logp(h: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0,
                       with_entropy: bool = False, chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | s_t) (b, C) of targets (b, C) from hidden states h (b, C, H) and the head's weight
    (V, H) (no bias), and the entropy H_t (b, C) when asked (no gradient), without holding more than one
    chunk of logits. The matmul runs in the surrounding autocast dtype, like a plain `lm_head(h)`."""
    b, C, H = h.shape
    chunk = chunk or rows_per_chunk(weight.shape[0])
    logp, ent = _ChunkedTokenLogp.apply(h.reshape(b * C, H), weight, targets.reshape(b * C), float(temperature),
                                        int(chunk), _compute_dtype(h), bool(with_entropy))
    return logp.view(b, C), (ent.view(b, C) if with_entropy else None)


def plain_head_weight(model) -> Tensor | None:
    """The output embedding's weight when the head is a plain bias-free linear map (what the chunked
    path computes); None for anything else (a bias, a PEFT-wrapped head, a head with forward hooks,
    which must see its output), which takes the plain path."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if head._forward_hooks or head._forward_pre_hooks or torch.nn.modules.module._global_forward_hooks:
        return None
    return head.weight
