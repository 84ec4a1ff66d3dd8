"""Hand-written CPU kernels, compiled on first use with the machine's C compiler, loaded with ctypes.

One so far: `decode_attention`, the attention of one decode step for every row and head
(decode_attention.c). In the lean decode step (grpolab.engine.native.decoder) torch's batched products for it
are many tiny ones (for SmolLM2, 48 (3 x 64) x (64 x S) products per layer), which read the cached keys
and values far below the memory's speed; the kernel walks each (row, kv head) pair once and comes close
to the cost of merely reading the cache (docs/performance.md, "The decode-attention kernel").

The source is compiled once per machine into grpolab's cache (`$GRPOLAB_CACHE/kernels`, by default
`~/.cache/grpolab/kernels`), named by a hash of the source,
the flags, the compiler's version and the CPU's flags (-march=native code never runs on another CPU),
written to a temporary file and renamed into place. Before first use it is checked against the torch
path on random inputs. Without a C compiler, on a platform other than Linux, when the build or the check
fails, or with GRPOLAB_NO_C_KERNELS=1, `decode_attention()` returns None with the reason in
`unavailable_reason()`, and the callers keep the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_attention.c")
# Not -ffast-math (nor -Ofast, -funsafe-math-optimizations): with those, GCC links crtfastmath.o into
# the library, whose constructor sets flush-to-zero and denormals-are-zero in MXCSR when the library is
# loaded, and every subnormal float of the process (numpy's, torch's) became zero from then on. The
# flags below are the parts of -ffast-math the kernel's loops gain from (vectorised reductions and
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


def cache_dir() -> Path:
    """Where built kernels live: the kernels folder of grpolab's cache ($GRPOLAB_CACHE or ~/.cache/grpolab)."""
    from grpolab.model.load import cache_dir as grpolab_cache

    return grpolab_cache() / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _build(cc: str) -> Path:
    """The compiled library's path, compiling it first when the cache has none for this source,
    compiler and CPU. Raises RuntimeError with the compiler's message when the build fails."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_flags()]).encode())
    target = cache_dir() / f"decode_attention-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: a concurrent build never leaves a half-written library in place
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load():
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
        return None, f"the decode-attention kernel did not build or load: {e}"
    fn = lib.grpolab_decode_attention
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, i32, ctypes.c_float]
    fn.restype = i32
    error = _self_check(fn)
    if error is not None:
        return None, error
    return fn, None


def _call(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, S: int, scale: float):
    if not (
        q.dtype == k.dtype == v.dtype == torch.float32
        and valid.dtype == torch.bool
        and valid.stride(-1) == 1
        and q.is_contiguous()
        and k.is_contiguous()
        and v.is_contiguous()
        and q.device.type == "cpu"
    ):
        return None  # the C side reads raw fp32 rows and one byte per slot
    N, nh, d = q.shape
    out = torch.empty_like(q)
    rc = fn(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        valid.data_ptr(),
        out.data_ptr(),
        N,
        nh,
        k.shape[1],
        d,
        S,
        k.shape[2],
        valid.stride(0),
        scale,
    )
    return out if rc == 0 else None


def _self_check(fn) -> str | None:
    """None when the kernel agrees with grpolab.model.attention on random inputs (padding included), else why not."""
    from grpolab.model.attention import grouped_query_attention

    g = torch.Generator().manual_seed(0)
    N, nh, nkv, d, cap, S = 3, 6, 2, 16, 12, 9
    q, k, v = (torch.randn(shape, generator=g) for shape in ((N, nh, d), (N, nkv, cap, d), (N, nkv, cap, d)))
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[0, :3] = False
    got = _call(fn, q, k, v, valid, S, d**-0.5)
    want, _ = grouped_query_attention(None, q[:, :, None], k[:, :, :S], v[:, :, :S], valid[:, None, None, :S])
    if got is None or not torch.allclose(got, want.view(N, nh, d), atol=1e-5, rtol=1e-4):
        return "the decode-attention kernel disagreed with the torch path on its self-check"
    return None


def decode_attention():
    """The kernel as f(q (N, nh, d), k, v (N, nkv, cap, d), valid (N, >= S) bool, S, scale) -> (N, nh, d)
    or None (shapes it does not take, or inputs not fp32, contiguous and on the CPU). None when it is unavailable (see
    unavailable_reason). Built and checked once per process."""
    if "fn" not in _state:
        _state["fn"], _state["reason"] = _load()
    fn = _state["fn"]
    if fn is None:
        return None
    return lambda q, k, v, valid, S, scale: _call(fn, q, k, v, valid, S, scale)


def unavailable_reason() -> str | None:
    """Why decode_attention() is None (None when it is available)."""
    decode_attention()
    return _state["reason"]


def reset() -> None:
    """Forget the loaded kernel (tests: to load it again under other conditions)."""
    _state.clear()


__all__ = ["DISABLE_ENV", "cache_dir", "decode_attention", "reset", "unavailable_reason"]
