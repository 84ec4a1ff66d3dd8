"""GRPOTrainer's constructor arguments, checked and mapped as TRL checks them: reward functions -> grpolab
reward specs (reward_specs), peft's LoraConfig -> lora.* (lora_settings), `model=` a name, directory or
model object -> the module and tokenizer the run trains in place (policy_of)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError

PEFT_FIELDS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout"}
PEFT_DEFAULTS = {
    "bias": "none",
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "layers_to_transform": None,
    "init_lora_weights": True,
}


def reward_specs(reward_funcs: Any, weights: list[float] | None, processing_classes: Any = None) -> list[dict]:
    """reward_funcs -> grpolab reward specs: functions, grpolab reward names, reward models (a local
    directory or a loaded model, with reward_processing_classes); a hub id is refused
    (grpolab.app.trl_compat.rewards)."""
    from grpolab.app.trl_compat.rewards import reward_specs

    return reward_specs(reward_funcs, weights, processing_classes)


def check_peft(peft_config: Any) -> None:
    """A peft config grpolab trains: a plain LoraConfig (ConfigError naming the field otherwise)."""
    if type(peft_config).__name__ != "LoraConfig":
        raise ConfigError(f"peft_config: refused: grpolab trains LoRA adapters only, got {type(peft_config).__name__}")
    for key, default in PEFT_DEFAULTS.items():
        if (
            getattr(peft_config, key, default) not in (default, None, False)
            and getattr(peft_config, key, default) != default
        ):
            raise ConfigError(
                f"peft_config.{key}={getattr(peft_config, key)!r}: refused: grpolab's adapter is "
                f"plain LoRA ({key}={default!r})"
            )


def lora_settings(peft_config: Any, model_path: str | None, wrapped: Any = None) -> dict:
    """peft's LoraConfig -> grpolab's lora.* (target_modules None: the modules peft chose for `wrapped`, the
    peft model made of it, else peft's default for the model type)."""
    if peft_config is None:
        return {}
    check_peft(peft_config)
    out = {dst: getattr(peft_config, src) for src, dst in PEFT_FIELDS.items()}
    targets = peft_config.target_modules
    if targets is None and wrapped is not None:
        targets = wrapped.peft_config["default"].target_modules
    if targets is None:
        targets = _peft_default_targets(model_path)
    out["target_modules"] = targets if isinstance(targets, str) else sorted(targets)
    return out


def _peft_default_targets(model_path: str | None) -> list[str]:
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    kind = None
    if model_path is not None and (Path(model_path) / "config.json").exists():
        kind = json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    if kind not in DEFAULTS:
        raise ConfigError(
            "peft_config.target_modules: None means peft's default for the model type, which grpolab "
            "cannot tell for this model; name the modules (e.g. 'all-linear')"
        )
    return list(DEFAULTS[kind])


def model_name(model: Any) -> str:
    """The last part of a model's name or directory (TRL's default output_dir is NAME-GRPO)."""
    if isinstance(model, (str, Path)):
        return Path(str(model)).name
    return str(getattr(getattr(model, "config", None), "_name_or_path", "model")).rstrip("/").split("/")[-1]


def source_of(model: Any) -> str:
    """What config.yaml records as `model`: the name or directory given, or the directory (or hub id) a model
    object was loaded from (its config's _name_or_path)."""
    if isinstance(model, (str, Path)):
        return str(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return str(getattr(getattr(base, "config", None), "_name_or_path", "") or "model-object")


def policy_of(model: Any, processing_class: Any):
    """(module, tokenizer) of TRL's model= and processing_class=: a name or directory is loaded here (fp32, on
    the CPU; grpolab.model.load), its tokenizer too unless processing_class is given; an object is kept as it
    is (the run trains it in place), its tokenizer without processing_class loaded from the local directory
    the object was loaded from (its config's _name_or_path), as TRL does."""
    from grpolab.model.load import load_policy, load_tokenizer, model_dir

    if isinstance(model, (str, Path)):
        import torch

        path = model_dir(str(model), log=lambda *_: None)
        tok = processing_class if processing_class is not None else load_tokenizer(path)
        return load_policy(path, torch.device("cpu")), tok
    if not (hasattr(model, "generate") and hasattr(model, "parameters")):
        raise ConfigError(
            f"model: expected a model name or directory, or a transformers causal LM (or a peft model of "
            f"one), got {type(model).__name__}"
        )
    if processing_class is None:  # TRL: AutoTokenizer.from_pretrained of the name the model was loaded from
        where = source_of(model)
        if not Path(where).is_dir():
            raise ConfigError(
                f"processing_class: the model object was loaded from {where!r}, not a local directory, so its "
                f"tokenizer cannot be loaded from there (grpolab never downloads); pass processing_class=tokenizer"
            )
        return model, load_tokenizer(model_dir(where, log=lambda *_: None))
    return model, processing_class


def wrap_peft(model: Any, peft_config: Any):
    """TRL's peft_config on a plain model: peft.get_peft_model(model, peft_config), the adapter alone trained;
    the model object becomes the adapter's base, in place."""
    if peft_config is None:
        return model
    if hasattr(model, "peft_config"):
        raise ConfigError("peft_config: the model is a peft model already; give one or the other")
    from peft import get_peft_model

    return get_peft_model(model, peft_config)


def wrapped_targets(model: Any, peft_config: Any):
    """The peft model whose chosen target modules lora_settings records (None without peft_config)."""
    return model if peft_config is not None else None


def reference_model(model, beta: float):
    """TRL's trainer.ref_model: None when beta == 0.0 (no KL term) or for a peft model (its reference is the
    same network with the adapter off); else a frozen copy of the model's weights as given (TRL loads the same
    weights again from the model's directory), which the run then uses as its reference
    (grpolab.model.reference.FrozenCopy): the object the trainer holds is the one the KL term reads."""
    from grpolab.model.load import frozen_copy
    from grpolab.model.lora import is_peft

    if beta == 0.0 or is_peft(model):
        return None
    return frozen_copy(model)


__all__ = [
    "check_peft",
    "lora_settings",
    "model_name",
    "policy_of",
    "reference_model",
    "reward_specs",
    "source_of",
    "wrap_peft",
    "wrapped_targets",
]
