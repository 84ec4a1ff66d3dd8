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
- `decode_layer` (decode_layer.c): with the weights as panels, a whole decode layer (the two RMSNorms,
  the four products, rope_attend, silu(g) * u) in one call, the same kernels in the same order, so the
  same results to the bit without the Python between them.
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

from grpolab.engine.native.kernels.calls import (
    CHECKED_TOGETHER,
    CHECKS,
    Panels,
    _call_attention,
    _call_decode_layer,
    _call_rms_norm,
    _call_rope_attend,
    _call_sample,
    _call_silu_mul,
    rope_reference,
)

SOURCES = tuple(
    Path(__file__).with_name(f) for f in ("decode_attention.c", "decode_step.c", "decode_linear.c", "decode_layer.c")
)
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
    "grpolab_decode_layer": [_P, _I32, _I32, _P, _P, _F32]
    + [_P] * 6
    + [_I32, _P, _P, _P, _P, _P]
    + [_I32] * 6
    + [_F32]
    + [_P] * 5,
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
    for name, check in CHECKS.items():  # in order: a kernel that composes others comes after them
        parts = CHECKED_TOGETHER.get(name, (name,))
        missing = [n for n in parts if n not in fns]
        error = f"it needs {', '.join(missing)}, which failed" if missing else check(*(fns[n] for n in parts))
        if error is not None:
            errors[name] = error
            del fns[name]
    return fns, errors


def _fn(name: str):
    if "fns" not in _state:
        _state["fns"], _state["reason"] = _load()
    fns = _state["fns"]
    return None if fns is None else fns.get(name)


def panel_pack():
    """W (out, in) -> Panels, the fp32 weights as grpolab_panel_linear reads them (their `apply(x, bias,
    add)` is add + x W^T + bias); None when the kernel is unavailable (see unavailable_reason)."""
    if _fn("grpolab_panel_linear") is None:
        return None
    fns = _state["fns"]
    return lambda W: Panels(fns, W)


def decode_layer():
    """The kernel as f(x (N, H), ln1, ln2, eps, qkv, qkv_bias, o, o_bias, gate_up, down, cos, sin, k, v, valid, t,
    nh, scale) -> True having run one decode layer on x in place (decode_layer.c: the RMSNorms, the products
    on Panels, rope_attend writing slot t of k (N, nkv, d, cap) and v (N, nkv, cap, d), silu(g) * u), or
    False for inputs it does not take (nothing written). None when it is unavailable (see unavailable_reason)."""
    fn = _fn("grpolab_decode_layer")
    return None if fn is None else lambda *args: _call_decode_layer(fn, *args)


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
    "decode_layer",
    "panel_pack",
    "reset",
    "rms_norm",
    "rope_reference",
    "rope_attend",
    "sample",
    "silu_mul",
    "unavailable_reason",
]
