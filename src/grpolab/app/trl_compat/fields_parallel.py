"""TRL's parallelism_config (transformers' TrainingArguments; accelerate's ParallelismConfig) -> grpolab's
processes under torchrun: data parallel, sharded with FSDP2 when fsdp is set (docs/distributed.md).

What accelerate 1.16 does with it (Accelerator.__init__, ParallelismConfig._validate_accelerator, build_device_mesh):
the sizes (None: 1) multiply to total_size = dp_replicate x dp_shard x tp x cp x sp. One process with
total_size 1 is left alone; total_size 1 under a launch of N processes becomes dp_replicate = N (plain data
parallelism); any other total_size must equal the number of processes, else accelerate raises. The mesh's
dp_shard dimension is the one FSDP2 shards over ("dp_shard_cp"; with dp_replicate > 1 as well, HSDP: shards
within a group, replicas across groups); FSDP itself comes from the fsdp field, and with it a config with no
dp_shard (and no cp) raises. Without fsdp the processes are DDP replicas whatever the dp dimensions say.
TRL's GRPOConfig refuses cp_size > 1 and sp_size > 1 itself.

grpolab's processes are one data-parallel group, sharded over all of them with fsdp=true: that is
dp_replicate = N without fsdp, or dp_shard = N with it. Tensor, context and sequence parallelism and HSDP's
two-level mesh have no counterpart and are refused by name.
"""

from __future__ import annotations

import math

from grpolab.app.trl_compat.entries import Entry, fail
from grpolab.app.trl_compat.fields_model import NOTES
from grpolab.app.trl_compat.steps import num_processes

NO_COUNTERPART = {
    "tp_size": "tensor parallelism (each layer's weights split across processes); grpolab has none: its processes "
    "are data parallel, sharded with fsdp",
    "cp_size": "context parallelism; GRPOTrainer refuses it too (TRL's GRPOConfig: GRPO builds the model's "
    "inputs after generation), and grpolab has none",
    "sp_size": "sequence parallelism; GRPOTrainer refuses it too (TRL's GRPOConfig: GRPO builds the model's "
    "inputs after generation), and grpolab has none",
}
"""The sizes grpolab refuses above 1, and why."""


def sizes(v) -> dict[str, int]:
    """A ParallelismConfig's (or a dict of its fields') sizes, None read as accelerate's __post_init__ reads it (1,
    unless its PARALLELISM_CONFIG_* environment variable says otherwise)."""
    if isinstance(v, dict):
        from accelerate.parallelism_config import ParallelismConfig

        v = ParallelismConfig(**v)
    names = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
    return {n: int(getattr(v, n)) for n in names}


def total_size(s: dict[str, int]) -> int:
    """accelerate's total_size = dp_replicate x dp_shard x tp x cp x sp."""
    return math.prod(s.values())


def parallelism_setting(v, a: dict) -> dict:
    """parallelism_config (with the fsdp field of TRL fields `a`) -> grpolab settings, as accelerate applies it:

    None, or total_size 1             -> {} (every process data parallel)
    tp/cp/sp > 1                      -> refused by name
    total_size != processes           -> accelerate's error
    fsdp set:   dp_shard = N          -> {} (fsdp gives fsdp=true: sharded over all N)
                dp_shard = 1          -> accelerate's error (no dimension to shard across)
                dp_replicate, dp_shard > 1 -> refused (HSDP)
    fsdp unset: dp_replicate/dp_shard -> {} (DDP replicas, as accelerate; a note where dp_shard > 1)"""
    if v is None:
        return {}
    s = sizes(v)
    for name, why in NO_COUNTERPART.items():
        if s[name] > 1:
            raise fail(f"parallelism_config.{name}", s[name], why)
    total, n = total_size(s), num_processes()
    if total == 1:
        return {}
    if total != n:
        raise fail(
            "parallelism_config",
            s,
            f"ParallelismConfig total_size ({total}) does not match num_processes ({n}) (accelerate's check); "
            f"adjust dp_replicate_size/dp_shard_size to multiply to torchrun's --nproc_per_node x --nnodes",
        )
    replicate, shard = s["dp_replicate_size"], s["dp_shard_size"]
    if a.get("fsdp"):
        if shard == 1:
            raise fail(
                "parallelism_config",
                s,
                "fsdp is set but the config has no dimension for FSDP to shard across (dp_shard_size and cp_size "
                "are 1), as accelerate refuses it; set dp_shard_size to the number of processes",
            )
        if replicate > 1:
            raise fail(
                "parallelism_config",
                s,
                f"dp_replicate_size={replicate} x dp_shard_size={shard} is HSDP (sharded within groups, replicated "
                f"across them); grpolab's fsdp shards over every process: set dp_shard_size={n}, dp_replicate_size=1",
            )
        return {}
    if shard > 1:
        return {
            NOTES: [
                f"parallelism_config: dp_shard_size={shard} without fsdp: accelerate shards only with fsdp (its FSDP2 "
                "plugin), so the processes are plain data parallel, here as there; fsdp=full_shard to shard"
            ]
        }
    return {}


PARALLELISM_FIELD = Entry(
    "parallelism_config",
    None,
    "map",
    "fsdp",
    parallelism_setting,
    "accelerate's ParallelismConfig as accelerate applies it: its sizes must multiply to the number of processes "
    "(else accelerate's error; a product of 1 is plain data parallelism over all of them); dp_replicate_size = N "
    "is grpolab's data parallelism; dp_shard_size = N with fsdp is fsdp=true (FSDP2 over all N), without fsdp the "
    "processes stay DDP replicas, as in accelerate (a note says so). Refused by name: tp_size, cp_size, sp_size "
    "> 1 (no tensor, context or sequence parallelism; TRL refuses cp and sp for GRPO itself) and HSDP "
    "(dp_replicate_size and dp_shard_size both > 1 with fsdp).",
)
"""The entry, in TRL's order (grpolab.app.trl_compat.fields_hf places it)."""

__all__ = ["PARALLELISM_FIELD", "parallelism_setting"]
