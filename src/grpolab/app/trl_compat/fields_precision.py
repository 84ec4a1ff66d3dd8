"""TRL's compute fields in grpolab's terms: bf16 and fp16 (the `precision` setting), torch_compile with its
backend and mode (`compile`, grpolab.model.compiling), tf32 (the `tf32` setting, grpolab.model.numerics). Part of
the mapping table (grpolab.app.trl_compat.fields_hf and fields_run hold their entries)."""

from __future__ import annotations

from grpolab.app.trl_compat.entries import fail
from grpolab.app.trl_compat.fields_model import NOTES
from grpolab.training.config_checks import COMPILE_WITH_CHECKPOINTING


def bf16_setting(v, a) -> dict:
    """bf16: None -> precision=auto, True -> bf16, False -> fp32 (fp16=True decides instead: fp16_setting)."""
    if a.get("fp16"):
        return {}
    return {"precision": {None: "auto", True: "bf16", False: "fp32"}[v]}


def fp16_setting(v, a) -> dict:
    """fp16=True on a CUDA GPU -> precision=fp16: fp16 autocast with the loss scaled by torch.amp.GradScaler,
    as TRL trains it there through accelerate (grpolab.model.loss_scale); where TRL 1.16 trains in fp32 (a
    CPU: accelerate makes neither an fp16 autocast nor a grad scaler there) -> precision=fp32, with a note;
    on an Apple GPU (MPS) refused: grpolab's scaler runs on CUDA."""
    if not v:
        return {}
    if a.get("bf16"):
        raise fail("fp16", v, "At most one of fp16 and bf16 can be True, but not both (as transformers says)")
    import torch

    if not a.get("use_cpu") and torch.cuda.is_available():
        return {
            "precision": "fp16",
            NOTES: ["fp16=True: fp16 autocast, the loss scaled by torch.amp.GradScaler; weights stay fp32, as in TRL"],
        }
    if a.get("use_cpu") or not torch.backends.mps.is_available():
        return {
            "precision": "fp32",
            NOTES: ["fp16=True on a CPU: trained in fp32, as TRL 1.16 trains it there (no fp16 autocast on a CPU)"],
        }
    raise fail("fp16", v, "grpolab's loss-scaled fp16 runs on CUDA GPUs, not on MPS; use bf16=True")


def torch_compile_setting(v, a) -> dict:
    """torch_compile=True, or a torch_compile_backend / torch_compile_mode given (transformers then turns it on)
    -> compile=true, compile_backend (TRL's None: inductor, as transformers sets it), compile_mode (None:
    default). With gradient_checkpointing=True (TRL's default) refused: grpolab's checkpointed layers cannot be
    compiled (COMPILE_WITH_CHECKPOINTING)."""
    backend, mode = a.get("torch_compile_backend"), a.get("torch_compile_mode")
    if not (v or backend is not None or mode is not None):
        return {}
    if a.get("gradient_checkpointing"):
        why = COMPILE_WITH_CHECKPOINTING.replace(
            "compile=true with grad_checkpointing=true", "with gradient_checkpointing=True"
        )
        raise fail("torch_compile", v, why)
    return {"compile": True, "compile_backend": backend or "inductor", "compile_mode": mode or "default"}


def tf32_setting(v, a) -> dict:
    """tf32 as transformers' TrainingArguments.__post_init__ leaves torch (grpolab.model.numerics): True -> tf32=true,
    refused where no CUDA GPU of the Ampere generation or newer is present (transformers' ValueError); False ->
    tf32=false; None -> TF32 on (tf32=true) when torch_compile is on (or its backend or mode given) on such a GPU
    and fp16 is off or bf16 on, as transformers turns it on for torch.compile; else nothing (torch's setting)."""
    from grpolab.model.numerics import TF32_UNAVAILABLE, tf32_available

    if v is None:
        compiled = a.get("torch_compile") or any(
            a.get(k) is not None for k in ("torch_compile_backend", "torch_compile_mode")
        )
        bf16 = a.get("bf16") if a.get("bf16") is not None else not a.get("fp16")  # TRL: bf16 unless fp16
        on = compiled and (not a.get("fp16") or bf16) and tf32_available()
        return {"tf32": True} if on else {}
    if v and not tf32_available():
        raise fail("tf32", v, f"{TF32_UNAVAILABLE} (transformers' error); this machine has none: leave tf32 None")
    return {"tf32": bool(v)}


def read_with_torch_compile(v, a) -> dict:
    """torch_compile_backend / torch_compile_mode: their settings are written by torch_compile_setting."""
    return {}


__all__ = ["bf16_setting", "fp16_setting", "read_with_torch_compile", "tf32_setting", "torch_compile_setting"]
