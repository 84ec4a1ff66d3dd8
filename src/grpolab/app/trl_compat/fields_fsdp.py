"""TRL's fsdp and fsdp_config (transformers' TrainingArguments) -> grpolab's fsdp=true (FSDP2 under torchrun,
grpolab.parallel.fsdp; docs/distributed.md).

What transformers 5 does with them (TrainingArguments._process_fsdp_args, _apply_legacy_fsdp_to_config):
fsdp is True, or the legacy words "full_shard", "shard_grad_op", "offload", "auto_wrap" (a string or a
list), which become fsdp_config entries (full_shard: reshard_after_forward=True; shard_grad_op: False;
offload: cpu_offload=True; auto_wrap: nothing); no_shard, hybrid_shard and hybrid_shard_zero2 exist only
in FSDP1 and raise with version 2, the default. fsdp_config is a dict or a JSON file's path, its keys with or
without "fsdp_". accelerate shards only a multi-process launch: one process trains unsharded.

grpolab's FSDP2 is one configuration of those: every decoder layer one group, resharded after its forward
(full_shard, reshard_after_forward=True, the transformer-based wrap), the shards on the device, whole-model
checkpoints. What it honours is accepted; what asks for another configuration is refused by name; keys read
only by FSDP1 or by size-based wrapping are accepted with no effect, as transformers reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from grpolab.app.trl_compat.entries import Entry, fail
from grpolab.app.trl_compat.fields_model import NOTES

OPTIONS = ("full_shard", "auto_wrap")
"""fsdp words grpolab honours."""
REFUSED_OPTIONS = {
    "shard_grad_op": "keeps each layer's weights gathered from its forward to its backward "
    "(reshard_after_forward=False); grpolab's FSDP2 reshards each decoder layer after its forward (full_shard)",
    "offload": "offloads parameters and gradients to the CPU; grpolab keeps each rank's shard on its device",
    "no_shard": "an FSDP1 strategy (transformers refuses it with FSDP2, its default); use plain data parallelism "
    "(torchrun without fsdp)",
    "hybrid_shard": "an FSDP1 strategy (transformers refuses it with FSDP2, its default); grpolab shards over "
    "every process of the launch",
    "hybrid_shard_zero2": "an FSDP1 strategy (transformers refuses it with FSDP2, its default); grpolab shards over "
    "every process of the launch",
}
IGNORED_KEYS = {
    "min_num_params": "read by SIZE_BASED_WRAP only",
    "cpu_ram_efficient_loading": "grpolab loads the weights on the CPU in each process; the same weights",
    "forward_prefetch": "read by FSDP1 only",
    "backward_prefetch": "read by FSDP1 only",
    "use_orig_params": "read by FSDP1 only",
    "sync_module_states": "read by FSDP1 only",
    "limit_all_gathers": "read by FSDP1 only",
}
"""fsdp_config keys accepted with no effect on grpolab's sharding."""


def _true(v) -> bool:
    """transformers' str_to_bool(str(v).lower()) for the boolean keys."""
    return str(v).lower() in ("1", "true", "yes", "y", "on", "t")


def _options(v) -> list[str]:
    """The legacy words of `fsdp` (True: none)."""
    if v is True:
        return []
    words = v.split() if isinstance(v, str) else [str(getattr(x, "value", x)) for x in v]
    return [w for w in words if w.lower() not in ("true", "1")]


