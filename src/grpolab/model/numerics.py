"""Process-wide torch settings a run asks for at its start, set as transformers sets them for TRL: TF32
matmuls and convolutions (the `tf32` setting; TrainingArguments.__post_init__ with
transformers.utils.import_utils.enable_tf32) and deterministic algorithms (the `full_determinism` setting;
transformers.trainer_utils.enable_full_determinism, which the Trainer calls instead of set_seed). Like
transformers, nothing here is undone when the run ends: the process keeps them.

    start_numerics(seed, tf32=None, full_determinism=False)   # at a run's start, before any model loads
"""

from __future__ import annotations

import os
import random

import torch

from grpolab.util.fields import ConfigError

TF32_UNAVAILABLE = "--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7"
"""transformers' ValueError for tf32=True where is_torch_tf32_available() is False (any CPU)."""

DETERMINISM_ENV = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":16:8",
    "ASCEND_LAUNCH_BLOCKING": "1",
    "HCCL_DETERMINISTIC": "1",
    "FLASH_ATTENTION_DETERMINISTIC": "1",
}
"""The environment enable_full_determinism sets (cuBLAS and flash-attention need them to be deterministic)."""


def tf32_available() -> bool:
    """transformers' is_torch_tf32_available (MUSA GPUs aside): a CUDA build of torch and a current GPU of compute
    capability 8 or more (Ampere or newer). False on any machine without a CUDA GPU."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8


def set_tf32(enable: bool) -> None:
    """transformers' enable_tf32: torch >= 2.9 sets the generic fp32 precision, torch.backends.fp32_precision =
    "tf32" | "ieee" (every backend that leaves its own at "none" follows it); older torch the allow_tf32 flags
    of cuda.matmul and cudnn."""
    if torch.__version__ >= "2.9.0":  # a TorchVersion: compared as packaging.version compares them
        if hasattr(torch.backends, "fp32_precision"):
            torch.backends.fp32_precision = "tf32" if enable else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = enable
        torch.backends.cudnn.allow_tf32 = enable


def apply_tf32(setting: bool | None) -> None:
    """TrainingArguments.__post_init__'s tf32 step: None leaves torch's setting as it is; True turns TF32 on
    where tf32_available(), and elsewhere is refused (ConfigError, exit 2) with transformers' message; False
    turns it off where available (elsewhere there is nothing to turn off)."""
    if setting is None:
        return
    if not tf32_available():
        if setting:
            raise ConfigError(
                f"tf32=true: {TF32_UNAVAILABLE} (as transformers says); this machine has no such GPU: "
                f"leave tf32 unset (null) or false"
            )
        return
    set_tf32(bool(setting))


def enable_full_determinism(seed: int) -> None:
    """transformers' enable_full_determinism(seed): set_seed (python's random, numpy's, torch's on every
    device), DETERMINISM_ENV in the environment, torch.use_deterministic_algorithms(True) (an operation
    without a deterministic implementation then raises), cuDNN deterministic and not benchmarking."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ.update(DETERMINISM_ENV)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def start_numerics(seed: int, tf32: bool | None = None, full_determinism: bool = False) -> None:
    """At a run's start: torch.manual_seed(seed), or with full_determinism enable_full_determinism(seed); then
    apply_tf32(tf32)."""
    if full_determinism:
        enable_full_determinism(seed)
    else:
        torch.manual_seed(seed)
    apply_tf32(tf32)


__all__ = ["DETERMINISM_ENV", "apply_tf32", "enable_full_determinism", "set_tf32", "start_numerics", "tf32_available"]
