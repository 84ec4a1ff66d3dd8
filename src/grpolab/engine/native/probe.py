"""The native engine's timing of one rollout, for precision=auto (grpolab.model.precision.measure): the
decode loop's own steppers, timed in fp32 and bf16 on the policy."""

from __future__ import annotations

import time

import torch

from grpolab.engine.native.decoder import lean_decodes, model_type_of
from grpolab.engine.native.steppers import HFStepper, stepper_for
from grpolab.model.precision import PROBE_STEPS, probe_ids, sync


def decode_seconds(
    model, dtype, *, rows: int = 8, prompt: int = 16, tokens: int = PROBE_STEPS, decoder: str = "auto"
) -> float:
    """Seconds one rollout of `rows` sequences writing `tokens` tokens in `dtype` (None: fp32) takes, as
    grpolab.engine.native.generate.generate runs it for the `decoder` setting: the lean step where it
    applies (grpolab.engine.native.decoder.lean_decodes), else the model's forward under one autocast context.
    What a rollout pays once (the lean step's weight layout, the prefill) is timed once; PROBE_STEPS cached decode steps
    are timed and scaled to the rollout's length, so a short probe weighs the set-up as a long rollout does:

        t = t_setup + t_steps * tokens / PROBE_STEPS
    """
    device = next(model.parameters()).device
    ids = probe_ids(model, rows, prompt, device)
    pos = torch.arange(prompt, device=device).expand(rows, prompt)
    sync(device)
    t0 = time.perf_counter()
    lean = lean_decodes(decoder, model_type_of(model), dtype, device.type)
    stepper = stepper_for(model, dtype or torch.float32, PROBE_STEPS, lean)
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None and isinstance(stepper, HFStepper))
    with torch.no_grad(), amp:
        tok = stepper.prefill(ids, torch.ones_like(ids), pos).argmax(-1)
        sync(device)
        t1 = time.perf_counter()
        for i in range(PROBE_STEPS):
            tok = stepper.step(tok, pos[:, -1] + i + 1).argmax(-1)
        sync(device)
    t2 = time.perf_counter()
    return (t1 - t0) + (t2 - t1) * tokens / PROBE_STEPS
