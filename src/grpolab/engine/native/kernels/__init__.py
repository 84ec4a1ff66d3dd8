"""Hand-written CPU kernels, compiled on first use with the machine's C compiler, loaded with ctypes.

The lean decode step (grpolab.engine.native.decoder) spends its time in the matrix products and, between
them, in many small torch operations per layer that each read a few kilobytes and pay an operation's
dispatch and a wake-up of every thread. These kernels do that work in one call each, in fp32:

- `decode_attention` (decode_attention.c): one decode step's attention for every row and head, walking
  each (row, kv head) pair once (torch's batched products for it are many tiny ones, for SmolLM2 48
  (3 x 64) x (64 x S) per layer; docs/performance.md, "The decode-attention kernel").
- `rope_attend` (decode_step.c): from a layer's q, k, v projections of the new token to its attention
  output: RoPE on q and k, k and v written into the KV cache, the attention; one call instead of some
  twelve operations per layer.
- `rms_norm`, `silu_mul` (decode_step.c): the layer's two norms and its MLP's silu(g) * u, one call each
  instead of torch's six and three operations.
- `panel_pack` (decode_linear.c): the fp32 matrix products of a decode step, on weights packed once per
  rollout into panels the product walks front to back while prefetching the next ones, so that reading
  the weights from memory overlaps the multiply-adds (oneDNN's and MKL's products on a few rows took
  about the sum of the two; docs/performance.md, "The lean decode step").
- `sample` (decode_step.c): a token per row from softmax(z / T) by inverse CDF and its log-prob, in one
  pass over the logits (torch's path makes six over the 49k-token vocabulary: divide, log-softmax, exp,
  cumsum, searchsorted, gather).

The attention loop of the first two lives once, in attend.h, which both sources include (each inlines it
with its own exponential: glibc's expf in decode_attention, the vectorisable exp_neg in rope_attend).
The sources are compiled once per machine into one library in grpolab's cache (`$GRPOLAB_CACHE/kernels`,
by default `~/.cache/grpolab/kernels`), named by a hash of the sources, the flags, the compiler's version,
the CPU's flags and the instruction sets the compiler's -march=native chose (library_name: code built for
one CPU is never loaded on another that lacks its instructions; where the compiler cannot say what
native means, the library is built without -march=native), written to a temporary file and renamed into
place. Before first use each kernel is checked against the torch path on random inputs.
Without a C compiler, on a platform other than Linux, when the build or a check fails, or with
GRPOLAB_NO_C_KERNELS=1, a kernel's getter returns None with the reason in `unavailable_reason()`, and the
callers keep the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name(f) for f in ("decode_attention.c", "decode_step.c", "decode_linear.c"))
HEADERS = (Path(__file__).with_name("attend.h"),)  # the attention loop both sources include
# Not -ffast-math (nor -Ofast, -funsafe-math-optimizations): with those, GCC links crtfastmath.o into
# the library, whose constructor sets flush-to-zero and denormals-are-zero in MXCSR when the library is
# loaded, and every subnormal float of the process (numpy's, torch's) became zero from then on. The
# flags below are the parts of -ffast-math the kernels' loops gain from (vectorised reductions and
# expf without errno), none of which changes the floating-point environment.
FLAGS = (
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-freciprocal-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
)
DISABLE_ENV = "GRPOLAB_NO_C_KERNELS"
_state: dict = {}
_P, _I32, _F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # C function -> its argument types (every one returns int: 0 done, else not taken)
    "grpolab_decode_attention": [_P] * 5 + [_I32] * 7 + [_F32],
    "grpolab_rope_attend": [_P, _I32, _P, _P, _P, _P, _P, _I32, _P] + [_I32] * 6 + [_F32],
    "grpolab_sample": [_P, _I32, _I32, _I32, _F32, _P, _I32, _P, _P],
    "grpolab_rms_norm": [_P, _I32, _I32, _I32, _P, _F32, _P],
    "grpolab_silu_mul": [_P, _I32, _I32, _I32, _P],
    "grpolab_panel_width": [],
    "grpolab_pack_panels": [_P, _I32, _I32, _P],
    "grpolab_panel_linear": [_P, _I32, _I32, _P, _I32, _P, _P, _P],
}


def cache_dir() -> Path:
    """Where built kernels live: the kernels folder of grpolab's cache ($GRPOLAB_CACHE or ~/.cache/grpolab)."""
    from grpolab.model.load import cache_dir as grpolab_cache

    return grpolab_cache() / "kernels"


