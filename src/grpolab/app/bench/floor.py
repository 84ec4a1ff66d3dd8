"""The physical floor of each phase: its FLOPs divided by this machine's measured matmul rate.

Per sequence, with P prompt tokens, C completion tokens, N parameters without the embedding (a tied
LM head is the embedding matrix) and the LM head's V x H applied at the C completion positions only:

    generation   2N(P+C) + 2VHC        one forward pass over prompt and completion (decoded one token at a time)
    reference    2N(P+C) + 2VHC        one no-grad forward pass (only when beta > 0)
    update       6N(P+C) + 6VHC        forward + backward (LoRA: 4N(P+C) + 4VHC, no weight gradients of the
                                       frozen matrices; the adapters' own FLOPs are left out)

Attention's own FLOPs (4 L H (P+C)^2 per sequence and layer, small at these lengths) are left out,
and so is the prompt computed once per group (grpolab does that: its actual work is below this
count), so the floor is the cost of the plain per-sequence computation at the peak matmul rate.
Ratio to floor = measured seconds / floor seconds.
"""

from __future__ import annotations

import statistics
import time


def matmul_rate(device, dtype, n: int = 2048, reps: int = 3) -> float:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs) on `device` in `dtype`: median of `reps`, after a warm-up."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(4 if device.type == "cuda" else 1):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t) / (4 if device.type == "cuda" else 1)

    once()
    return 2 * n**3 / statistics.median(once() for _ in range(reps))


def matmul_rates(device) -> dict:
    """{"fp32": FLOP/s, "bf16": FLOP/s} of a 2048^3 matmul on the device."""
    import torch

    return {"fp32": matmul_rate(device, torch.float32), "bf16": matmul_rate(device, torch.bfloat16)}


def phase_flops(n_seq: float, P: float, C: float, N: int, V: int, H: int, *, beta: float, lora: bool) -> dict:
    """FLOPs per step of each phase (formulas in the module docstring)."""
    fwd = n_seq * (2 * N * (P + C) + 2 * V * H * C)
    return {"generation": fwd, "reference": fwd if beta > 0 else 0.0, "update": fwd * (2 if lora else 3)}


def floor_table(ours: dict, rates: dict, *, beta: float, lora: bool) -> list[dict]:
    """One row per phase (generation, reference, update, and the step): median seconds, FLOPs, floor
    seconds at the matmul rate of the phase's precision (rates: {"fp32": FLOP/s, "bf16": FLOP/s}),
    ratio to the floor. `ours` is grpolab's summary (grpolab.app.bench.main)."""
    s = ours["steps"]
    P = statistics.median(x["prompt_tokens_mean"] for x in s)
    C = statistics.median(x["completion_tokens_mean"] for x in s)
    n_seq = statistics.median(x["seqs"] for x in s)
    fl = phase_flops(n_seq, P, C, ours["params_non_embedding"], ours["vocab"], ours["hidden"], beta=beta, lora=lora)
    rows = []
    total = 0.0
    for phase in ("generation", "reference", "update"):
        sec = statistics.median(x[f"{phase}_s"] for x in s)
        floor = fl[phase] / rates[ours["phase_precision"][phase]]
        total += floor
        rows.append(
            {
                "phase": phase,
                "seconds": sec,
                "flops": fl[phase],
                "floor_s": floor,
                "ratio": sec / floor if floor > 0 else None,
            }
        )
    sec = statistics.median(x["step_s"] for x in s)
    rows.append(
        {
            "phase": "step",
            "seconds": sec,
            "flops": sum(fl.values()),
            "floor_s": total,
            "ratio": sec / total if total > 0 else None,
        }
    )
    return rows


__all__ = ["floor_table", "matmul_rate", "matmul_rates", "phase_flops"]
