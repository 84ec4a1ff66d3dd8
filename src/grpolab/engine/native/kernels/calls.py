"""How grpolab.engine.native.kernels calls its C functions (ctypes, fp32 CPU tensors) and the self-check each
kernel passes before first use (the same results as the torch path on random inputs)."""

from __future__ import annotations

import torch


def _fp32_rows(*ts: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in ts)


def _call_attention(fn, q, k, v, valid, S: int, scale: float):
    if not (
        _fp32_rows(q, k, v)
        and valid.dtype == torch.bool
        and valid.stride(-1) == 1
        and q.is_contiguous()
        and k.is_contiguous()
        and v.is_contiguous()
    ):
        return None  # the C side reads raw fp32 rows and one byte per slot
    N, nh, d = q.shape
    if k.shape[2] != d or v.shape[2] != k.shape[3]:
        return None
    out = torch.empty_like(q)
    args = (q, k, v, valid, out)
    rc = fn(*(t.data_ptr() for t in args), N, nh, k.shape[1], d, S, k.shape[3], valid.stride(0), scale)
    return out if rc == 0 else None


def _call_rope_attend(fn, qkv, cos, sin, k, v, valid, t: int, nh: int, scale: float):
    if not (
        _fp32_rows(qkv, cos, sin, k, v)
        and qkv.dim() == 2
        and cos.is_contiguous()
        and sin.is_contiguous()
        and k.is_contiguous()
        and v.is_contiguous()
        and valid.dtype == torch.bool
        and valid.stride(-1) == 1
    ):
        return None
    N, nkv, d, cap = k.shape
    if (
        v.shape != (N, nkv, cap, d)
        or cos.shape != (N, d)
        or sin.shape != (N, d)
        or qkv.shape != (N, (nh + 2 * nkv) * d)
    ):
        return None
    out = torch.empty((N, nh * d))
    rc = fn(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(), valid.data_ptr(),
        valid.stride(0), out.data_ptr(), N, nh, nkv, d, t, cap, scale,
    )  # fmt: skip
    return out if rc == 0 else None


def _call_sample(fn, logits, temperature: float, greedy: bool, generator):
    if not (_fp32_rows(logits) and logits.dim() == 2 and temperature > 0):
        return None
    N, V = logits.shape
    u = torch.rand((N, 1), generator=generator) if not greedy else torch.zeros((N, 1))  # the torch path's draw
    tok, logp = torch.empty(N, dtype=torch.long), torch.empty(N)
    rc = fn(
        logits.data_ptr(),
        N,
        V,
        logits.stride(0),
        1.0 / temperature,
        u.data_ptr(),
        int(greedy),
        tok.data_ptr(),
        logp.data_ptr(),
    )
    return (tok, logp) if rc == 0 else None


def _call_rms_norm(fn, x, weight, eps: float):
    if not (_fp32_rows(x, weight) and x.dim() == 2 and weight.is_contiguous() and weight.shape == x.shape[-1:]):
        return None
    out = torch.empty(x.shape)
    fn(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), weight.data_ptr(), eps, out.data_ptr())
    return out


def _call_silu_mul(fn, gu):
    if not (_fp32_rows(gu) and gu.dim() == 2 and gu.shape[1] % 2 == 0):
        return None
    N, I = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((N, I))
    fn(gu.data_ptr(), N, I, gu.stride(0), out.data_ptr())
    return out


