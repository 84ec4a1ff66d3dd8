"""transformers TrainerCallbacks in a grpolab run, called as TRL 1.16's GRPOTrainer calls them.

Every TrainerCallback of a run shares one TrainerCallbackAdapter: one transformers CallbackHandler (with
transformers' DefaultFlowCallback first, as in a Trainer), one TrainerState and one TrainerControl. grpolab's
step is one generation and algo.mu x algo.steps_per_generation optimizer updates; TRL counts the updates, so:

    on_train_begin, on_epoch_begin      at the start
    on_step_begin, on_step_end          once per optimizer update (state.global_step counts updates)
    on_log(logs=row)                    at each logging step (args.logging_steps, logging_first_step), the row
                                        in TRL's names and order (grpolab.training.trl_names); evaluations as
                                        eval_... rows; the end's train_runtime/train_loss row
    on_evaluate(metrics=...)            after each evaluation row
    on_save(checkpoint=path)            after a checkpoint is written (checkpoint: grpolab's addition; a
                                        GRPOTrainer's run: its view OUT/checkpoint-N, written just before)
    on_epoch_end, on_train_end          at the end

Each gets (args, state, control) and transformers' kwargs (model, processing_class, optimizer, lr_scheduler,
train_dataloader=None, eval_dataloader=None). args: the TRL GRPOConfig of a GRPOTrainer, or a
TrainingArguments holding the run's settings; state a TrainerState (global_step, max_steps in optimizer
updates, epoch, log_history, best_metric and best_model_checkpoint when args.metric_for_best_model is set);
control: should_training_stop stops the run after the step, should_save writes a checkpoint after it. Not
called: on_init_end (the GRPOTrainer calls it), on_substep_end, on_pre_optimizer_step, on_optimizer_step,
on_prediction_step, on_predict, on_push_begin.
"""

from __future__ import annotations

import time
from pathlib import Path

from grpolab.training.trl_names import TrlLog, step_times, trl_eval_row


