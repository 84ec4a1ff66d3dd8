"""torch.compile of the policy's decoder layers in the update pass (`compile=true`; TRL's torch_compile).

Each decoder layer's forward is compiled once (torch.compile(layer.forward, backend, mode)) and the compiled
callable is kept per layer for the run, so later updates reuse it; dynamo recompiles for a new shape of the
micro-batch, and after a second shape marks the changing sizes dynamic. Only the layers are compiled: the
embedding, the KV cache's bookkeeping around them (the prompt of a group runs once and its keys and values
are repeated for its G completions, grpolab.model.logprobs.grouped_completion_logp) and the chunked LM head
stay eager. Like grpolab.model.checkpointing, the context swaps the layers' `forward` only while it is open:
nothing stays on the model, so a deep copy or a checkpoint of the model never carries a compiled function.

    with compiled(policy, spec.compiler):     # grpolab.model.passes.policy_logp, when PassSpec.compiler
        logp, entropy = grouped_completion_logp(policy, ...)

Not with activation checkpointing (refused by the config, grpolab.training.config_checks): the checkpoint's
replay restores the layer's cache slot from Python, which dynamo cannot trace inside the checkpoint, so the
layers would run eager. What the compilation costs and how close the gradients come to the eager ones:
docs/performance.md, "compile=true", and tests/test_compile.py.

Inductor's kernel cache is kept apart per instruction set torch runs at (`inductor_cache_dir`): its cache
keys do not tell a process capped at AVX2 (ATEN_CPU_CAPABILITY=avx2, how grpolab is tested for CPUs without
AVX-512) from one at the CPU's own AVX-512, and kernels compiled under the one, reused by the other, gave
NaN logits or a corrupted heap where measured.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from grpolab.model.checkpointing import decoder_layers
from grpolab.util.fields import ConfigError

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""layer -> (Compiler, its compiled forward): made on the first pass, reused by every later one."""


@dataclass(frozen=True)
class Compiler:
    """torch.compile's options (the run's compile_backend and compile_mode)."""

    backend: str = "inductor"
    mode: str = "default"


def compile_refusal(backend: str, device: torch.device) -> str | None:
    """Why `backend` cannot compile on `device` (a ConfigError's text), or None: a name torch does not know,
    or inductor on a CPU without a C++ compiler (it generates and builds C++ there)."""
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if backend not in known:
        return f"compile_backend: {backend!r} is not a torch.compile backend; known: {', '.join(known)}"
    if backend == "inductor" and device.type == "cpu":
        cxx = os.environ.get("CXX") or "c++"
        if not any(shutil.which(c) for c in (cxx, "g++", "clang++")):
            return (
                "compile=true on a CPU: inductor builds C++ and no compiler was found (CXX, c++, g++, clang++); "
                "install one (e.g. apt install g++) or set compile=false"
            )
    return None


def check_compiler(compiler: Compiler | None, device: torch.device) -> None:
    """ConfigError (exit 2) when compile_refusal says no; nothing for compiler None (compile=false)."""
    if compiler is not None and (why := compile_refusal(compiler.backend, device)):
        raise ConfigError(why)


def inductor_cache_dir(environ=None) -> str | None:
    """Inductor's cache folder for this process: None (left as it is) where TORCHINDUCTOR_CACHE_DIR names
    a folder of the user's, else inductor's default, <tmp>/torchinductor_<user>, with the instruction set
    torch's CPU kernels run at appended (torch.backends.cpu.get_cpu_capability(), e.g.
    torchinductor_root_avx2). Inductor writes its default into the variable once it has looked, so that
    value counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    environ = os.environ if environ is None else environ
    default = os.path.abspath(default_cache_dir())
    given = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given and os.path.abspath(given) != default:
        return None
    return f"{default}_{torch.backends.cpu.get_cpu_capability().lower()}"


def _compiled_forward(layer: nn.Module, compiler: Compiler):
    """The layer's compiled forward for `compiler`, made once per layer (and again if the options change)."""
    made = _COMPILED.get(layer)
    if made is None or made[0] != compiler:
        if (folder := inductor_cache_dir()) is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        mode = None if compiler.mode == "default" else compiler.mode
        made = (compiler, torch.compile(layer.forward, backend=compiler.backend, mode=mode))
        _COMPILED[layer] = made
    return made[1]


@contextlib.contextmanager
def compiled(model: nn.Module, compiler: Compiler | None):
    """Within the context every decoder layer of `model` runs its compiled forward (module docstring);
    compiler None, or a model without known decoder layers, leaves the model as it is."""
    layers = decoder_layers(model) if compiler is not None else []
    installed = []
    try:
        for layer in layers:
            if "forward" in layer.__dict__:  # already swapped (a nested context): leave it
                continue
            layer.forward = _compiled_forward(layer, compiler)
            installed.append(layer)
        yield bool(layers)
    finally:
        for layer in installed:
            del layer.forward


__all__ = ["Compiler", "check_compiler", "compile_refusal", "compiled", "inductor_cache_dir"]
