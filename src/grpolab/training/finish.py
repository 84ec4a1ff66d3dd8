"""What the training loop (grpolab.training.trainer.train) writes after a step and at its end, and how
it stops: a checkpoint (save; save_or_stop, which stops the run when the disk refuses it), the stop after
too many non-finite updates in a row (check_nonfinite), the command that continues a stopped run
(resume_command), summary.json (summarise, write_summary) and report.html (write_run_report).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from grpolab.parallel import distributed
from grpolab.parallel import fsdp as sharding
from grpolab.training.run import Run
from grpolab.training.stops import RunStopped
from grpolab.util.fileio import atomic_write

ReportWriter = Callable[[Path, torch.device], None]
"""Writes a run's report: (OUT, the device it ran on) -> OUT/report.html."""


def save(run: Run, step: int, policy=None, optimizer=None) -> Path:
    """One atomic checkpoint: policy, optimizer, scheduler, RNG, and every component (critic.pt); with
    save_only_model the policy alone (grpolab.training.checkpoint.save_checkpoint's model_only).
    `policy`/`optimizer`: stand-ins holding the gathered full states of a sharded run (grpolab.parallel.fsdp)."""
    from grpolab.training.checkpoint import save_checkpoint

    state = {"step": step, "world_size": run.ranks.world}
    if run.kl.adaptive:
        state["kl_beta"] = run.kl.value
    if run.data_shift:
        state["data_shift"] = run.data_shift
    return save_checkpoint(
        run.out,
        step,
        run.policy if policy is None else policy,
        run.tokenizer,
        run.optimizer if optimizer is None else optimizer,
        run.scheduler,
        state,
        keep_last=run.cfg.keep_checkpoints,
        components=run.components,
        model_only=run.cfg.save_only_model,
    )


def write_run_report(run: Run, log, report: ReportWriter | None) -> None:
    """OUT/report.html (cfg.report), at the end and on a graceful stop, by the writer the application
    passed (grpolab.app.report.write_run_report; the training layer draws nothing itself); a report that
    fails costs a warning, never the run."""
    if not run.cfg.report or report is None:
        return
    log(f"writing {run.out / 'report.html'} (the run's plots)...")
    try:
        report(run.out, run.device)
    except Exception as e:  # noqa: BLE001 (matplotlib missing, a plotting bug, a full disk...)
        log(f"warning: report.html not written: {e}")


def resume_command(run: Run) -> str:
    return f"grpolab train --resume {run.out}"


def check_nonfinite(run: Run, step: int) -> None:
    """Stop (RunStopped, exit 1) after cfg.max_nonfinite_updates non-finite updates in a row."""
    from grpolab.training.checkpoint import latest_checkpoint

    if run.nonfinite_streak >= run.cfg.max_nonfinite_updates:
        last = latest_checkpoint(run.out)
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
        raise RunStopped(
            f"step {step}: {run.nonfinite_streak} optimizer updates in a row had a non-finite loss or "
            f"gradient norm (each was skipped, update/nonfinite_skipped); stopping. The weights were "
            f"never updated with them and {kept}. Check the rewards and log-probs for NaN/inf, or "
            f"lower lr; continue with: {resume_command(run)}",
            1,
        )


def save_or_stop(run: Run, step: int) -> Path | None:
    """save() on rank 0 (returns the checkpoint's directory there, None elsewhere), or RunStopped (exit 1,
    on every rank) naming the intact previous checkpoint when the disk refuses it."""
    from grpolab.training.checkpoint import is_write_failure, latest_checkpoint

    d = run.ranks
    error = path = None
    policy, optimizer = sharding.full_views(run)  # FSDP: every rank gathers the full states for rank 0
    if d.main:
        try:
            path = save(run, step, policy, optimizer)
        except Exception as e:
            if not is_write_failure(e):
                raise
            error = e
    if distributed.global_counts(d, 1.0 if error is not None else 0.0)[0]:
        last = latest_checkpoint(run.out)
        kept = f"the previous checkpoint {last} is intact" if last else "no earlier checkpoint exists"
        reason = (getattr(error, "strerror", None) or str(error).strip().splitlines()[-1]) if error else "on rank 0"
        raise RunStopped(
            f"could not write the checkpoint of step {step} ({reason}; is the disk full?): "
            f"nothing partial was left and {kept}. Free space, then continue with: "
            f"{resume_command(run)}",
            1,
        ) from error
    return path


def write_summary(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=2))


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(
    history: list[dict], before: dict | None, after: dict | None, out: Path, k: int = 5, report: bool = False
) -> dict:
    """Start vs end: mean reward and length over the first and last k steps, held-out accuracy. A row
    of step 0 (the evaluation before training, eval_steps > 0) is not a step."""
    history = [h for h in history if h.get("step", 0) >= 1]
    first, last = history[:k], history[-k:]
    return {
        "steps": len(history),
        "reward_first": _mean([h.get("reward/mean") for h in first]),
        "reward_last": _mean([h.get("reward/mean") for h in last]),
        "length_first": _mean([h.get("completion/length_mean") for h in first]),
        "length_last": _mean([h.get("completion/length_mean") for h in last]),
        "eval_before": before,
        "eval_after": after,
        "time_s": sum(h.get("time/step_s", 0.0) for h in history),
        "out": str(out),
        "files": {
            n: str(out / n)
            for n in (
                "metrics.jsonl",
                "samples.jsonl",
                "config.yaml",
                "tb",
                "checkpoints",
                *(("report.html",) if report else ()),
            )
        },
    }
