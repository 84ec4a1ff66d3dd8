"""The LM head and log-softmax of the completion positions, a chunk of positions at a time.

A plain pass builds the (M, V) logits of every completion position at once, in fp32 for the
log-softmax, and autograd keeps them (and a softmax of the same size) for the backward: for 16
completions of 128 tokens and SmolLM2's 49,152-token vocabulary that is about 400 MB per copy.
`chunked_token_logp` applies the head to `rows_per_chunk` positions at a time, keeps only the hidden
states and one log-sum-exp per position, and recomputes each chunk's logits in the backward (the cure
Liger's and Unsloth's fused losses use). The numbers are those of the plain pass (same matmul dtype,
logits rounded to it, fp32 log-softmax); tests/test_lmhead.py checks values and gradients.

Where all positions' logits in the matmul dtype take at most `SAVED_LOGITS_BYTES` (256 MB: 16 x 128
positions of SmolLM2 in bf16 take 201 MB), they are kept from the forward instead of recomputed: no
recomputing product, a quarter of the head's arithmetic (docs/performance.md, "The update on a CPU").
In fp32 the numbers are bit for bit the recomputing path's; in bf16 the backward's two products then run
once over all positions, so the weight gradient is rounded once, as a plain head's backward rounds it.
The backward overwrites the kept logits with their gradient, so a second backward through the same
pass is refused by autograd's in-place check. Larger batches (a GPU's) recompute, so the head's memory
stays bounded.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOGIT_BUDGET = 1 << 24  # fp32 logits held at once: 16M entries (64 MB)
SAVED_LOGITS_BYTES = 1 << 28  # logits of every position kept for the backward up to this size (256 MB)


def rows_per_chunk(vocab: int, budget: int = LOGIT_BUDGET) -> int:
    """Positions per chunk so that one chunk's fp32 logits hold at most `budget` entries."""
    return max(1, budget // max(1, vocab))


def keeps_logits(positions: int, vocab: int, dtype: torch.dtype, budget: int = SAVED_LOGITS_BYTES) -> bool:
    """Whether the (positions, vocab) logits in `dtype` fit the budget, so the backward reads them
    instead of recomputing them."""
    return positions * vocab * torch.finfo(dtype).bits // 8 <= budget


def _compute_dtype(h: Tensor) -> torch.dtype:
    """The matmul dtype the surrounding autocast would use (h's own dtype without autocast)."""
    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return h.dtype


class _Buffers:
    """The chunk-sized scratch tensors of one pass, allocated once and reused by every chunk.

    On the CPU a fresh tensor of this size (64 MB) costs more than the arithmetic on it: its pages are
    faulted in anew, where an in-place op on a tensor already touched does not fault (docs/performance.md,
    "The update on a CPU"). So each pass writes its logits, their
    fp32 copy and the exponentials into these instead of into new tensors."""

    def __init__(self, chunk: int, V: int, dtype: torch.dtype, device, second: bool):
        self.zf = torch.empty((chunk, V), dtype=torch.float32, device=device)  # fp32 logits, then in place
        self.z = self.zf if dtype == torch.float32 else torch.empty((chunk, V), dtype=dtype, device=device)
        self.ef = torch.empty((chunk, V), dtype=torch.float32, device=device) if second else None

    def logits(self, hc: Tensor, wc: Tensor, temperature: float, keep: Tensor | None = None) -> Tensor:
        """z = (h W^T) / T in fp32 (m, V), the matmul in hc's and wc's dtype, in the buffers; with `keep`
        (m, V) the product goes there (and stays there for the backward)."""
        m = hc.shape[0]
        if keep is None:
            torch.mm(hc, wc.T, out=self.z[:m])
            return self.as_fp32(self.z[:m], temperature, self.z is self.zf)
        torch.mm(hc, wc.T, out=keep)
        return self.as_fp32(keep, temperature)

    def as_fp32(self, z: Tensor, temperature: float, in_place: bool = False) -> Tensor:
        """z / T in the fp32 buffer (z itself when it already is that buffer)."""
        zf = self.zf[: z.shape[0]]
        if not in_place:
            zf.copy_(z)
        return zf.div_(temperature) if temperature != 1.0 else zf


def _row_dot_into(a: Tensor, b: Tensor) -> Tensor:
    """sum_v a[t, v] b[t, v] per row (m,), the products written over `a` (a scratch buffer): no new (m, V)
    tensor. torch's sum adds the V products pairwise, so its rounding error grows as log2(V) eps, where a
    (1 x V) by (V x 1) product (bmm) adds them in sequence: V eps, which for SmolLM2's vocabulary
    (V = 49,152) put entropies of 3.5 off by 1e-4."""
    return a.mul_(b).sum(-1)


class _ChunkedTokenLogp(torch.autograd.Function):
    """log pi(y_t | s_t) = z_{t, y_t} - logsumexp_v z_{t, v},  z_t = W h_t / T,  chunk by chunk.

    Backward, with g_t the incoming gradient of log pi(y_t | s_t) and p_t = softmax(z_t):
        dL/dz_t = g_t (onehot(y_t) - p_t),   dL/dh_t = (dL/dz_t / T) W,   dL/dW = sum_t (dL/dz_t / T)^T h_t
    recomputing z_t from the saved h_t and logsumexp(z_t). With the entropy H_t = -sum_v p_v log p_v in
    the loss too (an entropy bonus), its incoming gradient e_t adds dH_t/dz_t = -p_t (log p_t + H_t):
        dL/dz_t = g_t onehot(y_t) - p_t (g_t + e_t (log p_t + H_t)).
    """

    @staticmethod
    def forward(ctx, h, w, targets, temperature, chunk, dtype, with_entropy, keep_bytes):
        dev = h.device.type
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)
            M = h.shape[0]
            buf = _Buffers(min(chunk, M), w.shape[0], dtype, h.device, second=with_entropy)
            logp = torch.empty(M, dtype=torch.float32, device=h.device)
            lse = torch.empty(M, dtype=torch.float32, device=h.device)
            ent = torch.empty(M, dtype=torch.float32, device=h.device) if with_entropy else None
            kept = (
                torch.empty((M, w.shape[0]), dtype=dtype, device=h.device)
                if keeps_logits(M, w.shape[0], dtype, keep_bytes)
                else None
            )  # (M, V) or None
            for s in range(0, M, chunk):
                z = buf.logits(hc[s : s + chunk], wc, temperature, None if kept is None else kept[s : s + chunk])
                target_z = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1)
                mx = z.amax(-1)
                mx = mx.masked_fill(torch.isinf(mx), 0.0)  # an all -inf row stays -inf, as in torch.logsumexp
                z.sub_(mx[:, None])  # z - max, in place
                if ent is None:
                    lse_c = z.exp_().sum(-1).log_().add_(mx)  # (m,)
                else:  # H_t = -sum_v p_v log p_v, log p = z - logsumexp(z)
                    e = torch.exp(z, out=buf.ef[: z.shape[0]])
                    sum_e = e.sum(-1)
                    lse_c = sum_e.log() + mx
                    ent[s : s + chunk] = sum_e.log() - _row_dot_into(z, e) / sum_e  # z is scratch by now
                lse[s : s + chunk] = lse_c
                logp[s : s + chunk] = target_z - lse_c
        if ent is None:
            ent = torch.zeros(0, device=h.device)
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(h, w, targets, lse, kept, ent)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not zeros
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        h, w, targets, lse, kept, ent = ctx.saved_tensors
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        T, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        dev = h.device.type
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # low precision with kept logits: dz overwrites them, and the two products run once over all
        # positions (one rounding of grad W, as a plain head's backward); fp32 keeps the chunked products
        at_once = kept is not None and dtype != torch.float32
        with torch.autocast(dev, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)
            buf = _Buffers(min(chunk, h.shape[0]), w.shape[0], dtype, h.device, second=False)
            grad_h = torch.empty_like(h) if need_h and not at_once else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w and not at_once else None
            gw = (
                torch.empty(w.shape, dtype=dtype, device=w.device)
                if need_w and dtype != torch.float32 and not at_once
                else None
            )
            rows = torch.arange(min(chunk, h.shape[0]), device=h.device)
            for s in range(0, h.shape[0], chunk):
                if kept is None:
                    z = buf.logits(hc[s : s + chunk], wc, T)  # (m, V)
                else:
                    z = buf.as_fp32(kept[s : s + chunk], T)
                m = z.shape[0]
                g = grad_logp[s : s + chunk].float() / T  # (m,)
                if grad_ent is None:
                    dz = z.sub_(lse[s : s + chunk, None]).exp_().mul_(-g[:, None])  # -g p / T
                else:  # -p (g + e (log p + H)) / T
                    e = grad_ent[s : s + chunk].float()[:, None] / T  # (m, 1)
                    logq = z.sub_(lse[s : s + chunk, None])  # (m, V) log p, in place
                    p = logq.exp()
                    dz = logq.add_(ent[s : s + chunk, None]).mul_(e).add_(g[:, None]).mul_(p).neg_()
                dz[rows[:m], targets[s : s + chunk]] += g  # + g onehot(y) / T
                if at_once:
                    kept[s : s + chunk].copy_(dz)
                    continue
                if buf.z is not buf.zf:
                    dz = buf.z[:m].copy_(dz)  # in the matmul dtype
                if need_h:
                    grad_h[s : s + chunk] = (dz @ wc).to(h.dtype)
                if need_w and gw is None:
                    grad_w.addmm_(dz.T, hc[s : s + chunk])
                elif need_w:
                    grad_w += torch.mm(dz.T, hc[s : s + chunk], out=gw)
            if at_once:  # kept now holds dz (M, V) in the matmul dtype
                grad_h = (kept @ wc).to(h.dtype) if need_h else None
                grad_w = torch.mm(kept.T, hc).float() if need_w else None
        return grad_h, grad_w.to(w.dtype) if need_w else None, None, None, None, None, None, None


def chunked_token_logp(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int | None = None,
    keep_bytes: int = SAVED_LOGITS_BYTES,
) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | s_t) (b, C) of targets (b, C) from hidden states h (b, C, H) and the head's weight
    (V, H) (no bias), and the entropy H_t (b, C) when asked (differentiable), without holding more than one
    chunk of fp32 logits. The matmul runs in the surrounding autocast dtype, like a plain `lm_head(h)`.
    The (b C, V) logits in that dtype are kept for the backward when they take at most keep_bytes
    (0: always recompute)."""
    b, C, H = h.shape
    chunk = chunk or rows_per_chunk(weight.shape[0])
    if not (torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)):
        keep_bytes = 0  # no backward will read them
    logp, ent = _ChunkedTokenLogp.apply(
        h.reshape(b * C, H),
        weight,
        targets.reshape(b * C),
        float(temperature),
        int(chunk),
        _compute_dtype(h),
        bool(with_entropy),
        int(keep_bytes),
    )
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
