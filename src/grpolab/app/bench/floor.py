"""The physical floor of each phase: the larger of its FLOPs at this machine's measured matmul rate and
(generation) the bytes it must read at this machine's measured memory bandwidth.

Per sequence, with P prompt tokens, C completion tokens, N parameters without the embedding (a tied
LM head is the embedding matrix) and the LM head's V x H applied at the C completion positions only:

    generation   2N(P+C) + 2VHC        one forward pass over prompt and completion (decoded one token at a time)
    reference    2N(P+C) + 2VHC        one no-grad forward pass (only when beta > 0)
    update       6N(P+C) + 6VHC        forward + backward (LoRA: 4N(P+C) + 4VHC, no weight gradients of the
                                       frozen matrices; the adapters' own FLOPs are left out)

Attention's own FLOPs (4 L H (P+C)^2 per sequence and layer, small at these lengths) are left out,
and so is the prompt computed once per group (grpolab does that: its actual work is below this
count), so the FLOP floor is the cost of the plain per-sequence computation at the peak matmul rate.

Decoding reads every weight once per token, whatever the number of rows, and each row's KV cache:

    generation bytes   C b (N + VH) + n s ((C-1) P + C(C-1)/2)

for n sequences, b bytes per weight (4 fp32, 2 bf16) and s = 2 L n_kv d 4 bytes per cached token and
row (keys and values of every layer, fp32): C passes over the weights (the prompt's pass and C - 1
decode steps) and, at decode step t, the P + t cached tokens of every row. The memory floor is those
bytes at the bandwidth of reading a buffer of the weights' size (`memory_bandwidth`). Each phase's floor
is the larger of its two; x floor = measured seconds / floor seconds.
"""

from __future__ import annotations

import statistics
import time

RATE_BUDGET_S = 0.5  # one product of the matmul rate takes at most about this long (its size adapts)
MAX_BANDWIDTH_BYTES = 1 << 30  # the bandwidth buffer: the weights' bytes, at most this many


def matmul_rate(device, dtype, n: int = 2048, reps: int = 5, budget_s: float = RATE_BUDGET_S) -> tuple[float, int]:
    """(FLOP/s, size) of an m x m x m matmul (2 m^3 FLOPs) on `device` in `dtype`: the best of `reps` after a
    warm-up, into a preallocated output (no page faults of a fresh one in the timing), m the largest of 256,
    512, ... n whose product takes at most about budget_s (a product 8 times the last one's time would not
    fit), so that a dtype the device computes slowly (bf16 on a CPU without bf16 instructions: a scalar loop)
    is measured in a fraction of a second, not minutes. The best, not the median: a floor is the rate the
    machine has shown it reaches, and a shared CPU's single products vary by 2x (a median under that noise
    put the update's measured rate above the "peak")."""
    import torch

    def once(a, b, out) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(4 if device.type == "cuda" else 1):
            torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t) / (4 if device.type == "cuda" else 1)

    m = 256
    while True:
        a = torch.randn(m, m, device=device, dtype=dtype)
        b = torch.randn(m, m, device=device, dtype=dtype)
        out = torch.empty(m, m, device=device, dtype=dtype)
        first = once(a, b, out)
        if m >= n or 8 * first > budget_s:
            break
        m *= 2
    return 2 * m**3 / min(once(a, b, out) for _ in range(reps)), m


def memory_bandwidth(device, nbytes: int, reps: int = 3) -> tuple[float, int]:
    """(bytes/s, buffer bytes) of reading an fp32 buffer of `nbytes` (at most MAX_BANDWIDTH_BYTES) with
    torch's sum on `device` (a CPU: torch's threads as set): the best of `reps` passes after the pass that
    fills it. A buffer of the decode step's own bytes is read at the speed the decode step's weights are:
    from memory when they outgrow the caches, from a cache when they fit."""
    import torch

    n = max(1 << 20, min(int(nbytes), MAX_BANDWIDTH_BYTES)) // 4
    buf = torch.ones(n, device=device)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        buf.sum().item()
        best = min(best, time.perf_counter() - t)
    return 4 * n / best, 4 * n


