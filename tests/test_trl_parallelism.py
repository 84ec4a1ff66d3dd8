"""TRL's parallelism_config (accelerate's ParallelismConfig) as accelerate 1.16 applies it, checked against
accelerate's own checks (ParallelismConfig._validate_accelerator on an accelerator of the same launch) and TRL's
GRPOConfig: sizes that multiply to 1 or to the number of processes, dp_replicate = N (data parallel), dp_shard = N
with fsdp (fsdp=true), HSDP, tensor/context/sequence parallelism refused by name."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from grpolab import GRPOConfig
from grpolab.app.trl_compat import trl_recipe
from grpolab.app.trl_compat.fields_parallel import parallelism_setting
from grpolab.util.fields import ConfigError

accelerate = pytest.importorskip("accelerate")
from accelerate.parallelism_config import ParallelismConfig  # noqa: E402


def accelerate_check(pc: ParallelismConfig, n: int, fsdp: bool) -> str | None:
    """accelerate's verdict on `pc` for a GPU launch of n processes (multi_device), FSDP2 or DDP: None or its error."""
    fake = SimpleNamespace(
        multi_device=n > 1, num_processes=n, is_fsdp2=fsdp, distributed_type="MULTI_GPU", is_main_process=True
    )
    try:
        copy.deepcopy(pc)._validate_accelerator(fake)
    except ValueError as e:
        return str(e)
    return None


def grpolab(pc, n: int, fsdp: bool, monkeypatch) -> dict:
    monkeypatch.setenv("WORLD_SIZE", str(n))
    return parallelism_setting(pc, {"fsdp": "full_shard" if fsdp else None})


@pytest.mark.parametrize(
    "sizes, n, fsdp, expected",
    [
        ({}, 1, False, {}),  # all None: accelerate's sizes 1
        ({}, 2, False, {}),  # total 1 under a launch: dp_replicate = N
        ({"dp_replicate_size": 2}, 2, False, {}),  # plain data parallelism
        ({"dp_shard_size": 2}, 2, True, {}),  # FSDP over both (the fsdp field gives fsdp=true)
        ({"dp_shard_size": 2, "dp_replicate_size": 1}, 2, True, {}),
    ],
)
def test_what_accelerate_accepts_maps(sizes, n, fsdp, expected, monkeypatch):
    pc = ParallelismConfig(**sizes)
    assert accelerate_check(pc, n, fsdp) is None
    assert grpolab(pc, n, fsdp, monkeypatch) == expected


@pytest.mark.parametrize(
    "sizes, n, fsdp, words",
    [
        ({"dp_shard_size": 4}, 2, True, "total_size (4) does not match num_processes (2)"),
        ({"dp_replicate_size": 2}, 1, False, "total_size (2) does not match num_processes (1)"),
        ({"dp_replicate_size": 2}, 2, True, "no dimension for FSDP to shard across"),
    ],
)
def test_what_accelerate_refuses_is_refused_with_its_reason(sizes, n, fsdp, words, monkeypatch):
    pc = ParallelismConfig(**sizes)
    theirs = accelerate_check(pc, n, fsdp)
    assert theirs is not None and words.split(" (")[0] in theirs.replace("`", "")
    with pytest.raises(ConfigError, match=r"parallelism_config=") as e:
        grpolab(pc, n, fsdp, monkeypatch)
    assert words in str(e.value)


def test_dp_shard_without_fsdp_stays_data_parallel_with_a_note(monkeypatch):
    """accelerate shards only with its FSDP2 plugin: dp_shard_size alone leaves DDP replicas (no error on a GPU)."""
    pc = ParallelismConfig(dp_shard_size=2)
    assert accelerate_check(pc, 2, fsdp=False) is None
    out = grpolab(pc, 2, False, monkeypatch)
    assert list(out) == ["__notes__"] and "accelerate shards only with fsdp" in out["__notes__"][0]


def test_hsdp_and_model_parallelism_are_refused_by_name(monkeypatch):
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert accelerate_check(hsdp, 4, fsdp=True) is None  # accelerate runs it; grpolab has no two-level mesh
    with pytest.raises(ConfigError, match="HSDP"):
        grpolab(hsdp, 4, True, monkeypatch)
    for name in ("tp_size", "cp_size", "sp_size"):
        with pytest.raises(ConfigError, match=rf"parallelism_config\.{name}=2: "):
            grpolab(ParallelismConfig(**{name: 2}), 2, False, monkeypatch)


def test_trl_refuses_context_and_sequence_parallelism_itself_and_the_table_maps(tmp_path, monkeypatch):
    trl = pytest.importorskip("trl")
    with pytest.raises(ValueError, match="does not support sequence-dim parallelism"):
        trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, parallelism_config=ParallelismConfig(cp_size=2))
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = GRPOConfig(
        fsdp="full_shard", parallelism_config=ParallelismConfig(dp_shard_size=2), per_device_train_batch_size=4
    )
    assert trl_recipe(args)[0]["fsdp"] is True
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match=r"parallelism_config\.tp_size=2"):
        trl_recipe(GRPOConfig(parallelism_config=ParallelismConfig(tp_size=2)))
