"""TRL counts optimizer steps, grpolab generations (one rollout batch and its updates): the conversion of
TRL's step counts (max_steps, warmup_steps, eval_steps, save_steps, eval_delay) for the mapping table."""

from __future__ import annotations

import os

from grpolab.app.trl_compat.entries import fail


def num_processes() -> int:
    """The processes of the run, as TRL's GRPOConfig counts them (its world_size): torchrun's WORLD_SIZE, else 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def global_batch(a: dict) -> int:
    """TRL's global batch of one micro-step: per_device_train_batch_size x num_processes completions."""
    return int(a["per_device_train_batch_size"]) * num_processes()


def generation_split(a: dict) -> tuple[int, int]:
    """(TRL's steps_per_generation, grpolab's algo.steps_per_generation) of TRL fields `a`, as TRL's
    GRPOConfig.__post_init__ settles them: both None -> steps_per_generation = gradient_accumulation_steps;
    generation_batch_size = per_device_train_batch_size x num_processes x steps_per_generation (global).
    grpolab's counts optimizer updates per rollout: TRL's / gradient_accumulation_steps."""
    accum, per_step = int(a["gradient_accumulation_steps"]), global_batch(a)
    spg, gbs = a["steps_per_generation"], a["generation_batch_size"]
    if gbs is not None:
        if int(gbs) % per_step:
            raise fail(
                "generation_batch_size",
                gbs,
                f"must be a multiple of the global batch per_device_train_batch_size x processes = {per_step}",
            )
        if spg is not None and int(spg) * per_step != int(gbs):
            raise fail("generation_batch_size", gbs, f"give it or steps_per_generation={spg}, not both")
        spg = int(gbs) // per_step
    spg = accum if spg is None else int(spg)
    if spg < 1 or spg % accum:
        raise fail(
            "steps_per_generation",
            spg,
            f"grpolab splits a generation batch into whole optimizer updates: "
            f"give a multiple of gradient_accumulation_steps={accum}",
        )
    return spg, spg // accum


def updates_per_step(a: dict) -> int:
    """TRL optimizer steps per grpolab step (one generation): num_iterations x grpolab's
    algo.steps_per_generation (TRL generates every steps_per_generation x num_iterations micro-steps)."""
    return int(a["num_iterations"]) * generation_split(a)[1]


def to_steps(name: str, v, a: dict) -> int:
    """TRL's optimizer steps (max_steps, warmup_steps, eval_steps, save_steps) -> grpolab's steps (rollouts)."""
    per = updates_per_step(a)
    if int(v) % per:
        raise fail(
            name,
            v,
            f"TRL counts optimizer steps, {per} per generation here (num_iterations x "
            f"steps_per_generation / gradient_accumulation_steps); grpolab counts generations: "
            f"give a multiple of {per}",
        )
    return int(v) // per


__all__ = ["generation_split", "global_batch", "num_processes", "to_steps", "updates_per_step"]
