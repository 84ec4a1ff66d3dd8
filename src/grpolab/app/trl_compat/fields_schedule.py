"""TRL's lr_scheduler_type and lr_scheduler_kwargs in grpolab's terms: transformers' schedules by name, with
their options checked against the schedule (grpolab.algo.schedules) before anything runs."""

from __future__ import annotations

import json

from grpolab.app.trl_compat.entries import fail, value_of

NEEDS_A_METRIC = {
    "reduce_lr_on_plateau": "it lowers the lr when an evaluation metric stops improving",
    "greedy": "it adapts the lr to the training loss step by step",
}
"""transformers' schedules grpolab does not have: not a function of the update's index."""


def scheduler(v, a) -> dict:
    from grpolab.algo.schedules import SCHEDULES

    v = value_of(v)
    if v in NEEDS_A_METRIC:
        raise fail(
            "lr_scheduler_type", v, f"grpolab's schedules are functions of the update's index; {NEEDS_A_METRIC[v]}"
        )
    if v not in SCHEDULES or v == "warmup_constant":
        names = ", ".join(k for k in SCHEDULES if k != "warmup_constant")
        raise fail("lr_scheduler_type", v, f"transformers' schedules grpolab has (the same numbers): {names}")
    return {"lr_scheduler": v}


def scheduler_kwargs(v, a) -> dict:
    """transformers' lr_scheduler_kwargs (a dict, or its JSON text from a command line) -> grpolab's, checked
    against the schedule (grpolab.algo.schedules.schedule_options) with TRL's learning_rate."""
    from grpolab.algo.schedules import schedule_options

    if v is None or v == "":
        v = {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise fail("lr_scheduler_kwargs", v, f"not a JSON object ({e})") from e
    if not isinstance(v, dict):
        raise fail("lr_scheduler_kwargs", v, "expected a dict (or its JSON text)")
    name = value_of(a["lr_scheduler_type"])
    if name not in NEEDS_A_METRIC:
        schedule_options(name, v, float(a["learning_rate"]))
    return {"lr_scheduler_kwargs": dict(v)} if v else {}


__all__ = ["NEEDS_A_METRIC", "scheduler", "scheduler_kwargs"]
