"""`precision=fp16`: fp16 autocast with dynamic loss scaling (torch.amp.GradScaler), where the device has it.

fp16 keeps 5 exponent bits: its smallest normal value is 6.1e-5 and its largest 65504, so the small
gradients of a language model underflow to 0. The loss L is multiplied by a scale S before the backward
pass, so every gradient is S times larger and stays in range; the gradients are divided by S again before
they are clipped and applied (micro-batches add S g each, so their sum is S times the batch's gradient):

    backward(S * L)                      g_S = S g                       (scale_loss)
    g = g_S / S                          before clip_grad_norm_           (unscale_and_clip)
    found_inf = any(g not finite)
    found_inf:  no optimizer step;       S <- S * backoff, tracker <- 0   (an overflow: finish_step)
    otherwise:  optimizer step;          tracker <- tracker + 1; at `interval`: S <- S * growth, tracker <- 0

That is torch.amp.GradScaler's rule, which runs it (its defaults: S = 2^16 to start, growth 2, backoff 0.5,
interval 2000); `next_scale` writes its update out, the equation for the reader and the tests. Its state
(S, tracker) is a component of the run (`loss_scaler`), saved as loss_scale.pt in each checkpoint, so a
resumed run goes on with the scale it had. An overflow is how the scale is found from above, not a fault:
the training loop counts it apart (update/overflow_skipped) from a non-finite loss (max_nonfinite_updates).

Where: a CUDA GPU (the autocast and scaler TRL gets there through accelerate). On a CPU fp16 is refused
(`fp16_refusal`): CPU products in fp16 are converted or emulated (no fp16 matrix units on most CPUs), and
accelerate makes no fp16 autocast there either; bf16 autocast (precision=bf16) needs no scaler at all.
Weights and optimizer state stay fp32, as with bf16.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

LOSS_SCALE = "loss_scale"
"""The component's name in Run.components (its checkpoint file: loss_scale.pt)."""


def fp16_refusal(device: torch.device, *, sharded: bool = False, critic: bool = False) -> str | None:
    """Why precision=fp16 cannot run here (a ConfigError's text naming what to use instead), or None."""
    if device.type != "cuda":
        return (
            f"precision=fp16 needs a CUDA GPU; this run is on the {device.type.upper()}, where fp16 products are "
            "converted or emulated (no fp16 matrix units) and neither grpolab nor accelerate (TRL) makes an fp16 "
            "autocast; use precision=bf16 (bf16 autocast, no loss scaling needed) or precision=fp32"
        )
    if sharded:
        return "precision=fp16 with fsdp=true: the loss scaler is not sharded with the model; use precision=bf16"
    if critic:
        return (
            "precision=fp16 with a critic (algo=ppo): the critic's optimizer steps outside the loss scaler; "
            "use precision=bf16"
        )
    return None


def loss_scaler(device: torch.device) -> torch.amp.GradScaler:
    """The run's GradScaler for `device`'s type (torch's defaults: S = 2^16, growth 2, backoff 0.5, interval
    2000); it has state_dict / load_state_dict, so it is saved and restored as a component."""
    return torch.amp.GradScaler(device.type)


def scale_loss(scaler: torch.amp.GradScaler | None, loss: Tensor) -> Tensor:
    """S * L, what is backpropagated (L itself without a scaler)."""
    return loss if scaler is None else scaler.scale(loss)


def unscale_and_clip(
    scaler: torch.amp.GradScaler | None, optimizer: torch.optim.Optimizer, params: Iterable[Tensor], max_norm: float
) -> tuple[float, bool]:
    """(||g||, overflowed): the gradients divided by S (the scaler records whether any is inf/nan), then
    clipped to `max_norm` (0: measured only) by their global norm. overflowed: the scaled gradient was not
    finite, so this update is skipped (finish_step(..., apply=False)). Without a scaler: a plain clip, never
    an overflow (a non-finite norm is then the caller's non-finite update)."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # g <- g / S in place; found_inf recorded per device
    # max_norm inf measures the norm without clipping (the grads are multiplied by exactly 1)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf")))
    return norm, scaler is not None and not math.isfinite(norm)


def finish_step(scaler: torch.amp.GradScaler | None, optimizer: torch.optim.Optimizer, apply: bool) -> None:
    """After unscale_and_clip: the optimizer step when `apply` (through the scaler, which steps only where it
    found no inf), then the scale's update (next_scale). apply=False with a scaler updates the scale only
    (an overflow halves it); without a scaler it does nothing."""
    if apply:
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
    if scaler is not None:
        scaler.update()


def next_scale(
    scale: float, tracker: int, found_inf: bool, *, growth: float = 2.0, backoff: float = 0.5, interval: int = 2000
) -> tuple[float, int]:
    """GradScaler.update's rule, (S, tracker) -> (S', tracker'): found_inf: (S * backoff, 0); else tracker + 1,
    and on reaching `interval` (S * growth, 0). E.g. (65536, 0, True) -> (32768, 0); (1024, 1999, False) ->
    (2048, 0)."""
    if found_inf:
        return scale * backoff, 0
    tracker += 1
    return (scale * growth, 0) if tracker == interval else (scale, tracker)


def scale_of(scaler: torch.amp.GradScaler | None) -> float | None:
    """The current S (None without a scaler): the update/loss_scale metric."""
    return None if scaler is None else float(scaler.get_scale())


__all__ = [
    "LOSS_SCALE",
    "finish_step",
    "fp16_refusal",
    "loss_scaler",
    "next_scale",
    "scale_loss",
    "scale_of",
    "unscale_and_clip",
]
