"""TRL's model_init_kwargs (the keyword arguments of the policy's from_pretrained) in grpolab's terms.

TRL loads the policy with `from_pretrained(path, dtype=float32 unless given, **model_init_kwargs)`; grpolab
loads every policy itself, weights in fp32, and computes in the precision its `precision` setting names.
So each key means:

    dtype               float32 / None (TRL's default): fp32 weights, as grpolab's, precision as bf16 says;
                        bfloat16: bf16 compute (precision=bf16; grpolab keeps fp32 master weights, TRL
                        would hold the weights in bf16); float16: precision=fp16 (fp16 autocast, the loss
                        scaled; a CUDA GPU only, refused elsewhere by the run); auto: the checkpoint's dtype,
                        which grpolab does not take (fp32 weights, precision as bf16 says)
    attn_implementation accepted: grpolab chooses the attention kernel itself (the same numbers)
    revision            accepted: a local directory has one revision (grpolab never reads the hub)
    trust_remote_code   True refused: grpolab never runs code from a model directory
    device_map, low_cpu_mem_usage, use_cache
                        accepted: grpolab places the model (device=) and decodes with its own cache
    anything else       refused by name (quantization_config: grpolab trains fp32 weights)

A conversion may return notes under NOTES; grpolab.app.trl_compat.config.convert prints them.
"""

from __future__ import annotations

import json
from typing import Any

from grpolab.app.trl_compat.entries import fail

NOTES = "__notes__"
"""The key under which a conversion returns notes (not a setting)."""

DTYPES = {None: None, "float32": None, "bfloat16": "bf16", "float16": "fp16", "auto": None}
"""model_init_kwargs.dtype -> grpolab's precision (None: as bf16 / precision say)."""

ACCEPTED = {
    "attn_implementation": "grpolab chooses the attention kernel itself (sdpa, or its own on a CPU); same numbers",
    "revision": "grpolab reads a local directory, which has one revision",
    "device_map": "grpolab places the model on `device` itself",
    "low_cpu_mem_usage": "only how from_pretrained allocates while loading",
    "use_cache": "grpolab decodes with its own KV cache and trains without one",
}


def _dtype_name(v: Any) -> Any:
    """torch.bfloat16 -> "bfloat16"; strings and None as they are."""
    text = str(v)
    return text.removeprefix("torch.") if text.startswith("torch.") else v


def model_init_kwargs(v: Any, a: dict) -> dict:
    """TRL's model_init_kwargs (a dict or its JSON text) -> grpolab settings and notes (module docstring)."""
    if v is None or v == "":
        return {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise fail("model_init_kwargs", v, f"not a JSON object ({e})") from e
    if not isinstance(v, dict):
        raise fail("model_init_kwargs", v, "expected a dict (or its JSON text)")
    out: dict = {}
    notes: list[str] = []
    for key, value in v.items():
        if key in ("dtype", "torch_dtype"):
            name = _dtype_name(value)
            if name not in DTYPES:
                raise fail(
                    f"model_init_kwargs.{key}",
                    value,
                    "grpolab keeps fp32 weights and computes in fp32, bf16 or fp16: give float32, bfloat16, "
                    "float16 or auto",
                )
            if DTYPES[name] is not None:
                out["precision"] = DTYPES[name]
                prec = DTYPES[name]
                notes.append(f"model_init_kwargs.{key}={name}: {prec} compute (precision={prec}); weights stay fp32")
            elif name == "auto":
                notes.append(f"model_init_kwargs.{key}=auto: grpolab loads fp32 weights whatever the checkpoint holds")
        elif key == "trust_remote_code":
            if value:
                raise fail(
                    "model_init_kwargs.trust_remote_code",
                    value,
                    "grpolab never runs code from a model directory (Llama, Qwen2, Mistral, ... as transformers "
                    "ships them)",
                )
        elif key in ACCEPTED:
            if value is not None:
                notes.append(f"model_init_kwargs.{key}={value!r}: accepted; {ACCEPTED[key]}")
        else:
            known = ", ".join(["dtype", "trust_remote_code", *ACCEPTED])
            raise fail(f"model_init_kwargs.{key}", value, f"refused: grpolab loads the model itself (it takes {known})")
    if notes:
        out[NOTES] = notes
    return out


__all__ = ["NOTES", "model_init_kwargs"]
