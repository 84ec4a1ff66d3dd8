"""What does starting vLLM's CPU build change in the trainer's process? torch's backend flags, thread
count, CPU affinity, denormal handling, default dtype, grad mode and the OpenMP/oneDNN/MKL/torch/LD_
environment, read before and after `LLM(...)` (eager, the bundled model, bf16); prints what changed.

    python benchmarks/vllm_process_changes.py
"""

import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402

from grpolab.model.load import model_dir  # noqa: E402

ENV_PARTS = ("OMP", "KMP", "DNNL", "ONEDNN", "MKL", "TORCH", "LD_", "GOMP")


def backend_flags() -> dict:
    flags = {}
    for name in ("mkldnn", "mkl", "openmp", "cpu"):
        module = getattr(torch.backends, name, None)
        for attr in dir(module) if module is not None else []:
            if attr.startswith("_"):
                continue
            try:
                value = getattr(module, attr)
                value = value() if attr in ("is_available", "get_cpu_capability") else value
            except Exception:  # noqa: BLE001, S112 (a flag this torch does not have)
                continue
            if isinstance(value, (bool, int, str, float)):
                flags[f"{name}.{attr}"] = value
    try:
        flags["mkldnn.matmul.fp32_precision"] = torch.backends.mkldnn.matmul.fp32_precision
    except AttributeError:
        pass
    return flags


def snapshot() -> dict:
    return {**backend_flags(), "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "affinity": sorted(os.sched_getaffinity(0)), "denormal_1e-40": float(torch.tensor([1e-40]) * 1),
            "default_dtype": str(torch.get_default_dtype()), "grad_enabled": torch.is_grad_enabled(),
            "env": {k: v for k, v in os.environ.items() if any(p in k for p in ENV_PARTS)}}


def main() -> None:
    before = snapshot()
    from vllm import LLM

    LLM(model=str(model_dir("smollm2-135m", log=lambda *a: None)), dtype="bfloat16", seed=0, skip_tokenizer_init=True,
        enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=2**28)
    after = snapshot()
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            print(f"changed {key}: {before.get(key)!r} -> {after.get(key)!r}")
    print("unchanged:", ", ".join(k for k in sorted(before) if before[k] == after.get(k)))


if __name__ == "__main__":
    main()