def _config(v) -> dict:
    """fsdp_config as a dict: None -> {}; a path -> its JSON; keys without their fsdp_ prefix."""
    if v is None:
        return {}
    if isinstance(v, (str, Path)):
        try:
            v = json.loads(Path(v).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise fail("fsdp_config", str(v), f"not a readable JSON file ({e})") from e
    if not isinstance(v, dict):
        raise fail("fsdp_config", v, "expected a dict or a JSON file's path")
    return {(k[5:] if k.startswith("fsdp_") else k): x for k, x in v.items()}


def _decoder_layers(x) -> bool:
    """Whether transformer_layer_cls_to_wrap names decoder layers only (None: the model's _no_split_modules)."""
    return x is None or all(str(n).endswith("DecoderLayer") for n in ([x] if isinstance(x, str) else x))


CHECKS = {
    "version": (lambda x: int(x) == 2, "grpolab shards with FSDP2 (fully_shard); FSDP1 (version 1) is not available"),
    "reshard_after_forward": (_true, REFUSED_OPTIONS["shard_grad_op"]),
    "cpu_offload": (lambda x: not _true(x), REFUSED_OPTIONS["offload"]),
    "state_dict_type": (
        lambda x: str(x).upper().rsplit(".", 1)[-1] == "FULL_STATE_DICT",
        "grpolab's checkpoints are whole models (FULL_STATE_DICT), written by rank 0",
    ),
    "auto_wrap_policy": (
        lambda x: str(x).upper() == "TRANSFORMER_BASED_WRAP",
        "grpolab makes each decoder layer one FSDP group (TRANSFORMER_BASED_WRAP)",
    ),
    "transformer_layer_cls_to_wrap": (
        _decoder_layers,
        "grpolab makes each decoder layer one FSDP group (a *DecoderLayer class, as transformers' "
        "_no_split_modules names them)",
    ),
    "activation_checkpointing": (lambda x: True, ""),
}
"""fsdp_config key -> (whether grpolab's FSDP2 honours the value, why not)."""


def _check_key(key: str, x) -> None:
    """One fsdp_config entry: nothing where grpolab honours it (or it has no effect); ConfigError naming the key
    where grpolab's FSDP2 cannot do what it asks."""
    if key in IGNORED_KEYS:
        return
    if key.startswith("xla"):
        if x:
            raise fail(f"fsdp_config.{key}", x, "PyTorch/XLA FSDP is not available; grpolab runs on CUDA or the CPU")
        return
    if key not in CHECKS:
        known = ", ".join([*CHECKS, *IGNORED_KEYS, "xla..."])
        raise fail(f"fsdp_config.{key}", x, f"not a key of transformers' fsdp_config ({known})")
    ok, reason = CHECKS[key]
    if not ok(x):
        raise fail(f"fsdp_config.{key}", x, reason)


def fsdp_setting(v, a: dict) -> dict:
    """fsdp and fsdp_config of TRL fields `a` -> {"fsdp": True} under torchrun (WORLD_SIZE > 1), with
    grad_checkpointing for activation_checkpointing; {} when fsdp is off (fsdp_config is then not read, as in
    transformers) and, in one process, a note: accelerate shards nothing there (nor checkpoints for
    activation_checkpointing: gradient_checkpointing decides). Refused values raise in one process too."""
    if not v:
        return {}
    for word in _options(v):
        if word in REFUSED_OPTIONS:
            raise fail("fsdp", word, REFUSED_OPTIONS[word])
        if word not in OPTIONS:
            raise fail("fsdp", word, f"not an fsdp option of transformers ({', '.join([*OPTIONS, *REFUSED_OPTIONS])})")
    config = _config(a["fsdp_config"])
    for key, x in config.items():
        _check_key(key, x)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return {
            NOTES: ["fsdp: one process, nothing to shard (accelerate trains it unsharded too); launch with torchrun"]
        }
    if not _true(config.get("activation_checkpointing", False)):
        return {"fsdp": True}
    if a.get("gradient_checkpointing"):
        raise fail(
            "fsdp_config.activation_checkpointing",
            config["activation_checkpointing"],
            "with gradient_checkpointing=True too (TRL's default): transformers' Trainer refuses both under FSDP; "
            "set gradient_checkpointing=False (grpolab then checkpoints each decoder layer for this one)",
        )
    return {"fsdp": True, "grad_checkpointing": True}


FSDP_FIELDS: list[Entry] = [
    Entry(
        "fsdp",
        None,
        "map",
        "fsdp, grad_checkpointing",
        fsdp_setting,
        "True, full_shard, auto_wrap (and fsdp_config's FSDP2 keys it honours: version 2, reshard_after_forward, "
        "the transformer-based wrap, FULL_STATE_DICT) -> fsdp=true under torchrun (one process: unsharded, as "
        "accelerate); shard_grad_op, offload (cpu_offload), FSDP1's hybrid_shard/no_shard, SHARDED_STATE_DICT, "
        "size-based wrapping, XLA refused by name.",
    ),
    Entry(
        "fsdp_config",
        None,
        "map",
        "fsdp, grad_checkpointing",
        lambda v, a: {},
        "Read with fsdp (a dict or a JSON file, keys with or without fsdp_); activation_checkpointing=True -> "
        "grad_checkpointing=true (with gradient_checkpointing=False, as transformers requires); FSDP1-only keys "
        "and cpu_ram_efficient_loading accepted with no effect.",
    ),
]
"""The two entries, in TRL's order (grpolab.app.trl_compat.fields_hf places them)."""

__all__ = ["FSDP_FIELDS", "fsdp_setting"]
