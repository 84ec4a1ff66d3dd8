"""Whether bf16 can pay on this device, decided in milliseconds, before anything is timed on a model.

On a CPU, torch's bf16 matrix product is fast only where oneDNN has a bf16 kernel for the CPU and the
CPU computes bf16 itself (x86: the avx512_bf16 or amx_bf16 instructions; ARM: the bf16 extension).
Elsewhere (most laptops: AVX2 without AVX-512, Intel's consumer chips, AMD's Zen 2/3) each bf16 value is
converted to fp32 and back, or the product falls back to a scalar loop tens of times slower than fp32,
and bf16 autocast cannot beat fp32. `bf16_can_pay` reads what the CPU has (`cpu_facts`: /proc/cpuinfo's
flags, oneDNN's own bf16 check, which follows ONEDNN_MAX_CPU_ISA, and torch's vector capability). Where
it cannot read the flags (no /proc/cpuinfo: macOS, other systems) it times one small matrix product in
each precision (`matmul_ratio`): a bf16 product over MATMUL_LIMIT times fp32's is a conversion or a
scalar fallback, and the policy is not worth timing (grpolab.model.precision.measure). Where the CPU
lists bf16 instructions the probe on the policy decides: a bare product's timing beside other work is
too noisy to overrule it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import torch

X86_BF16 = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of x86 CPUs that compute bf16 products
ARM_BF16 = ("bf16",)  # /proc/cpuinfo Features of ARM CPUs with the BF16 extension (FEAT_BF16)
MATMUL = (64, 576, 1536)  # (M, K, N) of the pre-check: a decode step's rows by a 135M model's MLP weight
MATMUL_LIMIT = 2.0  # the pre-check rules bf16 out when its product takes over this many times fp32's
SLOW_FIRST = 4.0  # a first bf16 product this many times fp32's is a scalar fallback: no repeats needed


@dataclass(frozen=True)
class CpuFacts:
    """What decides bf16 on a CPU, read in microseconds. `flags`: /proc/cpuinfo's flags (x86) or Features
    (ARM), None where unreadable (not Linux); `onednn_bf16`: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    None where torch has no oneDNN."""

    arch: str  # "x86", "arm" or platform.machine() as is
    model: str  # the CPU's model name, "" where unknown
    capability: str  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...
    flags: frozenset[str] | None
    onednn_bf16: bool | None

    def bf16_flags(self) -> tuple[str, ...]:
        """The CPU's bf16 instructions among X86_BF16 / ARM_BF16 (empty when it has none)."""
        wanted = X86_BF16 if self.arch == "x86" else ARM_BF16 if self.arch == "arm" else ()
        return tuple(f for f in wanted if self.flags and f in self.flags)


def _arch(machine: str) -> str:
    m = machine.lower()
    if m in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    if m in ("aarch64", "arm64") or m.startswith("armv"):
        return "arm"
    return m


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str] | None]:
    """(model name, flags) of the first processor in /proc/cpuinfo's text: x86 lists `flags` and `model
    name`, ARM `Features` and (on some kernels) `Hardware` or `CPU part`; flags None where none is listed."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    flags = fields.get("flags", fields.get("features"))
    model = fields.get("model name") or fields.get("hardware") or fields.get("cpu part", "")
    return model, (frozenset(flags.split()) if flags is not None else None)


def _cpuinfo() -> tuple[str, frozenset[str] | None]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read(1 << 16))
    except OSError:
        return "", None


def cpu_facts() -> CpuFacts:
    """This machine's CpuFacts, as torch in this process sees them."""
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = None
    model, flags = _cpuinfo()
    return CpuFacts(_arch(platform.machine()), model, torch.backends.cpu.get_cpu_capability(), flags, onednn)