def _cpu_flags() -> str:
    """The CPU's instruction-set flags as the kernel lists them ("flags" on x86, "Features" on ARM), or ''."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _native_isa(cc: str) -> str:
    """What -march=native means to `cc` on this CPU: the driver's command lines under -###, where gcc
    spells out the -march and every -m<extension> it turned on (clang its -target-cpu and
    -target-feature), or '' when the compiler cannot say."""
    try:
        done = subprocess.run(
            [cc, "-march=native", "-###", "-E", "-x", "c", os.devnull],
            cwd=Path(__file__).parent,  # clang's lines name the working directory: one fixed folder
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stderr if done.returncode == 0 else ""


CAPPED_ISA = {"avx2": ("-mno-avx512f",), "default": ("-mno-avx",)}
"""Flags that keep -march=native's code within ATEN_CPU_CAPABILITY (torch's own cap on its kernels), so
that a process told to run as an AVX2 CPU runs these kernels as one too (docs/performance.md, "The CPUs
people have")."""


def build_flags(native_isa: str, capability: str | None = None) -> tuple[str, ...]:
    """FLAGS, less -march=native where the compiler could not say what it means here (native_isa ''):
    such a library is built for the compiler's default target, which any CPU of this architecture runs.
    With -march=native on x86, ATEN_CPU_CAPABILITY (`capability`, default the environment's) "avx2" or
    "default" adds CAPPED_ISA's flags."""
    if not native_isa:
        return tuple(f for f in FLAGS if f != "-march=native")
    cap = (os.environ.get("ATEN_CPU_CAPABILITY", "") if capability is None else capability).lower()
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686")
    return FLAGS + (CAPPED_ISA.get(cap, ()) if x86 else ())


def library_name(texts: list[str], flags: tuple[str, ...], version: str, cpu_flags: str, native_isa: str) -> str:
    """The cached library's file name: a hash of everything its machine code depends on, sources, flags,
    compiler version and the instructions -march=native chose (the CPU's flags and the compiler's
    reading of them), so that a library built on one CPU is never loaded on a CPU lacking any of them
    (a shared home directory, a copied cache, a container moved to another host)."""
    key = hashlib.sha256("\0".join([*texts, " ".join(flags), version, cpu_flags, native_isa]).encode())
    return f"grpolab_kernels-{key.hexdigest()[:16]}.so"


def _build(cc: str) -> Path:
    """The compiled library's path, compiling it first when the cache has none for these sources,
    compiler and CPU (library_name). Raises RuntimeError with the compiler's message when the build fails."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    isa = _native_isa(cc)
    flags = build_flags(isa)
    texts = [s.read_text() for s in (*SOURCES, *HEADERS)]
    target = cache_dir() / library_name(texts, flags, version, _cpu_flags(), isa)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: a concurrent build never leaves a half-written library in place
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load():
    """({C name: function} of the kernels that passed their checks, {name: why not} of the others), or
    (None, why) when none could be loaded."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None, f"{DISABLE_ENV} is set"
    if not sys.platform.startswith("linux"):
        return None, f"C kernels are built on Linux only (this is {sys.platform})"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc):
        return None, "no C compiler (cc or gcc, or $CC) on PATH"
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return None, f"the decode kernels did not build or load: {e}"
    fns, errors = {}, {}
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, _I32
        fns[name] = fn
    for name, check in CHECKS.items():
        error = check(*(fns[n] for n in CHECKED_TOGETHER.get(name, (name,))))
        if error is not None:
            errors[name] = error
            del fns[name]
    return fns, errors