class Panels:
    """fp32 weights packed for grpolab_panel_linear (decode_linear.c): W (out, in) as panels of `width`
    output columns, each (in, width) contiguous."""

    def __init__(self, fns, W: torch.Tensor):
        self.fns, self.out_features, self.in_features = fns, W.shape[0], W.shape[1]
        width = fns["grpolab_panel_width"]()
        self.data = torch.empty(-(-self.out_features // width) * width * self.in_features)
        W = W.detach().float().contiguous()
        fns["grpolab_pack_panels"](W.data_ptr(), self.out_features, self.in_features, self.data.data_ptr())

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None, add: torch.Tensor | None = None):
        """add + x W^T + bias for x (..., in) fp32 (add (..., out) or None), or None for inputs it does not take."""
        rows = x.reshape(-1, self.in_features)
        if not (_fp32_rows(rows) and rows.is_contiguous() and rows.shape[0] > 0):
            return None
        extra = [t for t in (bias, add) if t is not None]
        if not (_fp32_rows(*extra) and all(t.is_contiguous() for t in extra)):
            return None
        if add is not None and add.numel() != rows.shape[0] * self.out_features:
            return None
        out = torch.empty((*x.shape[:-1], self.out_features))
        rc = self.fns["grpolab_panel_linear"](
            rows.data_ptr(), rows.shape[0], self.in_features, self.data.data_ptr(), self.out_features,
            None if bias is None else bias.data_ptr(), None if add is None else add.data_ptr(), out.data_ptr(),
        )  # fmt: skip
        return out if rc == 0 else None


def _check_panel_linear(width, pack, fn) -> str | None:
    """None when panel_linear's products (a tail of rows, a tail of columns, bias and add) agree with
    F.linear, else why not."""
    g = torch.Generator().manual_seed(6)
    W, b, x = (torch.randn(shape, generator=g) for shape in ((37, 24), (37,), (21, 24)))
    add = torch.randn((21, 37), generator=g)
    fns = {"grpolab_panel_width": width, "grpolab_pack_panels": pack, "grpolab_panel_linear": fn}
    panels = Panels(fns, W)
    got, want = panels.apply(x, b, add), add + torch.nn.functional.linear(x, W, b)
    ok = got is not None and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    ok = ok and torch.allclose(panels.apply(x[:3]), torch.nn.functional.linear(x[:3], W), atol=1e-5, rtol=1e-5)
    return None if ok else "the panel product disagreed with F.linear on its self-check"


def _check_attention(fn) -> str | None:
    """None when the kernel agrees with grpolab.model.attention on random inputs (padding included), else why not."""
    from grpolab.model.attention import grouped_query_attention

    g = torch.Generator().manual_seed(0)
    N, nh, nkv, d, cap, S = 3, 6, 2, 16, 12, 9
    q, k, v = (torch.randn(shape, generator=g) for shape in ((N, nh, d), (N, nkv, cap, d), (N, nkv, cap, d)))
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[0, :3] = False
    got = _call_attention(fn, q, k.transpose(-1, -2).contiguous(), v, valid, S, d**-0.5)
    want, _ = grouped_query_attention(None, q[:, :, None], k[:, :, :S], v[:, :, :S], valid[:, None, None, :S])
    if got is None or not torch.allclose(got, want.view(N, nh, d), atol=1e-5, rtol=1e-4):
        return "the decode-attention kernel disagreed with the torch path on its self-check"
    return None


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as the HF Llama forward applies it: x cos + rotate_half(x) sin, rotate_half([a, b]) = [-b, a]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def _check_rope_attend(fn) -> str | None:
    """None when rope_attend writes the cache and attends as RoPE + grpolab.model.attention do, else why not."""
    from grpolab.model.attention import grouped_query_attention

    g = torch.Generator().manual_seed(1)
    N, nh, nkv, d, cap, t = 3, 6, 2, 16, 12, 8
    qkv = torch.randn((N, (nh + 2 * nkv) * d), generator=g)
    cos, sin = torch.randn((N, d), generator=g), torch.randn((N, d), generator=g)
    k, v = torch.randn((N, nkv, cap, d), generator=g), torch.randn((N, nkv, cap, d), generator=g)
    k0, v0 = k.clone(), v.clone()
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[0, :3] = False
    kt = k.transpose(-1, -2).contiguous()  # the keys' cache is (N, nkv, d, cap)
    got = _call_rope_attend(fn, qkv, cos, sin, kt, v, valid, t, nh, d**-0.5)
    k = kt.transpose(-1, -2)
    heads = qkv.view(N, nh + 2 * nkv, d)
    qk = rope_reference(heads[:, : nh + nkv], cos[:, None], sin[:, None])
    k0[:, :, t], v0[:, :, t] = qk[:, nh:], heads[:, nh + nkv :]
    S = t + 1
    want, _ = grouped_query_attention(None, qk[:, :nh, None], k0[:, :, :S], v0[:, :, :S], valid[:, None, None, :S])
    close = got is not None and torch.allclose(got, want.reshape(N, nh * d), atol=1e-5, rtol=1e-4)
    if not (close and torch.allclose(k, k0, atol=1e-5, rtol=1e-5) and torch.equal(v, v0)):
        return "the rope-attend kernel disagreed with the torch path on its self-check"
    return None


def _check_sample(fn) -> str | None:
    """None when the sampler's log-probs are log_softmax(z / T)'s, its draws follow the CDF of the same
    uniform numbers and greedy is the argmax, else why not."""
    g = torch.Generator().manual_seed(2)
    z = torch.randn((4, 1000), generator=g) * 3
    T = 0.7
    logp = torch.log_softmax(z / T, -1)
    u = torch.rand((4, 1), generator=torch.Generator().manual_seed(3))
    want = torch.searchsorted(logp.exp().double().cumsum(-1), u.double(), right=True).squeeze(-1)
    tok, lp = _call_sample(fn, z, T, False, torch.Generator().manual_seed(3))
    best, lp_best = _call_sample(fn, z, T, True, None)
    ok = (
        torch.equal(tok, want)
        and torch.allclose(lp, logp.gather(-1, tok[:, None]).squeeze(-1), atol=1e-5)
        and torch.equal(best, z.argmax(-1))
        and torch.allclose(lp_best, logp.max(-1).values, atol=1e-5)
    )
    return None if ok else "the sampling kernel disagreed with the torch path on its self-check"


def _check_rms_norm(fn) -> str | None:
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn((5, 48), generator=g) * 3, torch.randn(48, generator=g)
    got = _call_rms_norm(fn, x[:, :40], w[:40], 1e-6)
    ok = got is not None and torch.allclose(
        got, torch.nn.functional.rms_norm(x[:, :40], (40,), w[:40], 1e-6), atol=1e-5
    )
    return None if ok else "the RMSNorm kernel disagreed with torch's on its self-check"


def _check_silu_mul(fn) -> str | None:
    gu = torch.randn((4, 2 * 40), generator=torch.Generator().manual_seed(5)) * 8
    got = _call_silu_mul(fn, gu[:, :60])
    ok = got is not None and torch.allclose(
        got, torch.nn.functional.silu(gu[:, :30]) * gu[:, 30:60], atol=1e-5, rtol=1e-5
    )
    return None if ok else "the silu-and-multiply kernel disagreed with torch's on its self-check"


CHECKS = {
    "grpolab_decode_attention": _check_attention,
    "grpolab_rope_attend": _check_rope_attend,
    "grpolab_sample": _check_sample,
    "grpolab_rms_norm": _check_rms_norm,
    "grpolab_silu_mul": _check_silu_mul,
    "grpolab_panel_linear": _check_panel_linear,
}


CHECKED_TOGETHER = {"grpolab_panel_linear": ("grpolab_panel_width", "grpolab_pack_panels", "grpolab_panel_linear")}


def _call_decode_layer(fn, x, ln1, ln2, eps: float, qkv, qkv_bias, o, o_bias, gate_up, down, cos, sin, k, v, valid,
                       t: int, nh: int, scale: float) -> bool:  # fmt: skip
    """One decode layer on x (N, H) in place (decode_layer.c), the products' weights as Panels; False
    (nothing written) for inputs it does not take. Raises MemoryError when a product could not allocate
    (x may then be half updated)."""
    N, H = x.shape
    nkv, d, cap = k.shape[1], k.shape[2], k.shape[3]
    I = down.in_features
    shapes_ok = (
        qkv.in_features == H
        and qkv.out_features == (nh + 2 * nkv) * d
        and (o.in_features, o.out_features) == (nh * d, H)
        and (gate_up.in_features, gate_up.out_features) == (H, 2 * I)
        and down.out_features == H
        and k.shape[0] == N
        and v.shape == (N, nkv, cap, d)
        and cos.shape == (N, d)
        and sin.shape == (N, d)
        and ln1.shape == ln2.shape == (H,)
        and all(b is None or b.shape == (n,) for b, n in ((qkv_bias, qkv.out_features), (o_bias, H)))
    )
    tensors = [x, ln1, ln2, cos, sin, k, v, *(b for b in (qkv_bias, o_bias) if b is not None)]
    if not (
        shapes_ok
        and _fp32_rows(*tensors)
        and all(t_.is_contiguous() for t_ in tensors)
        and valid.dtype == torch.bool
        and valid.stride(-1) == 1
    ):
        return False
    h, att, act = torch.empty((N, H)), torch.empty((N, nh * d)), torch.empty((N, I))
    qkv_out, gu = torch.empty((N, qkv.out_features)), torch.empty((N, 2 * I))
    ptr = lambda b: None if b is None else b.data_ptr()  # noqa: E731
    rc = fn(
        x.data_ptr(), N, H, ln1.data_ptr(), ln2.data_ptr(), eps, qkv.data.data_ptr(), ptr(qkv_bias), o.data.data_ptr(),
        ptr(o_bias), gate_up.data.data_ptr(), down.data.data_ptr(), I, cos.data_ptr(), sin.data_ptr(), k.data_ptr(),
        v.data_ptr(), valid.data_ptr(), valid.stride(0), nh, nkv, d, t, cap, scale, h.data_ptr(), qkv_out.data_ptr(),
        att.data_ptr(), gu.data_ptr(), act.data_ptr(),
    )  # fmt: skip
    if rc == 2:
        raise MemoryError("the decode layer's matrix product could not allocate its row buffer")
    return rc == 0


def _check_decode_layer(width, pack, fn, rms, silu, linear, rope_attend) -> str | None:
    """None when one fused decode layer gives the same x and cache as the kernels it composes, called one
    at a time (each checked against torch on its own), else why not."""
    g = torch.Generator().manual_seed(7)
    N, H, nh, nkv, d, I, cap, t = 3, 32, 4, 2, 8, 48, 10, 6
    fns = {"grpolab_panel_width": width, "grpolab_pack_panels": pack, "grpolab_panel_linear": linear}
    W = {n: Panels(fns, torch.randn(shape, generator=g) * 0.3) for n, shape in
         (("qkv", ((nh + 2 * nkv) * d, H)), ("o", (H, nh * d)), ("gu", (2 * I, H)), ("down", (H, I)))}  # fmt: skip
    ln1, ln2, bq, bo = (torch.randn(n, generator=g) for n in (H, H, (nh + 2 * nkv) * d, H))
    x = torch.randn((N, H), generator=g)
    cos, sin = torch.randn((N, d), generator=g), torch.randn((N, d), generator=g)
    k, v = torch.randn((N, nkv, d, cap), generator=g), torch.randn((N, nkv, cap, d), generator=g)
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[1, :2] = False
    k1, v1, x1 = k.clone(), v.clone(), x.clone()
    h = _call_rms_norm(rms, x1, ln1, 1e-5)
    a = _call_rope_attend(rope_attend, W["qkv"].apply(h, bq), cos, sin, k1, v1, valid, t, nh, 0.3)
    x1 = W["o"].apply(a, bo, x1)
    x1 = W["down"].apply(_call_silu_mul(silu, W["gu"].apply(_call_rms_norm(rms, x1, ln2, 1e-5))), None, x1)
    done = _call_decode_layer(
        fn, x, ln1, ln2, 1e-5, W["qkv"], bq, W["o"], bo, W["gu"], W["down"], cos, sin, k, v, valid, t, nh, 0.3
    )
    same = done and torch.equal(x, x1) and torch.equal(k, k1) and torch.equal(v, v1)
    return None if same else "the fused decode layer disagreed with its kernels called one at a time"


CHECKS["grpolab_decode_layer"] = _check_decode_layer
CHECKED_TOGETHER["grpolab_decode_layer"] = (
    "grpolab_panel_width",
    "grpolab_pack_panels",
    "grpolab_decode_layer",
    "grpolab_rms_norm",
    "grpolab_silu_mul",
    "grpolab_panel_linear",
    "grpolab_rope_attend",
)
