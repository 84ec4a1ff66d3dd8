"""Continuing a run: its newest good checkpoint loaded into the run (resume_state), where its rows continue
(data_shift: ignore_data_skip), and one line of OUT/restarts.jsonl per continuation (`--resume`, resume=auto,
a torchrun restart; record_restart)."""

from __future__ import annotations

import json
import os
import time

from grpolab.parallel import distributed
from grpolab.parallel import fsdp as sharding
from grpolab.training.run import Run
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import read_jsonl

RESTARTS = "restarts.jsonl"


def resume_state(run: Run, how: str = "--resume") -> int:
    """Load the newest checkpoint of run.out that verifies against its manifest (components included;
    a damaged newer one is skipped with a message naming the bad file; a model-only one is refused); returns
    its step (0 if none). Sets run.data_shift (ignore_data_skip). Rank 0 records the continuation in
    OUT/restarts.jsonl (record_restart)."""
    from grpolab.training.checkpoint import latest_good_checkpoint, load_checkpoint

    ck = latest_good_checkpoint(run.out, log=run.log)
    if ck is None:
        record_restart(run, 0, None, how)
        return 0
    policy, optimizer = sharding.load_views(run)  # FSDP: the full states are sharded into the run's
    state = load_checkpoint(ck, policy, optimizer, run.scheduler, components=run.components)
    world = (run.dist or distributed.SINGLE).world
    if int(state.get("world_size", 1)) != world:
        raise ConfigError(
            f"--resume {run.out}: {ck.name} was written by {state.get('world_size', 1)} processes and "
            f"this run has {world}; resume with the same number (torchrun --nproc_per_node "
            f"{state.get('world_size', 1)}): each rank's share of the batch depends on it"
        )
    if run.kl.adaptive and "kl_beta" in state:
        run.kl.value = state["kl_beta"]
    step = int(state["step"])
    run.data_shift = data_shift(run, step, int(state.get("data_shift", 0)))
    record_restart(run, step, ck.name, how)
    return step


def data_shift(run: Run, step: int, saved: int) -> int:
    """How many rows the epochs' sequence of rows is moved back by after `step` (step s takes the rows from
    (s - 1) x P - shift on, P = batch_size / G x processes; grpolab.training.step.collect): `saved`, an earlier
    continuation's, and with ignore_data_skip in a run over epochs also the rows of the current epoch trained
    so far, so that it starts again from its first row (transformers' Trainer on resume with ignore_data_skip:
    the epoch's dataloader from its first batch): shift' = shift + (step x P - shift) mod R, R the rows."""
    cfg = run.cfg
    if not (cfg.ignore_data_skip and cfg.num_train_epochs is not None and hasattr(run.task, "epoch_rows")):
        return saved
    rows = len(run.task)
    position = step * (cfg.batch_size // cfg.G) * run.ranks.world - saved
    return saved + position % rows if rows else saved


def record_restart(run, step: int, checkpoint: str | None, how: str) -> None:
    """One line of OUT/restarts.jsonl (rank 0) per continuation of a run: the step it continues after,
    the checkpoint, the time, how it was continued, torchrun's restart count when under torchrun, the
    steps that had been logged after that checkpoint and are trained again, and the cause where known."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    # the largest over the ranks (every rank calls this): after a lost host, the new host's agent counts from 0
    highest = distributed.global_max(run.ranks, float(count) if count and count.isdigit() else -1.0)
    if not run.ranks.main:
        return
    restart = int(highest) if highest >= 0 else None
    logged = (
        [r.get("step") for r in read_jsonl(run.out / "metrics.jsonl")] if (run.out / "metrics.jsonl").exists() else []
    )
    redone = sorted(x for x in logged if isinstance(x, int) and x > step)
    cause = (
        f"torchrun restarted the workers (restart {restart} of at most "
        f"{os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}): a worker of the previous attempt failed or was lost"
        if restart
        else "the same command was run again (resume=auto): a relaunched or requeued job"
        if how == "resume=auto"
        else None
    )
    record = {
        "step": step,
        "checkpoint": checkpoint,
        "time": time.time(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "how": how,
        "torchelastic_restart_count": restart,
        "world_size": run.ranks.world,
        "steps_redone": redone,
        "cause": cause,
    }
    with open(run.out / RESTARTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


__all__ = ["RESTARTS", "data_shift", "record_restart", "resume_state"]
