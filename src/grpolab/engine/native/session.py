"""One decode session: what the single-turn loop (generate.py) and the multi-turn loop (turns.py) both
set up before their first token and undo after their last.

    ids, mask = the prompts left-padded, on the model's device
    the model in eval mode (restored after), the stepper (lean decode step or the model's own forward)
    one autocast context around the whole decode when the stepper is the model's forward

Autocast caches the low-precision copy of each weight only while its context is open, so entering it
per forward call re-cast every weight at every token, which cost bf16 most of its gain over fp32
(benchmarks/bench_cpu.py; docs/performance.md, "What the loop avoids"). The lean step holds its
weights in the compute dtype already and needs no autocast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from grpolab.engine.native.steppers import HFStepper, stepper_for
from grpolab.model.cache import left_pad


@dataclass
class Session:
    """What a decode loop reads: the stepper, the padded prompts, the end-of-sequence ids, the pad id."""

    stepper: object  # grpolab.engine.native.steppers.HFStepper or grpolab.engine.native.decoder.LeanStepper
    ids: torch.Tensor  # (B, P) left-padded prompt ids on the device
    mask: torch.Tensor  # (B, P) 1 = real token
    eos: torch.Tensor  # (E,) every id that ends a turn
    pad_id: int


def pad_id_of(tokenizer) -> int:
    """The id that pads: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@contextlib.contextmanager
def decode_session(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    autocast_dtype: torch.dtype | None,
    capacity: int,
    lean: bool,
    eos_ids: set[int] | None,
) -> Iterator[Session]:
    """Set up one decode (see the module docstring); `capacity`: the KV cache slots after the prompt."""
    device = next(model.parameters()).device
    pad_id = pad_id_of(tokenizer)
    eos = torch.tensor(
        sorted(eos_ids if eos_ids is not None else {tokenizer.eos_token_id}), dtype=torch.long, device=device
    )
    ids, mask = left_pad(prompt_ids, pad_id)
    was_training = model.training
    model.eval()
    try:
        stepper = stepper_for(model, autocast_dtype or next(model.parameters()).dtype, capacity, lean)
        hf = isinstance(stepper, HFStepper)
        amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype and hf else contextlib.nullcontext()
        with amp:
            yield Session(stepper, ids.to(device), mask.to(device), eos, pad_id)
    finally:
        model.train(was_training)
