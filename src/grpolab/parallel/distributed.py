"""Data-parallel training under torchrun: one process per device, each with a slice of the batch.

    torchrun --nproc_per_node 2 -m grpolab train recipes/demo.yaml out=runs/ddp

How the step stays exactly the single-process step on the global batch:
- Prompts: every rank draws the *global* step's prompts from the same (seed, step) generator and
  keeps its own contiguous slice of whole groups (disjoint, in the global order). Sampling randomness
  is per rank: the torch generator of rank r is seeded from (seed, step) + r (rank 0 as one process).
- Loss normalisers (n_seq, n_tok) count the global batch (`global_counts`), so each rank's loss is
  its share of the global loss and the *sum* of the ranks' gradients is the global-batch gradient.
- Gradients are summed across ranks with one all-reduce per optimizer update (`sum_gradients`),
  before clipping, so the clipped norm is the global norm and every rank applies the same update:
  the weights never diverge. (This is what DDP's reducer does; the step calls the model's backbone
  directly for the grouped prompt pass, which DDP's forward wrapper would not see, so the all-reduce
  is explicit.)
- Metrics are averaged over ranks (counts summed); only rank 0 writes files, evaluates and shows
  progress.

Not supported under more than one process (refused with a ConfigError): a critic (PPO: its advantage
whitening is a batch statistic), batch-level advantage baselines/scales (batch_mean, batch_std), DAPO's
dynamic sampling (a rank left with no informative group would wait for the others). Resuming needs the
world size the checkpoint was written with. fsdp=true shards the model instead of copying it to every
rank (FSDP2, grpolab.parallel.fsdp); the gradient sum is then FSDP's reduce-scatter, not `sum_gradients`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from grpolab.util.fields import ConfigError

COUNT_KEYS = (
    "reward/errors",
    "reward/timeouts",
    "dapo/groups_sampled",
    "dapo/groups_dropped",
    "dapo/groups_kept",
    "tokens/generated",
    "update/seqs_computed",
    "update/idle_passes",
)
"""Metrics that are totals over the batch: summed over ranks (every other metric is averaged)."""
COUNT_PREFIXES = ("env/errors_", "env/calls/", "env/reward_")
"""Families of counts: an environment's errors by kind, calls per tool, missing or failed rewards."""


def is_count(key: str) -> bool:
    """Whether a metric is a count (summed over ranks and resampling rounds) rather than a mean:
    COUNT_KEYS, the `.../none` counts of rewards that did not apply, and the COUNT_PREFIXES families."""
    return key in COUNT_KEYS or key.endswith("/none") or key.startswith(COUNT_PREFIXES)


@dataclass(frozen=True)
class Dist:
    """Where this process sits: rank r of `world` processes (world 1: a plain single-process run)."""

    rank: int = 0
    world: int = 1
    fsdp: bool = False
    """The model is sharded with FSDP2 (grpolab.parallel.fsdp): FSDP sums the gradients."""

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


SINGLE = Dist()


def from_environment(device_setting: str, fsdp: bool = False) -> Dist:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT);
    a plain process gets SINGLE. Backend: nccl on CUDA, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    import torch.distributed as dist

    if not dist.is_initialized():
        use_cuda = device_setting != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), fsdp=fsdp)


