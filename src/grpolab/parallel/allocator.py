"""Keep freed memory inside the process on a CPU, so that a new tensor does not fault its pages in anew.

glibc's malloc serves every block of 128 KB or more (its mmap threshold, which rises to at most 32 MB)
with a fresh mmap and returns it to the kernel on free; it also trims the top of its heap. A training
step frees and re-allocates the same large activations over and over, and on a small CPU the page
faults of a fresh block can cost more than the arithmetic on it (the LM head's weight cast to bf16
into a new tensor, a 16 x 127 x 576 multiply into a new tensor after it: docs/performance.md, "The
update on a CPU").
`keep_freed_memory` turns both off through mallopt, so freed blocks are reused:

    mallopt(M_MMAP_MAX, 0)             every block from the heap, never a private mmap
    mallopt(M_TRIM_THRESHOLD, 2^31-1)  never give the heap's top back to the kernel
    mallopt(M_TOP_PAD, 64 MB)          grow the heap in large steps

The process's resident memory then stays at its high-water mark instead of falling between phases,
and the peak can be higher (`python benchmarks/ab.py phases --cpu-malloc system keep` measures both;
docs/results.md, "Freed memory kept"). Only glibc on Linux
has mallopt; elsewhere this does nothing. The config key `cpu_malloc=system` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Literal

CpuMalloc = Literal["keep", "system"]
"""The `cpu_malloc` setting: keep (apply SETTINGS, freed memory stays in the process) or system (malloc as it is)."""

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20))
_applied = False


def keep_freed_memory() -> bool:
    """Apply SETTINGS once per process; True when glibc accepted all of them (now or before)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (find_library would fork a process)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in SETTINGS)
    return _applied


__all__ = ["keep_freed_memory", "SETTINGS"]