def is_trainer_callback(obj) -> bool:
    """Whether `obj` (an instance or a class) is a transformers TrainerCallback, without importing
    transformers when it is not."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__name__ == "TrainerCallback" and c.__module__.startswith("transformers") for c in cls.__mro__)


def training_arguments(cfg, out: Path):
    """transformers.TrainingArguments with the run's settings (what a callback reads of `args`); steps in
    optimizer updates."""
    from transformers import TrainingArguments

    per = updates_per_step(cfg)
    return TrainingArguments(
        output_dir=str(out),
        max_steps=cfg.steps * per,
        per_device_train_batch_size=cfg.micro_batch or cfg.batch_size,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_betas[0],
        adam_beta2=cfg.adam_betas[1],
        max_grad_norm=cfg.max_grad_norm,
        warmup_steps=cfg.warmup_steps * per,
        seed=cfg.seed,
        logging_steps=1,
        save_steps=(cfg.save_every or cfg.steps) * per,
        save_strategy="steps",
        save_only_model=cfg.save_only_model,
        eval_strategy="steps",  # every evaluation the run makes is passed on, the one before training too
        eval_steps=(cfg.eval_steps or cfg.steps) * per,
        eval_delay=cfg.eval_delay * per,
        eval_on_start=bool(cfg.eval_size),
        report_to="none",
        run_name=cfg.run_name or out.resolve().name,
    )


def updates_per_step(cfg) -> int:
    """Optimizer updates per grpolab step: algo.mu x algo.steps_per_generation."""
    return int(cfg.algo.mu) * int(cfg.algo.steps_per_generation)


def new_state(args, max_steps: int, start: int = 0):
    """A TrainerState as a Trainer starts one from `args` (steps in optimizer updates)."""
    from transformers import TrainerState

    state = TrainerState(
        global_step=start,
        max_steps=max_steps,
        logging_steps=int(getattr(args, "logging_steps", 1) or 1),
        eval_steps=int(getattr(args, "eval_steps", None) or getattr(args, "logging_steps", 1) or 1),
        save_steps=int(getattr(args, "save_steps", max_steps) or max_steps),
        train_batch_size=int(getattr(args, "per_device_train_batch_size", 1) or 1),
        is_world_process_zero=True,
        is_local_process_zero=True,
    )
    return state


class TrainerCallbackAdapter:
    """grpolab's hooks (grpolab.training.callbacks) -> the TrainerCallbacks of a run (see the module docstring).

    callbacks: TrainerCallbacks (instances or classes); args: what they get as `args` (None: the run's
    training_arguments); state: a TrainerState to continue (a resumed GRPOTrainer's), else one is made at
    the start of the run; views: write OUT/checkpoint-N beside each checkpoint (a GRPOTrainer's run,
    grpolab.training.checkpoint_views)."""

    def __init__(self, callbacks=(), args=None, state=None, views: bool = False):
        from transformers import DefaultFlowCallback, TrainerControl
        from transformers.trainer_callback import CallbackHandler

        items = list(callbacks)
        if not any(c is DefaultFlowCallback or isinstance(c, DefaultFlowCallback) for c in items):
            items.insert(0, DefaultFlowCallback)
        self.handler = CallbackHandler(items, None, None, None, None)
        self.args, self.state, self.control = args, state, TrainerControl()
        self.views = views
        self.per = 1
        self.log: TrlLog | None = None
        self.started = 0.0
        self.start_step = 0
        self.output: dict = {}

    @property
    def callback(self):
        """The first TrainerCallback the user gave (the one a single-callback adapter holds)."""
        from transformers import DefaultFlowCallback

        mine = [c for c in self.handler.callbacks if not isinstance(c, DefaultFlowCallback)]
        return mine[0] if mine else None

    def bind(self, run_state, objects: dict) -> None:
        """Made at the start of the run, from grpolab's TrainingState and the run's objects."""
        cfg = run_state.config
        self.per = updates_per_step(cfg)
        self.rows, self.prompts = run_state.rows, max(1, cfg.batch_size // max(cfg.G, 1))
        if self.args is None:
            self.args = training_arguments(cfg, run_state.out)
        start = run_state.step * self.per
        if self.state is None or self.state.global_step != start:
            self.state = new_state(self.args, cfg.steps * self.per, start)
        self.state.max_steps = cfg.steps * self.per
        self.state.is_world_process_zero = self.state.is_local_process_zero = run_state.is_main
        self.state.num_train_epochs = self._epochs()
        self.state.epoch = self._epoch(start)
        self.start_step = start
        names = list(objects.get("reward_names", []))
        self.log = TrlLog(names, cfg.algo.beta != 0.0 or cfg.algo.adaptive_kl, self.state.num_input_tokens_seen)
        for key in ("model", "processing_class", "optimizer", "lr_scheduler"):
            setattr(self.handler, key, objects.get(key))
        self.started = time.time()

    def _epoch(self, global_step: int) -> float:
        """TRL's epoch: optimizer updates over the updates of one pass over the rows (rows / prompts per step
        x updates per step); without rows, the share of max_steps."""
        if self.rows:
            return global_step / (self.rows / self.prompts * self.per)
        return global_step / max(1, self.state.max_steps)

    def _epochs(self) -> int:
        if self.rows:
            import math

            return max(1, math.ceil(self._epoch(self.state.max_steps) - 1e-9))
        return 1

    def _fire(self, hook: str, run_state, **kwargs) -> None:
        self.control = getattr(self.handler, hook)(self.args, self.state, self.control, **kwargs)
        if self.control.should_training_stop and self.state.global_step < self.state.max_steps:
            run_state.stop(f"{self._who(hook)}.{hook} set control.should_training_stop")
        if self.control.should_save:
            run_state.should_save = True

    def _who(self, hook: str) -> str:
        """The class name of the user's callback that has its own `hook` (the first of several)."""
        from transformers import DefaultFlowCallback, TrainerCallback

        own = [
            type(cb).__name__
            for cb in self.handler.callbacks
            if not isinstance(cb, DefaultFlowCallback) and getattr(type(cb), hook) is not getattr(TrainerCallback, hook)
        ]
        return own[0] if own else "a TrainerCallback"

    def _log(self, run_state, logs: dict) -> None:
        """transformers' Trainer.log: the row (with `step`) into log_history, then on_log."""
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self._fire("on_log", run_state, logs=logs)

    def on_train_begin(self, run_state) -> None:
        self._fire("on_train_begin", run_state)
        self._fire("on_epoch_begin", run_state)

    def on_step_begin(self, run_state) -> None:
        self._fire("on_step_begin", run_state)

    def on_step_end(self, run_state, metrics: dict) -> None:
        """The step's optimizer updates, one by one: on_step_end each, a row at each logging step; then the
        step's evaluation (grpolab evaluates after the step's updates) as an eval_... row and on_evaluate."""
        updates = list(run_state.updates)
        if "reward/mean" in metrics:
            self.log.add_generation(metrics)
        self.state.num_input_tokens_seen = int(self.log.num_tokens)
        times = step_times(metrics, self.per)
        for i in range(self.per):
            if i:
                self._fire("on_step_begin", run_state)
            update = updates[i] if i < len(updates) else {"learning_rate": metrics.get("lr")}
            self.log.add_update(metrics, update, times[i])
            self.state.global_step = (run_state.step - 1) * self.per + i + 1
            self.state.epoch = self._epoch(self.state.global_step)
            self._fire("on_step_end", run_state)
            if self.control.should_log:
                self._log(run_state, self.log.row(self.state.epoch))
        if any(k.startswith("eval/") for k in metrics):
            self.evaluated(run_state, metrics)

    def evaluated(self, run_state, metrics: dict) -> dict:
        """An evaluation's row in TRL's names (grpolab.training.trl_names.trl_eval_row), logged and passed to
        on_evaluate; the best metric followed (args.metric_for_best_model). Returns the row."""
        row = {"eval_num_tokens": float(self.state.num_input_tokens_seen)}  # TRL's: the training tokens so far
        row.update(trl_eval_row(metrics, self.log.reward_names if self.log else []))
        row["epoch"] = self.state.epoch
        self._log(run_state, row)
        self._best(row)
        self._fire("on_evaluate", run_state, metrics=row)
        return row

    def _best(self, row: dict) -> None:
        """transformers' _determine_best_metric: the metric named by args.metric_for_best_model ("eval_"
        added where missing), compared by args.greater_is_better."""
        name = getattr(self.args, "metric_for_best_model", None)
        if not name:
            return
        key = name if name.startswith("eval_") else f"eval_{name}"
        value = row.get(key)
        if value is None:
            return
        greater = getattr(self.args, "greater_is_better", None)
        greater = not name.endswith("loss") if greater is None else greater
        best = self.state.best_metric
        if best is None or (value > best if greater else value < best):
            self.state.best_metric, self.state.best_global_step = float(value), self.state.global_step

    def on_log(self, run_state, record: dict) -> None:
        """A row that is an evaluation only (before or after training, eval_steps=0): an eval_... row when the
        args evaluate (eval_strategy) and the run has begun (eval_on_start for step 0); step rows are the
        updates' (on_step_end)."""
        keys = [k for k in record if k != "step"]
        if not keys or not all(k.startswith("eval/") for k in keys):
            return
        strategy = self._strategy("eval_strategy", "no")
        at_start = int(record.get("step", 0)) == 0
        if strategy == "no" or (at_start and not getattr(self.args, "eval_on_start", False)):
            return
        self.evaluated(run_state, record)

    def on_save(self, run_state, checkpoint) -> None:
        """After grpolab's checkpoint `checkpoint` (rank 0; None elsewhere): with `views`, its view
        OUT/checkpoint-N holding this state (grpolab.training.checkpoint_views), unless args.save_strategy is
        "no" (TRL writes none then); then on_save, given the view (else grpolab's directory)."""
        if checkpoint is not None and self.views and self._strategy("save_strategy", "steps") != "no":
            from grpolab.training.checkpoint_views import view_name, write_view

            if self.state.best_global_step == self.state.global_step:  # as the Trainer names it, before saving
                self.state.best_model_checkpoint = str(Path(run_state.out) / view_name(self.state.global_step))
            view = write_view(
                Path(run_state.out), Path(checkpoint), self.state.global_step, self.state, self._stateful()
            )
            checkpoint = view if view is not None else checkpoint
        elif checkpoint is not None and self.state.best_global_step == self.state.global_step:
            self.state.best_model_checkpoint = str(checkpoint)
        self._fire("on_save", run_state, checkpoint=checkpoint)  # grpolab's addition: the directory written

    def _strategy(self, name: str, default: str) -> str:
        value = getattr(self.args, name, default)
        return str(getattr(value, "value", value))

    def _stateful(self) -> list:
        """The TrainerControl and the callbacks that are transformers ExportableStates (what a Trainer records
        in state.stateful_callbacks at each checkpoint)."""
        from transformers.trainer_callback import ExportableState

        return [cb for cb in [*self.handler.callbacks, self.control] if isinstance(cb, ExportableState)]

    def on_train_end(self, run_state, summary: dict) -> None:
        """on_epoch_end, the run's closing row (train_runtime, train_samples_per_second, train_steps_per_second,
        total_flos, train_loss, then TRL's means of the updates since the last logging step, as
        GRPOTrainer.log merges them, and epoch) logged, on_train_end."""
        self._fire("on_epoch_end", run_state)
        runtime = round(time.time() - self.started, 4)
        done = self.state.global_step - self.start_step
        losses = self.log.all_losses if self.log else []
        samples = done * int(getattr(self.args, "per_device_train_batch_size", 1) or 1)
        self.output = {
            "train_runtime": runtime,
            "train_samples_per_second": round(samples / runtime, 3) if runtime else 0.0,
            "train_steps_per_second": round(done / runtime, 3) if runtime else 0.0,
            "total_flos": 0.0,
            "train_loss": sum(losses) / len(losses) if losses else 0.0,
            **(self.log.residual() if self.log else {}),  # TRL's: the updates since the last logging step
            "epoch": self.state.epoch,
        }
        self._log(run_state, dict(self.output))
        self._fire("on_train_end", run_state)


__all__ = ["TrainerCallbackAdapter", "is_trainer_callback", "new_state", "training_arguments", "updates_per_step"]
