"""The lean decode step for Llama-family models: the same network as the HF forward, fewer operations.

A profile of the HF forward's rollout on a small CPU found much of each token spent around the matrix
products: in `scaled_dot_product_attention`'s flash kernel for a single query, in growing the KV cache
by concatenation, and in some 25 small operations per layer (docs/performance.md, "The lean decode
step"). For the models whose
forward is exactly this (Llama, Qwen2, Mistral without a sliding window) the rollout instead runs

    x_0 = E[ids]                                                   (fp32 residual stream)
    h = RMSNorm(x_l) ;  [q k v] = h W_qkv^T (+ b_qkv)             (one product for q, k and v)
    q, k = RoPE(q, pos), RoPE(k, pos) ;  write k, v into a preallocated cache
    a = softmax(q K^T / sqrt(d) + mask) V                          (grouped-query heads, fp32 softmax)
    x_l' = x_l + a W_o^T
    [g u] = RMSNorm(x_l') W_gu^T ;  x_{l+1} = x_l' + (silu(g) * u) W_down^T   (one product for g and u)
    logits = RMSNorm(x_L)[last] W_head^T

with its weights gathered once per rollout into the compute dtype (bf16 when the rollout runs bf16,
which is what autocast computes the products in; a LoRA adapter merged in: W + s B A), so no weight is
cast per token. On a CPU, bf16 weights are also reordered once into oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the layout inductor's CPU backend uses; the same products
to the bit) and fp32 weights packed for grpolab.engine.native.kernels' panel product (within float
rounding; `FP32_LAYOUT`), faster for the few-row products of a decode step, whose weights come from
memory at every token (`Layout`); each residual add is
the product's own accumulation in fp32 (`residual`). Between the products, a decode step's RMSNorms,
RoPE, KV-cache writes, attention and silu(g) * u are grpolab.engine.native.kernels' C calls, one per
operation instead of torch's several (docs/performance.md, "The lean decode step").
RoPE's cos/sin come from the model's own rotary module (its scaling rules included).
Everything else falls back to the HF forward (`weights_of` returns None, with the reason).
tests/test_decoder.py checks the logits against the HF forward and greedy rollouts against the HF path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from grpolab.engine.native import kernels
from grpolab.model.attention import LLAMA_FAMILY, grouped_query_attention


def lean_decodes(decoder: str, model_type: str | None, dtype: torch.dtype | None, device_type: str) -> bool:
    """Whether a rollout of a `model_type` model in `dtype` (None: fp32) on a `device_type` device ("cpu",
    "cuda") runs the lean step, for the `decoder` setting: only for a LLAMA_FAMILY model type; then lean
    always; auto where it was measured faster than the HF forward: on a CPU, bf16 and fp32 (on a GPU it
    is not yet measured); hf never (docs/performance.md, "The lean decode step"). The native engine and
    grpolab plan both decide by it; `weights_of` may still fall back for what the model type does not
    show (unsupported_reason)."""
    if model_type not in LLAMA_FAMILY:
        return False
    return decoder == "lean" or (decoder == "auto" and device_type == "cpu")


def model_type_of(model) -> str | None:
    """The Hugging Face model_type of `model` (a peft model: its base's), None without a config."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(inner, "config", None), "model_type", None)


@dataclass
class LayerWeights:
    ln1: Tensor  # (H,) fp32
    qkv: Tensor  # ((nh + 2 nkv) d, H) compute dtype
    qkv_bias: Tensor | None
    o: Tensor  # (H, nh d)
    o_bias: Tensor | None
    ln2: Tensor
    gate_up: Tensor  # (2 I, H)
    down: Tensor  # (H, I)


@dataclass
class Weights:
    embed: Tensor  # (V, H) the model's own embedding (not copied)
    layers: list[LayerWeights]
    norm: Tensor
    head: Tensor  # (V, H) compute dtype
    head_bias: Tensor | None
    rotary: torch.nn.Module
    eps: float
    n_heads: int
    n_kv: int
    head_dim: int
    dtype: torch.dtype
    layout: Layout  # how the weights are held: apply them with `linear` below, never F.linear


FP32_LAYOUT = "panels"
"""How fp32 weights are applied on a CPU: "panels", packed for grpolab.engine.native.kernels' panel product,
which prefetches the weights while it multiplies (about 30% less time per decode step's products than
"onednn" where measured, docs/devlog.md; where the kernels are unavailable, "onednn"); "onednn",
reordered into oneDNN's blocked layout; "nk" as the model holds them, (out, in), by MKL's products
(F.linear, addmm)."""


@dataclass(frozen=True)
class Layout:
    """How the lean step holds its weights and multiplies by them: `pack` W (out, in) once per rollout,
    then `apply`(x, P, b) = x W^T + b and, for the fp32 residual stream, `accumulate`(x, a, P, b) =
    x + a W^T + b (the sum the product's own accumulation, no second pass over x)."""

    name: str
    pack: Callable[[Tensor], Any]
    apply: Callable[[Tensor, Any, Tensor | None], Tensor]
    accumulate: Callable[[Tensor, Tensor, Any, Tensor | None], Tensor]


def _addmm(x: Tensor, a: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    out = torch.addmm(x, a, W.t())
    return out if b is None else out.add_(b)


PLAIN = Layout("nk", lambda W: W, F.linear, _addmm)


def _onednn(rows: int) -> Layout:
    return Layout(
        "onednn",
        lambda W: torch.ops.mkldnn._reorder_linear_weight(W.contiguous(), rows),
        lambda x, W, b: torch.ops.mkldnn._linear_pointwise(x, W, b, "none", [], ""),
        lambda x, a, W, b: torch.ops.mkldnn._linear_pointwise.binary(a, x, W, b, "add"),
    )


def _panels(pack) -> Layout:
    def apply(x: Tensor, P, b: Tensor | None, add: Tensor | None = None) -> Tensor:
        out = P.apply(x.contiguous(), b, None if add is None else add.contiguous())
        if out is None:  # the lean step's rows are always fp32 on the CPU; anything else is a bug here
            raise RuntimeError(f"the panel product takes fp32 CPU rows, not {x.dtype} on {x.device}")
        return out

    return Layout("panels", pack, apply, lambda x, a, P, b: apply(a, P, b, x))


def _onednn_works(dtype: torch.dtype, rows: int) -> bool:
    """oneDNN's reordered product on one small case against F.linear: the same to the bit in bf16, within
    float rounding in fp32; False in a build without oneDNN's ops."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        W, x = torch.randn(8, 16, dtype=dtype), torch.randn(3, 16, dtype=dtype)
        got = torch.ops.mkldnn._linear_pointwise(
            x, torch.ops.mkldnn._reorder_linear_weight(W, rows), None, "none", [], ""
        )
    except (RuntimeError, AttributeError):  # a build without oneDNN's ops
        return False
    want = F.linear(x, W)
    return torch.equal(got, want) if dtype == torch.bfloat16 else torch.allclose(got, want, atol=1e-5)


def layout_for(dtype: torch.dtype, device: torch.device, rows: int) -> Layout:
    """The weights' layout for a rollout in `dtype` on `device`, laid out for products of `rows` rows: bf16
    on a CPU oneDNN's (where it works); fp32 on a CPU as FP32_LAYOUT says ("panels" falls back to
    "onednn" where the C kernels are unavailable); else the weights as they are."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return PLAIN
    wanted = "onednn" if dtype == torch.bfloat16 else FP32_LAYOUT
    if wanted == "panels":
        pack = kernels.panel_pack()
        if pack is not None:
            return _panels(pack)
        wanted = "onednn"
    return _onednn(rows) if wanted == "onednn" and _onednn_works(dtype, rows) else PLAIN


def linear(w: Weights, x: Tensor, W, b: Tensor | None = None) -> Tensor:
    """x W^T + b, with W as `weights_of` laid it out (w.layout)."""
    return w.layout.apply(x, W, b)


def residual(w: Weights, x: Tensor, a: Tensor, W, b: Tensor | None = None) -> Tensor:
    """x + a W^T + b for the fp32 residual stream x (N, H): in fp32 the sum is the product's own
    accumulation (addmm's beta = 1, oneDNN's fused add, the panel product's add), no second pass over x;
    in bf16 the product's bf16 result is added to x in fp32, as autocast's forward adds it."""
    if w.dtype != torch.float32:
        return x + linear(w, a, W, b)
    return w.layout.accumulate(x, a, W, b)


def unsupported_reason(model) -> str | None:
    """Why the lean step cannot run this model (None: it can)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(inner, "config", None)
    if model_type_of(model) not in LLAMA_FAMILY:
        return f"model type {model_type_of(model)!r} is not one of {', '.join(LLAMA_FAMILY)}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if (
        getattr(cfg, "use_sliding_window", False)
        or getattr(cfg, "sliding_window", None)
        and cfg.model_type == "mistral"
    ):
        return "a sliding attention window"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "a layer that is not full attention"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if not hasattr(getattr(inner, "model", None), "rotary_emb"):
        return "no rotary module"
    hooked = [n for n, m in inner.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    if hooked or torch.nn.modules.module._global_forward_hooks:
        return f"forward hooks on {hooked[0] if hooked else 'every module'} (they must see the HF forward)"
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - every supported torch has it
        DTensor = ()
    if any(isinstance(p, DTensor) for p in inner.parameters()):
        return "sharded (DTensor) weights"
    return None


def effective_linear(module) -> tuple[Tensor, Tensor | None]:
    """(W, b) the module applies: a plain nn.Linear's, or a peft LoRA layer's with its active adapters
    merged in, W + scale * B A (peft's own get_delta_weight; dropout is off in a rollout)."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module.weight, module.bias
    W = base.weight
    if not getattr(module, "disable_adapters", False) and not getattr(module, "merged", False):
        for name in module.active_adapters:
            if name in module.lora_A:
                W = W + module.get_delta_weight(name)
    return W, base.bias


def _stacked(mats: list[Tensor], dtype: torch.dtype) -> Tensor:
    """torch.cat(mats) in `dtype`, each cast straight into its rows (one pass over the weights, not a
    concatenated copy and then its cast)."""
    out = torch.empty((sum(m.shape[0] for m in mats), mats[0].shape[1]), dtype=dtype, device=mats[0].device)
    row = 0
    for m in mats:
        out[row : row + m.shape[0]].copy_(m)
        row += m.shape[0]
    return out


def _cat(parts: list[Tensor | None], dtype) -> Tensor | None:
    if all(p is None for p in parts):
        return None
    return torch.cat([p if p is not None else torch.zeros(0) for p in parts]).to(dtype)


@torch.no_grad()
def weights_of(model, dtype: torch.dtype, rows: int = 16) -> Weights | None:
    """The model's weights laid out for the lean step in `dtype` (None if unsupported_reason says so);
    `rows` is the batch size the products are laid out for (any other works too)."""
    if unsupported_reason(model) is not None:
        return None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg, body = inner.config, inner.model
    layout = layout_for(dtype, body.embed_tokens.weight.device, rows)
    pack = layout.pack
    layers = []
    for blk in body.layers:
        at, mlp = blk.self_attn, blk.mlp
        (wq, bq), (wk, bk), (wv, bv) = (effective_linear(m) for m in (at.q_proj, at.k_proj, at.v_proj))
        wo, bo = effective_linear(at.o_proj)
        (wg, bg), (wu, bu), (wd, bd) = (effective_linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        if bg is not None or bu is not None or bd is not None:
            return None  # an MLP bias (Llama's mlp_bias): rare, not worth a second path
        layers.append(
            LayerWeights(
                ln1=blk.input_layernorm.weight.float(),
                qkv=pack(_stacked([wq, wk, wv], dtype)),
                qkv_bias=_cat([bq, bk, bv], dtype) if bq is not None else None,
                o=pack(wo.to(dtype)),
                o_bias=None if bo is None else bo.to(dtype),
                ln2=blk.post_attention_layernorm.weight.float(),
                gate_up=pack(_stacked([wg, wu], dtype)),
                down=pack(wd.to(dtype)),
            )
        )
    wh, bh = effective_linear(inner.lm_head)
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    return Weights(
        embed=body.embed_tokens.weight,
        layers=layers,
        norm=body.norm.weight.float(),
        head=pack(wh.to(dtype)),
        head_bias=None if bh is None else bh.to(dtype),
        rotary=body.rotary_emb,
        eps=cfg.rms_norm_eps,
        n_heads=n_heads,
        n_kv=getattr(cfg, "num_key_value_heads", None) or n_heads,
        head_dim=head_dim,
        dtype=dtype,
        layout=layout,
    )


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm(x) = w * x / sqrt(mean(x^2) + eps), in fp32 (as the HF Llama norm computes it): for rows
    (N, H) on a CPU by grpolab.engine.native.kernels' one call, else by torch's own kernel."""
    fused = kernels.rms_norm() if x.dim() == 2 else None
    out = fused(x, weight, eps) if fused is not None else None
    return out if out is not None else F.rms_norm(x.float(), (x.shape[-1],), weight, eps)


def silu_mul(gu: Tensor) -> Tensor:
    """silu(g) * u for the gate and up projections side by side, gu = [g u] (N, 2 I): one C call on fp32
    CPU rows, else torch's operations."""
    fused = kernels.silu_mul()
    out = fused(gu) if fused is not None else None
    if out is not None:
        return out
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g).mul_(u)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE: x cos + rotate_half(x) sin, rotate_half([a, b]) = [-b, a]; x (N, h, L, d), cos/sin (N, 1, L, d)."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class KVCache:
    """Keys and values of every layer, preallocated to the longest sequence S, fp32 (for these small
    attention products fp32 was faster on the CPU than bf16, and it skips two casts; docs/performance.md,
    "The lean decode step"): values (N, nkv, S, d), keys transposed, (N, nkv, d, S), so that a decode
    step's scores over consecutive slots are vector operations (`keys` gives the (N, nkv, S, d) view)."""

    def __init__(self, w: Weights, rows: int, capacity: int, device):
        self.k = [torch.empty((rows, w.n_kv, w.head_dim, capacity), device=device) for _ in w.layers]
        self.v = [torch.empty((rows, w.n_kv, capacity, w.head_dim), device=device) for _ in w.layers]
        self.length = 0
        # a decode step's attention by grpolab.engine.native.kernels' C kernels on a CPU (None: torch's
        # operations): rope_attend from the q, k, v projections on, else decode_attention after torch's RoPE
        cpu = torch.device(device).type == "cpu"
        self.rope_attend = kernels.rope_attend() if cpu else None
        self.attend = kernels.decode_attention() if cpu and self.rope_attend is None else None

    def keys(self, i: int, end: int) -> Tensor:
        """Layer i's keys of slots [0, end) as (N, nkv, end, d) (a view of the transposed cache)."""
        return self.k[i][..., :end].transpose(-1, -2)

    def rows(self, idx: Tensor | None = None, repeat: int = 1) -> None:
        """Keep rows `idx` (in that order), or repeat each row `repeat` times."""
        pick = (lambda t: t[idx]) if idx is not None else (lambda t: t.repeat_interleave(repeat, 0))
        self.k, self.v = [pick(t) for t in self.k], [pick(t) for t in self.v]


def attention(w: Weights, cache: KVCache, i: int, qkv: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor) -> Tensor:
    """Layer i's attention output (N, L, nh d) from its projections qkv (N, L, (nh + 2 nkv) d), having
    written the new keys (RoPE'd) and values into cache slots [cache.length, cache.length + L); cos, sin
    (N, L, d) fp32. One token per row: the C kernel; else torch's RoPE and grpolab.model.attention's
    products (the attention of the training passes on a CPU)."""
    N, L, _ = qkv.shape
    nh, nkv, d = w.n_heads, w.n_kv, w.head_dim
    start, end = cache.length, cache.length + L
    if L == 1 and cache.rope_attend is not None and key_mask.stride(-1) == 1:
        a = cache.rope_attend(
            qkv[:, 0].float(), cos[:, 0], sin[:, 0], cache.k[i], cache.v[i], key_mask[:, 0, 0], start, nh, d**-0.5
        )
        if a is not None:
            return a.view(N, 1, nh * d)
    heads = qkv.view(N, L, nh + 2 * nkv, d).transpose(1, 2)
    qk = rope(heads[:, : nh + nkv].float(), cos[:, None], sin[:, None])  # q and k at once, (N, nh + nkv, L, d)
    cache.keys(i, end)[:, :, start:end] = qk[:, nh:]
    cache.v[i][:, :, start:end] = heads[:, nh + nkv :]
    a = None
    if L == 1 and cache.attend is not None and key_mask.stride(-1) == 1:
        a = cache.attend(qk[:, :nh, 0].contiguous(), cache.k[i], cache.v[i], key_mask[:, 0, 0], end, d**-0.5)
    if a is None:
        a, _ = grouped_query_attention(None, qk[:, :nh], cache.keys(i, end), cache.v[i][:, :, :end], key_mask)
    return a.reshape(N, L, nh * d)


def forward(w: Weights, cache: KVCache, ids: Tensor, pos: Tensor, key_mask: Tensor) -> Tensor:
    """Logits (N, V) at the last of the L new tokens `ids` (N, L) at positions `pos` (N, L).

    The new keys/values go into cache slots [cache.length, cache.length + L); key_mask (N, 1, L, S')
    with S' = cache.length + L, bool, is True where a query may look (not padding, not the future).
    The residual stream x is (N L, H) fp32; each residual add is the product's own accumulation in fp32
    (`residual`)."""
    N, L = ids.shape
    x = F.embedding(ids, w.embed).float()  # (N, L, H)
    cos, sin = w.rotary(x, pos)
    cos, sin = cos.float(), sin.float()  # (N, L, d); RoPE in fp32, as under autocast
    x = x.view(N * L, -1)
    fused = kernels.decode_layer() if L == 1 and w.layout.name == "panels" and cache.rope_attend is not None else None
    for i, lw in enumerate(w.layers):
        if fused is not None and fused(
            x, lw.ln1, lw.ln2, w.eps, lw.qkv, lw.qkv_bias, lw.o, lw.o_bias, lw.gate_up, lw.down, cos[:, 0], sin[:, 0],
            cache.k[i], cache.v[i], key_mask[:, 0, 0], cache.length, w.n_heads, w.head_dim**-0.5,
        ):  # fmt: skip
            continue  # the layer below in one C call (kernels.decode_layer), the same to the bit
        qkv = linear(w, rms_norm(x, lw.ln1, w.eps).to(w.dtype), lw.qkv, lw.qkv_bias)  # (N L, (nh + 2 nkv) d)
        a = attention(w, cache, i, qkv.view(N, L, -1), cos, sin, key_mask)
        x = residual(w, x, a.view(N * L, -1).to(w.dtype), lw.o, lw.o_bias)
        gu = linear(w, rms_norm(x, lw.ln2, w.eps).to(w.dtype), lw.gate_up)  # (N L, 2 I)
        x = residual(w, x, silu_mul(gu), lw.down)
    cache.length += L
    h = rms_norm(x.view(N, L, -1)[:, -1], w.norm, w.eps).to(w.dtype)
    return linear(w, h, w.head, w.head_bias)


class LeanStepper:
    """The rollout's model steps (prefill, repeat, keep rows, decode one token) on the lean forward."""

    def __init__(self, w: Weights, max_new_tokens: int):
        self.w, self.max_new = w, max_new_tokens

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        B, P = ids.shape
        self.cache = KVCache(self.w, B, P + self.max_new, ids.device)
        self.valid = torch.zeros((B, P + self.max_new), dtype=torch.bool, device=ids.device)
        self.valid[:, :P] = mask.bool()
        causal = torch.ones((P, P), dtype=torch.bool, device=ids.device).tril()
        allowed = (causal[None] & self.valid[:, None, :P]) | torch.eye(P, dtype=torch.bool, device=ids.device)
        return forward(self.w, self.cache, ids, pos, allowed[:, None])  # a pad query sees itself

    def repeat(self, G: int) -> None:
        self.cache.rows(repeat=G)
        self.valid = self.valid.repeat_interleave(G, 0)

    def keep(self, idx: Tensor) -> None:
        self.cache.rows(idx)
        self.valid = self.valid[idx]

    def step(self, tok: Tensor, pos: Tensor, valid: Tensor | None = None) -> Tensor:
        """Logits after one new token per row (valid (n,) False: a hole no later token attends to)."""
        t = self.cache.length
        self.valid[:, t] = True if valid is None else valid
        return forward(self.w, self.cache, tok[:, None], pos[:, None], self.valid[:, None, None, : t + 1])

    def extend(self, ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        """Append L tokens per row (environment tokens between turns), left-padded: ids/mask/pos (n, L).
        A real token sees the valid slots before it and itself; a pad slot sees only itself."""
        t, L = self.cache.length, ids.shape[1]
        self.valid[:, t : t + L] = mask.bool()
        keys = torch.arange(t + L, device=ids.device)
        queries = t + torch.arange(L, device=ids.device)
        causal = keys[None, :] <= queries[:, None]  # (L, t+L)
        allowed = (causal[None] & self.valid[:, None, : t + L]) | (keys[None, :] == queries[:, None])[None]
        return forward(self.w, self.cache, ids, pos, allowed[:, None])
