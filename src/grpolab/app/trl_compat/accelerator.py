"""`trainer.accelerator` of a GRPOTrainer: what one-process scripts read of accelerate's Accelerator.

grpolab does not run under accelerate (torchrun data parallelism is its own: docs/distributed.md), so this is a
small object with Accelerator's names, true of the process it runs in: is_main_process, is_local_main_process,
process_index, local_process_index, num_processes, device, print (rank 0 only), wait_for_everyone,
unwrap_model (a peft or compiled wrapper left on, as accelerate does), gather / gather_for_metrics / reduce (one
process: the value itself), save (torch.save on rank 0), end_training, main_process_first, autocast."""

from __future__ import annotations

import contextlib
import os


class Accelerator:
    """One process's answers to accelerate.Accelerator's questions (see the module docstring)."""

    def __init__(self, device=None):
        self.process_index = int(os.environ.get("RANK", 0))
        self.local_process_index = int(os.environ.get("LOCAL_RANK", 0))
        self.num_processes = int(os.environ.get("WORLD_SIZE", 1))
        self._device = device
        self.distributed_type = "NO" if self.num_processes == 1 else "MULTI"
        self.mixed_precision = "no"
        self.gradient_accumulation_steps = 1
        self.sync_gradients = True

    @property
    def device(self):
        import torch

        if self._device is not None:
            return torch.device(self._device)
        return torch.device("cuda", self.local_process_index) if torch.cuda.is_available() else torch.device("cpu")

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    def print(self, *args, **kwargs) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        """The model without a DDP or compile wrapper (grpolab wraps none)."""
        inner = getattr(model, "module", None)
        model = inner if inner is not None and type(model).__name__ == "DistributedDataParallel" else model
        return model if keep_torch_compile else getattr(model, "_orig_mod", model)

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        return tensor * scale if scale != 1.0 else tensor

    def pad_across_processes(self, tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        return tensor

    def save(self, obj, f, safe_serialization: bool = False) -> None:
        import torch

        if self.is_main_process:
            torch.save(obj, f)

    def get_state_dict(self, model, unwrap: bool = True) -> dict:
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    @contextlib.contextmanager
    def main_process_first(self):
        yield

    local_main_process_first = main_process_first

    @contextlib.contextmanager
    def autocast(self, autocast_handler=None):
        yield

    def end_training(self) -> None:
        return None

    def free_memory(self, *objects):
        return list(objects)


__all__ = ["Accelerator"]