def verdict_from_facts(facts: CpuFacts) -> tuple[bool | None, str]:
    """(False, why) where the CPU rules bf16 out, (True, what it has) where it has bf16 instructions,
    (None, what is known) where only a timing can tell.

    no oneDNN bf16 kernel                        -> False  (torch's bf16 product is a scalar loop)
    flags known, none of X86_BF16 / ARM_BF16     -> False  (bf16 computed through fp32 conversions)
    flags known, one of them                     -> True   (the probe on the policy decides)
    flags unknown                                -> None   (time one product: bf16_can_pay)
    """
    where = f"{facts.model or facts.arch} at torch's {facts.capability}"
    if facts.onednn_bf16 is False:
        return False, f"no oneDNN bf16 kernel on this CPU ({where}): torch's bf16 matmul is a scalar fallback"
    if facts.flags is not None and facts.arch in ("x86", "arm") and not facts.bf16_flags():
        names = " or ".join(X86_BF16 if facts.arch == "x86" else ARM_BF16)
        return False, f"this CPU has no bf16 instructions ({names} in /proc/cpuinfo; {where})"
    if facts.bf16_flags():
        return True, f"bf16 instructions {', '.join(facts.bf16_flags())}; {where}"
    return None, f"its instructions unknown; {where}"


def matmul_seconds(dtype: torch.dtype, *, reps: int = 3, shape: tuple[int, int, int] = MATMUL) -> list[float]:
    """Seconds of `1 + reps` products (M x K) @ (K x N) in `dtype` on the CPU, the first a warm-up; fixed
    inputs (no random draw), so the run's RNG is untouched. After a first product SLOW_FIRST times an
    fp32 one would be, the caller stops (a scalar fallback needs no repeats)."""
    m, k, n = shape
    a = (torch.arange(m * k, dtype=torch.float32).view(m, k) % 7 - 3).to(dtype)
    b = (torch.arange(k * n, dtype=torch.float32).view(k, n) % 5 - 2).to(dtype)
    out = []
    for _ in range(1 + reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        out.append(time.perf_counter() - t0)
    return out


def matmul_ratio(timer=matmul_seconds) -> float:
    """Best bf16 time over best fp32 time of one MATMUL product; `timer(dtype, reps=)` -> list of seconds,
    the first a warm-up. A first bf16 product SLOW_FIRST times the fp32 warm-up ends it without repeats.

        ratio = min(t_bf16[1:]) / min(t_fp32[1:])
    """
    fp32 = timer(torch.float32, reps=3)
    first = timer(torch.bfloat16, reps=0)
    if first[0] > SLOW_FIRST * max(fp32[0], min(fp32[1:])):
        return first[0] / min(fp32[1:])
    return min(timer(torch.bfloat16, reps=3)[1:]) / min(fp32[1:])


def bf16_can_pay(device, *, facts: CpuFacts | None = None, timer=matmul_seconds) -> tuple[bool, str]:
    """Whether bf16 autocast can be faster than fp32 on `device`, and why, in milliseconds.

    CUDA: the GPU's bf16 support (torch.cuda.is_bf16_supported). CPU: verdict_from_facts on `facts`
    (default: cpu_facts()); where that leaves it open, one MATMUL product in each precision must give
    t_bf16 <= MATMUL_LIMIT x t_fp32 (matmul_ratio, with `timer`). True means only that timing the policy
    is worth it (grpolab.model.precision.measure decides); False means fp32 without timing anything.
    Other devices (mps): True, the probe decides."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "a bf16-capable GPU" if ok else "this GPU has no bf16"
    if device.type != "cpu":
        return True, f"not decided for {device.type}"
    verdict, why = verdict_from_facts(facts or cpu_facts())
    if verdict is not None:
        return verdict, why
    ratio = matmul_ratio(timer)
    m, k, n = MATMUL
    product = f"a {m}x{k} by {k}x{n} matmul in bf16 takes x{ratio:.2f} fp32's time"
    if ratio > MATMUL_LIMIT:
        return False, f"{product} ({why})"
    return True, f"{product} ({why})"


__all__ = [
    "CpuFacts",
    "bf16_can_pay",
    "cpu_facts",
    "matmul_ratio",
    "matmul_seconds",
    "parse_cpuinfo",
    "verdict_from_facts",
]
