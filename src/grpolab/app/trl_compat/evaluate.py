"""GRPOTrainer.evaluate: grpolab's held-out evaluation (grpolab.training.evaluation) of trainer.model on rows,
as TRL's eval_... metrics.

The rows are read as the trainer reads eval_dataset (a `prompt` column, every other column for the reward
functions); the run is set up for evaluation only (nothing written, no reference, no optimizer) around the
trainer's own model object and tokenizer, sampling as the training run's evaluations do
(eval_num_generations = num_generations, TRL's temperature)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from grpolab.app.trl_compat import data as trl_data
from grpolab.training.trl_names import trl_eval_row


def evaluate_rows(trainer, rows: list[dict], num_tokens: float) -> dict:
    """TRL's eval metrics of trainer.model on `rows`: eval_loss (the training loss of the evaluation's
    completions, grpolab.training.eval_loss; where it applies), eval_runtime, eval_samples_per_second,
    eval_steps_per_second, eval_num_tokens (TRL's: the training tokens so far, `num_tokens`), then
    grpolab.training.trl_names.trl_eval_row's (eval_reward, ...)."""
    from grpolab.app import api
    from grpolab.training.config import build_config
    from grpolab.training.evaluation import eval_metrics, evaluate
    from grpolab.training.trainer import setup

    with (
        tempfile.TemporaryDirectory(prefix="grpolab-eval-") as tmp,
        api._registered(trainer.reward_specs) as specs,
        api._environments(trainer.environment_factory, trainer._tools) as env,
    ):
        data = trl_data.write_rows(rows, Path(tmp) / "eval.jsonl", "eval_dataset")
        recipe = {k: v for k, v in trainer.recipe.items() if k not in ("resume",)}
        recipe.update(out=str(Path(tmp) / "run"), task="dataset", eval_size=len(rows), progress=False, report=False)
        recipe["task_args"] = {
            **trl_data.task_args(rows, trainer.environment_factory is not None),
            "path": str(data),
            "eval_path": str(data),
        }
        recipe["task_args"].pop("eval_size", None)
        if specs is not None:
            recipe["rewards"] = specs
        if env:
            recipe["env"] = {**(recipe.get("env") or {}), **env}
        cfg = build_config(recipe)
        run = setup(cfg, training=False, log=lambda *_: None, policy=trainer.model, tokenizer=trainer.processing_class)
        start = time.time()
        res = evaluate(run, run.task.eval_set()[: cfg.eval_size], loss=True)
        runtime = time.time() - start
        run.engine.close()
    batches = max(1, -(-len(rows) // max(1, cfg.eval_batch)))
    row = trl_eval_row(eval_metrics(res), [f.name for f in run.reward_fns])
    out = {k: row.pop(k) for k in ("eval_loss",) if k in row}  # transformers' first key
    out |= {
        "eval_runtime": round(runtime, 4),
        "eval_samples_per_second": round(len(rows) / runtime, 3) if runtime else 0.0,
        "eval_steps_per_second": round(batches / runtime, 3) if runtime else 0.0,
        "eval_num_tokens": num_tokens,
    }
    out.update(row)
    return out


__all__ = ["evaluate_rows"]
