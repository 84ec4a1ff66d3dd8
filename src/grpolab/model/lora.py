"""LoRA through peft: train a low-rank adapter instead of every weight (`lora.r > 0`).

    W x  ->  W x + (alpha / r) * B A x        A (r, in), B (out, r); B starts at 0, so step 0 is the base model

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models". Only A and B of each targeted
linear layer are trained (and get AdamW state); the base weights stay frozen, bit for bit. What a LoRA
run changes elsewhere:

  * the reference pi_ref (algo.beta > 0) is the policy itself with its adapter off
    (grpolab.model.reference.AdapterOff), so the weights are held once;
  * a checkpoint holds the adapter (adapter_config.json + adapter_model.safetensors), not the model;
    grpolab.model.load.load_policy loads such a directory onto its base model, so `grpolab eval RUN` and
    `grpolab chat RUN` work on it as on any checkpoint;
  * `grpolab export RUN --merged OUT` (grpolab.app.export) writes the merged weights as a plain model;
    an inference engine (grpolab.engine.vllm_engine) is sent them after each step (merged_weights).

This module is a leaf: it imports only grpolab.batch at the top, and torch and peft (the optional
`lora` extra) inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path

from grpolab.util.fields import ConfigError

INSTALL = "pip install 'grpolab[lora]'"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class LoraConfig:
    """The `lora.*` keys of a recipe; r = 0 (the default) trains every weight."""

    r: int = 0
    """LoRA rank: 0 trains every weight (full fine-tuning); r > 0 trains only a rank-r adapter (peft), e.g. lora.r=16."""
    alpha: float = 32.0
    """LoRA alpha: the adapter's update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input in the training passes (rollouts run without it), in [0, 1)."""
    target_modules: str | list[str] = "all-linear"
    """Layers that get an adapter: all-linear (every linear layer but the LM head), or module names as a list or comma-separated (q_proj,v_proj)."""

    @property
    def enabled(self) -> bool:
        return self.r > 0

    def targets(self) -> str | list[str]:
        """target_modules as peft takes it: the string all-linear, or a list of module names."""
        t = self.target_modules
        if isinstance(t, str):
            return t if t == "all-linear" else [s.strip() for s in t.split(",") if s.strip()]
        return [str(s) for s in t]


def validate_lora(lora: LoraConfig) -> None:
    """ConfigError (exit 2) naming the key for an impossible value, or for r > 0 without peft."""
    if lora.r < 0:
        raise ConfigError(f"lora.r: must be >= 0 (0 = full fine-tuning, e.g. lora.r=16 for an adapter), got {lora.r}")
    if not lora.enabled:
        return
    if lora.alpha <= 0:
        raise ConfigError(f"lora.alpha: must be > 0 (the update is scaled by alpha / r; try lora.alpha={2 * lora.r})")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"lora.dropout: must be in [0, 1), got {lora.dropout}")
    targets = lora.targets()
    if not targets or (isinstance(targets, list) and not all(targets)):
        raise ConfigError(
            "lora.target_modules: name at least one layer, e.g. lora.target_modules=all-linear or "
            "lora.target_modules=q_proj,v_proj"
        )
    require_peft("lora.r")


def require_peft(key: str = "lora.r"):
    """The peft package, or a ConfigError saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ConfigError(f"{key}: LoRA needs the peft package, which is not installed: {INSTALL}") from None
    return peft


def is_peft(model) -> bool:
    """True for a peft wrapper (PeftModel): the policy of a LoRA run, or a loaded adapter checkpoint."""
    import sys

    peft = sys.modules.get("peft")  # never imported: nothing can be a PeftModel
    return peft is not None and isinstance(model, peft.PeftModel)


def is_adapter_dir(path: Path) -> bool:
    """A directory holding a peft adapter (a LoRA checkpoint) rather than a whole model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base_path(path: Path) -> str:
    """base_model_name_or_path of an adapter directory (where it was trained from), as recorded by peft."""
    import json

    data = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    return str(data.get("base_model_name_or_path") or "")


def attach(policy, lora: LoraConfig):
    """The policy to train. A loaded adapter (model= a LoRA checkpoint) is merged into its base first;
    then, when lora.r > 0, a fresh adapter is wrapped around it (peft.get_peft_model) and only its
    weights require gradients. With lora.r = 0 the model comes back as it is (a loaded adapter merged)."""
    if is_peft(policy):
        if lora.enabled:  # the new adapter's base would be base + old adapter, which no directory holds
            raise ConfigError(
                "lora.r: model= is a LoRA checkpoint; a new adapter needs a plain base model. Merge it "
                "first (grpolab export RUN --merged DIR), then train with model=DIR"
            )
        policy = policy.merge_and_unload()
        policy.requires_grad_(True)  # loaded for inference: every weight was frozen
    if not lora.enabled:
        return policy
    peft = require_peft()
    spec = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.targets(),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with _quiet_peft():
            model = peft.get_peft_model(policy, spec)
    except ValueError as e:  # "Target modules {...} not found in the base model"
        raise ConfigError(
            f"lora.target_modules: {e}. Use all-linear, or names of linear layers of this model "
            f"(for Llama-style models: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)"
        ) from e
    model.train()
    return model


def load_adapter(path: Path, base):
    """The adapter saved in `path` on top of the loaded base model (frozen: for evaluation and chat)."""
    peft = require_peft("model")
    with _quiet_peft():
        return peft.PeftModel.from_pretrained(base, str(path), is_trainable=False)


@contextlib.contextmanager
def _quiet_peft():
    """peft 0.21 asks transformers 5 a deprecated question (`is_gradient_checkpointing`): not the user's concern."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def trainable_parameters(model) -> list:
    """The parameters the optimizer updates: those that require gradients (only the adapter's under LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


__all__ = [
    "INSTALL",
    "LoraConfig",
    "adapter_base_path",
    "attach",
    "is_adapter_dir",
    "is_peft",
    "load_adapter",
    "merged_weights",
    "require_peft",
    "trainable_parameters",
    "validate_lora",
]


def merged_weights(model) -> dict:
    """The weights an inference engine should serve, under the plain model's names: the model's own
    state, or under LoRA each adapted weight with its update merged in, W + (alpha / r) B A
    (peft's get_delta_weight), computed aside: the policy's base weights are not touched (merging
    in place and back would round them)."""
    import torch

    with torch.no_grad():
        return _merged(model)


def _merged(model) -> dict:
    if not is_peft(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = {k.replace(".base_layer.", "."): v.detach() for k, v in base.state_dict().items() if "lora_" not in k}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not getattr(module, "merged", False):
            key = f"{name}.weight"
            w = out[key]
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    w = w + module.get_delta_weight(adapter).to(w.dtype)
            out[key] = w
    return out