def _fn(name: str):
    if "fns" not in _state:
        _state["fns"], _state["reason"] = _load()
    fns = _state["fns"]
    return None if fns is None else fns.get(name)


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


def panel_pack():
    """W (out, in) -> Panels, the fp32 weights as grpolab_panel_linear reads them (their `apply(x, bias,
    add)` is add + x W^T + bias); None when the kernel is unavailable (see unavailable_reason)."""
    if _fn("grpolab_panel_linear") is None:
        return None
    fns = _state["fns"]
    return lambda W: Panels(fns, W)


def decode_attention():
    """The kernel as f(q (N, nh, d), k (N, nkv, d, cap: the keys transposed), v (N, nkv, cap, d), valid
    (N, >= S) bool, S, scale) -> (N, nh, d)
    or None (shapes it does not take, or inputs not fp32, contiguous and on the CPU). None when it is unavailable (see
    unavailable_reason). Built and checked once per process."""
    fn = _fn("grpolab_decode_attention")
    return None if fn is None else lambda q, k, v, valid, S, scale: _call_attention(fn, q, k, v, valid, S, scale)


def rope_attend():
    """The kernel as f(qkv (N, (nh + 2 nkv) d), cos, sin (N, d), k (N, nkv, d, cap: the keys transposed), v
    (N, nkv, cap, d), valid (N, > t) bool, t,
    nh, scale) -> attention output (N, nh d), having written RoPE(k) and v into slot t of k and v; or None
    (inputs it does not take: nothing written). None when it is unavailable (see unavailable_reason)."""
    fn = _fn("grpolab_rope_attend")
    if fn is None:
        return None
    return lambda qkv, cos, sin, k, v, valid, t, nh, scale: _call_rope_attend(
        fn, qkv, cos, sin, k, v, valid, t, nh, scale
    )


def sample():
    """The kernel as f(logits (N, V) fp32, temperature, greedy, generator) -> (token (N,), log-prob (N,)) of
    softmax(z / T), drawing one torch.rand((N, 1), generator) as the torch path does (greedy: none); or
    None (inputs it does not take). None when it is unavailable (see unavailable_reason)."""
    fn = _fn("grpolab_sample")
    return None if fn is None else lambda logits, T, greedy, gen: _call_sample(fn, logits, T, greedy, gen)


def rms_norm():
    """The kernel as f(x (N, H) fp32, weight (H,), eps) -> RMSNorm(x) (N, H) (grpolab_rms_norm), or None
    (inputs it does not take). None when it is unavailable (see unavailable_reason)."""
    fn = _fn("grpolab_rms_norm")
    return None if fn is None else lambda x, weight, eps: _call_rms_norm(fn, x, weight, eps)


def silu_mul():
    """The kernel as f(gu (N, 2 I) fp32) -> silu(gu[:, :I]) * gu[:, I:] (N, I), or None (inputs it does not
    take). None when it is unavailable (see unavailable_reason)."""
    fn = _fn("grpolab_silu_mul")
    return None if fn is None else lambda gu: _call_silu_mul(fn, gu)


def unavailable_reason(name: str = "grpolab_decode_attention") -> str | None:
    """Why the kernel `name` (a C function, SIGNATURES) is unavailable (None when it is available)."""
    _fn(name)
    if _state["fns"] is None:
        return _state["reason"]
    return _state["reason"].get(name)


def reset() -> None:
    """Forget the loaded kernels (tests: to load them again under other conditions)."""
    _state.clear()


__all__ = [
    "DISABLE_ENV",
    "cache_dir",
    "decode_attention",
    "panel_pack",
    "reset",
    "rms_norm",
    "rope_attend",
    "sample",
    "silu_mul",
    "unavailable_reason",
]