def check_supported(cfg, d: Dist) -> None:
    """ConfigError (exit 2) for what data parallelism does not support here, before anything is loaded."""
    if getattr(cfg, "fsdp", False) and not d.active:
        raise ConfigError(
            "fsdp: FSDP2 shards the model over the processes of a torchrun launch and this run has one "
            "process; launch it with `torchrun --nproc_per_node N -m grpolab train ... fsdp=true`, or "
            "drop fsdp=true"
        )
    if getattr(cfg, "fsdp", False) and getattr(getattr(cfg, "lora", None), "r", 0):
        raise ConfigError(
            "fsdp: FSDP2 sharding of a LoRA adapter run is not supported; set lora.r=0 or fsdp=false "
            "(an adapter run's trained weights are small: plain data parallelism suits it)"
        )
    check_vllm_processes(cfg, d)
    if not d.active:
        return
    algo = cfg.algo
    if algo.uses_critic:
        raise ConfigError(
            "algo.uses_critic: PPO's critic is not supported under torchrun (its advantage whitening "
            "is a batch statistic); run PPO in one process, or use a critic-free method (grpo, dapo, ...)"
        )
    if algo.dynamic_sampling:
        raise ConfigError(
            "algo.dynamic_sampling: DAPO's refill rounds are not supported under torchrun yet (a rank "
            "left with no informative group would wait for the others); set algo.dynamic_sampling=false"
        )
    if algo.advantage == "batch_mean" or algo.adv_scale == "batch_std":
        raise ConfigError(
            f"algo.advantage/adv_scale: batch-level statistics ({algo.advantage}, {algo.adv_scale}) "
            f"are not supported under torchrun; use a group-level estimator (group_zscore, rloo, ...)"
        )
    if (cfg.batch_size // cfg.G) % d.world:
        raise ConfigError(
            f"batch_size: {cfg.batch_size // cfg.G} prompts per step cannot be split over {d.world} "
            f"processes; use a multiple of {d.world * cfg.G} completions"
        )


def check_vllm_processes(cfg, d: Dist) -> None:
    """rollout.engine=vllm over processes: its tensor-parallel groups divide the launch, and the weights it
    is sent are whole (FSDP2 keeps each process's shard only)."""
    rollout = getattr(cfg, "rollout", None)
    if rollout is None or rollout.engine != "vllm":
        return
    tp = rollout.vllm_tensor_parallel_size
    if tp > 1 and d.world % tp:
        raise ConfigError(
            f"rollout.vllm_tensor_parallel_size={tp}: vLLM's tensor parallelism shards each vLLM over {tp} of "
            f"this launch's processes ({d.world}); launch `torchrun --nproc_per_node` with a multiple of {tp}, "
            "or set it to 1"
        )
    if d.active and getattr(cfg, "fsdp", False):
        raise ConfigError(
            "rollout.engine=vllm with fsdp=true: vLLM reloads the policy's whole weights after every step and "
            "FSDP2 keeps a shard in each process; use fsdp=false (data parallel replicas) with vLLM, or "
            "rollout.engine=native"
        )


def rank_slice(n_global: int, d: Dist) -> slice:
    """This rank's contiguous share of n_global items (n_global divisible by the world size)."""
    per = n_global // d.world
    return slice(d.rank * per, (d.rank + 1) * per)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def global_counts(d: Dist, *counts: float) -> list[float]:
    """Each count summed over the ranks (the same list on every rank)."""
    if not d.active:
        return list(counts)
    return _all_reduce(torch.tensor(counts, dtype=torch.float64)).tolist()


def global_max(d: Dist, x: float) -> float:
    """The largest x over the ranks (the same on every rank)."""
    if not d.active:
        return x
    import torch.distributed as dist

    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def sum_gradients(d: Dist, params) -> None:
    """grad <- sum over ranks of grad, for every parameter (None grads count as zeros), in one flat all-reduce.
    Under FSDP (d.fsdp) nothing: its reduce-scatter has already summed the sharded gradients."""
    if not d.active or d.fsdp:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    _all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def reduce_metrics(d: Dist, metrics: dict) -> dict:
    """Every numeric metric over the ranks that have it: the mean (the sum for counts, is_count); the same
    dict on every rank. (A rank that computed no micro-batch has no loss metrics: the mean is over the
    ranks that did.)"""
    if not d.active:
        return metrics
    import torch.distributed as dist

    mine = [k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"]
    every: list = [None] * d.world
    dist.all_gather_object(every, mine)
    keys = sorted(set().union(*every))
    values = torch.tensor([float(metrics.get(k, 0.0)) for k in keys], dtype=torch.float64)
    present = torch.tensor([1.0 if k in metrics else 0.0 for k in keys], dtype=torch.float64)
    total = _all_reduce(torch.stack([values, present]))
    out = dict(metrics)
    for k, v, n in zip(keys, total[0].tolist(), total[1].tolist()):
        out[k] = v if is_count(k) else v / max(n, 1.0)
    return out


def barrier(d: Dist) -> None:
    if d.active:
        import torch.distributed as dist

        dist.barrier()


__all__ = [
    "Dist",
    "SINGLE",
    "barrier",
    "check_supported",
    "from_environment",
    "global_counts",
    "global_max",
    "rank_slice",
    "reduce_metrics",
    "sum_gradients",
]
