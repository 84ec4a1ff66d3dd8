"""The check `grpolab train` makes before step 1: the run planned as it was set up (its device with the
memory it can still have, its precision, its model's own config, its task's prompts), and a warning
when the peak is over what the device has. It never stops a run."""

from __future__ import annotations

from grpolab.training.plan.devices import device_of_run
from grpolab.training.plan.estimate import Plan, plan, prompt_tokens_of
from grpolab.training.plan.shapes import Shape


def check_run(run, log) -> Plan | None:
    """Before step 1: plan the run as set up (its device, precision and prompts) and log a warning
    when the peak is over what the device has. Returns the plan (None where it cannot be made: a
    model the plan does not know; a plan that fails says so in one line and never stops the run)."""
    if not run.ranks.main:
        return None
    try:
        return _check_run(run, log)
    except Exception as e:  # noqa: BLE001 - a warning helper must not end a training run
        log(f"note: grpolab plan could not plan this run ({type(e).__name__}: {e}); no memory check was made")
        return None


def _check_run(run, log) -> Plan | None:
    cfg = run.cfg
    try:
        shape = Shape.from_config(_config_dict(run.policy), cfg.model)
    except (ValueError, AttributeError):  # not a Llama-family config: nothing to plan
        return None
    device = device_of_run(run)
    if device.memory <= 0:
        return None
    prec = run.precision
    u = 2 if prec is not None and prec.update is not None else 4
    ro = 2 if prec is not None and prec.rollout is not None else 4
    p = plan(
        cfg,
        device,
        prompt_tokens=prompt_tokens_of(cfg, run.tokenizer, run.task),
        shape=shape,
        update_bytes=u,
        rollout_bytes=ro,
    )
    if not p.fits:
        gb = 1 << 30
        log(
            f"warning: grpolab plan puts this run's peak at {p.peak.total / gb:.1f} GB ({p.peak.name}) and "
            f"{device.name} has {device.usable / gb:.1f} GB for it: it may run out of memory. "
            f"`grpolab plan` with the same settings lists changes that fit (grad_checkpointing=true, a smaller "
            f"micro_batch, lora.r=16)"
        )
    return p


def _config_dict(model) -> dict:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.config.to_dict()


__all__ = ["check_run"]