def matmul_rates(device, precisions=("fp32", "bf16")) -> dict:
    """{"fp32": FLOP/s, "bf16": FLOP/s, "sizes": {precision: m}} of the matmul rate (matmul_rate) for each
    of `precisions`."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    out: dict = {"sizes": {}}
    for p in precisions:
        out[p], out["sizes"][p] = matmul_rate(device, dtypes[p])
    return out


def phase_flops(n_seq: float, P: float, C: float, N: int, V: int, H: int, *, beta: float, lora: bool) -> dict:
    """FLOPs per step of each phase (formulas in the module docstring)."""
    fwd = n_seq * (2 * N * (P + C) + 2 * V * H * C)
    return {"generation": fwd, "reference": fwd if beta > 0 else 0.0, "update": fwd * (2 if lora else 3)}


def generation_bytes(
    n_seq: float, P: float, C: float, N: int, V: int, H: int, *, weight_bytes: int, kv_slot: int
) -> float:
    """Bytes a rollout must read (module docstring): C b (N + VH) + n s ((C-1) P + C(C-1)/2), b =
    weight_bytes per weight, s = kv_slot bytes per cached token and row."""
    return C * weight_bytes * (N + V * H) + n_seq * kv_slot * ((C - 1) * P + C * (C - 1) / 2)


def floor_table(ours: dict, rates: dict, *, beta: float, lora: bool) -> list[dict]:
    """One row per phase (generation, reference, update, and the step): median seconds, FLOPs, the FLOP
    floor at the matmul rate of the phase's precision (rates: {"fp32": FLOP/s, "bf16": FLOP/s,
    "bandwidth": bytes/s}), bytes read and the memory floor (generation: generation_bytes; the others
    are bound by their FLOPs), the floor (the larger), what bounds it and the ratio to it. `ours` is
    grpolab's summary (grpolab.app.bench.main)."""
    s = ours["steps"]
    P = statistics.median(x["prompt_tokens_mean"] for x in s)
    C = statistics.median(x["completion_tokens_mean"] for x in s)
    n_seq = statistics.median(x["seqs"] for x in s)
    N, V, H = ours["params_non_embedding"], ours["vocab"], ours["hidden"]
    fl = phase_flops(n_seq, P, C, N, V, H, beta=beta, lora=lora)
    gen_bytes = 0.0
    if ours.get("kv_slot_bytes") is not None:
        b = 4 if ours["phase_precision"]["generation"] == "fp32" else 2
        gen_bytes = generation_bytes(n_seq, P, C, N, V, H, weight_bytes=b, kv_slot=ours["kv_slot_bytes"])
    rows = []
    total = 0.0
    for phase in ("generation", "reference", "update"):
        sec = statistics.median(x[f"{phase}_s"] for x in s)
        flop_floor = fl[phase] / rates[ours["phase_precision"][phase]] if fl[phase] else 0.0
        nbytes = gen_bytes if phase == "generation" else 0.0
        mem_floor = nbytes / rates["bandwidth"] if nbytes and rates.get("bandwidth") else 0.0
        floor = max(flop_floor, mem_floor)
        total += floor
        rows.append(
            {
                "phase": phase,
                "seconds": sec,
                "flops": fl[phase],
                "flop_floor_s": flop_floor,
                "bytes": nbytes,
                "memory_floor_s": mem_floor,
                "floor_s": floor,
                "bound": None if floor == 0 else "memory" if mem_floor > flop_floor else "FLOPs",
                "ratio": sec / floor if floor > 0 else None,
            }
        )
    sec = statistics.median(x["step_s"] for x in s)
    rows.append(
        {
            "phase": "step",
            "seconds": sec,
            "flops": sum(fl.values()),
            "flop_floor_s": sum(r["flop_floor_s"] for r in rows),
            "bytes": gen_bytes,
            "memory_floor_s": sum(r["memory_floor_s"] for r in rows),
            "floor_s": total,
            "bound": "sum of the phases' floors",
            "ratio": sec / total if total > 0 else None,
        }
    )
    return rows


__all__ = ["floor_table", "generation_bytes", "matmul_rate", "matmul_rates", "memory_bandwidth", "phase_flops"]
