"""The model-level switches of a run's config as types: the device and the precision it computes in.
Torch-free, so that grpolab.training.config reads them before torch is imported (grpolab.util.threads
must set OpenMP's wait policy first); the behaviour is grpolab.model.load.pick_device's and
grpolab.model.precision's.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from grpolab.util.fields import Pattern

PrecisionSetting = Literal["auto", "bf16", "fp16", "fp32"]
"""The `precision` setting: auto (grpolab.model.precision decides per phase), bf16 (autocast), fp16 (autocast
with loss scaling, CUDA only: grpolab.model.loss_scale) or fp32."""

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
"""The `compile_mode` setting: torch.compile's modes (grpolab.model.compiling)."""

DeviceName = Literal["auto", "cpu", "cuda"]
"""The named `device` settings: auto (CUDA when present, else the CPU), cpu or cuda (the current GPU)."""
CudaDevice = Annotated[str, Pattern(r"cuda:\d+", "cuda:N", "the CUDA GPU of index N")]
"""A `device` setting naming one GPU by its index, as torch.device takes it: cuda:0, cuda:1, ..."""
DeviceSetting = typing.Union[DeviceName, CudaDevice]  # noqa: UP007 (a runtime union of typing forms)
"""The `device` setting: one of DeviceName, or cuda:N (CudaDevice)."""
