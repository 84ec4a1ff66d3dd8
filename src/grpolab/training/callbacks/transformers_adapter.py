"""A transformers TrainerCallback in a grpolab run, called as transformers' Trainer calls it.

    on_train_begin, on_epoch_begin      at the start (the run is one epoch)
    on_step_begin                       before each step (control's should_log/evaluate/save reset first)
    on_step_end                         after each step
    on_log(logs=row)                    every row logged (without `step`); state.log_history gets {**row, "step"}
    on_evaluate(metrics=...)            every evaluation row: its eval/... keys, each also under transformers'
                                        own spelling eval_... (eval/accuracy -> eval_accuracy)
    on_save(checkpoint=path)            after a checkpoint is written
    on_epoch_end, on_train_end          at the end

Each gets (args, state, control, **kwargs) with kwargs model, processing_class, optimizer, lr_scheduler.
args is a transformers TrainingArguments holding the run's settings (output_dir = OUT, max_steps = steps,
learning_rate, seed, per_device_train_batch_size = batch_size, ...); state a TrainerState whose
global_step, max_steps, epoch (steps done / steps) and log_history follow the run; control a TrainerControl:
should_training_stop stops the run after the step, should_save writes a checkpoint after it. Not called:
on_init_end, on_substep_end, on_pre_optimizer_step, on_optimizer_step, on_prediction_step, on_predict,
on_push_begin (grpolab's step is not transformers' loop over batches).
"""

from __future__ import annotations

from pathlib import Path


def is_trainer_callback(obj) -> bool:
    """Whether `obj` (an instance or a class) is a transformers TrainerCallback, without importing
    transformers when it is not."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__name__ == "TrainerCallback" and c.__module__.startswith("transformers") for c in cls.__mro__)


def training_arguments(cfg, out: Path):
    """transformers.TrainingArguments with the run's settings (what a callback reads of `args`)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_betas[0],
        adam_beta2=cfg.adam_betas[1],
        max_grad_norm=cfg.max_grad_norm,
        warmup_steps=cfg.warmup_steps,
        seed=cfg.seed,
        logging_steps=1,
        save_steps=cfg.save_every or cfg.steps,
        save_strategy="steps",
        report_to="none",
        run_name=cfg.run_name or out.resolve().name,
    )


class TrainerCallbackAdapter:
    """grpolab's hooks (grpolab.training.callbacks) -> a TrainerCallback's (see the module docstring)."""

    def __init__(self, callback):
        from transformers import TrainerControl

        self.callback = callback
        self.control = TrainerControl()
        self.args = self.state = None
        self.kwargs: dict = {}

    def bind(self, run_state, objects: dict) -> None:
        """Made at the start of the run, from grpolab's TrainingState and the run's objects."""
        from transformers import TrainerState

        cfg = run_state.config
        self.args = training_arguments(cfg, run_state.out)
        self.state = TrainerState(
            global_step=run_state.step,
            max_steps=cfg.steps,
            logging_steps=1,
            save_steps=cfg.save_every or cfg.steps,
            train_batch_size=cfg.batch_size,
            num_train_epochs=1,
            is_world_process_zero=run_state.is_main,
            is_local_process_zero=run_state.is_main,
        )
        self.state.epoch = run_state.step / max(1, cfg.steps)
        self.kwargs = dict(objects)

    def _fire(self, hook: str, run_state, **kwargs) -> None:
        fn = getattr(self.callback, hook, None)
        if fn is not None:
            result = fn(self.args, self.state, self.control, **self.kwargs, **kwargs)
            if result is not None and hasattr(result, "should_training_stop"):
                self.control = result  # transformers keeps what a hook returns as the new control
        if self.control.should_training_stop:
            run_state.stop(f"{type(self.callback).__name__}.{hook} set control.should_training_stop")
        if self.control.should_save:
            run_state.should_save = True

    def on_train_begin(self, run_state) -> None:
        self._fire("on_train_begin", run_state)
        self._fire("on_epoch_begin", run_state)

    def on_step_begin(self, run_state) -> None:
        self.control.should_log = self.control.should_evaluate = self.control.should_save = False
        self._fire("on_step_begin", run_state)

    def on_step_end(self, run_state, metrics: dict) -> None:
        self.state.global_step = run_state.step
        self.state.epoch = run_state.step / max(1, self.state.max_steps)
        self._fire("on_step_end", run_state)

    def on_log(self, run_state, record: dict) -> None:
        logs = {k: v for k, v in record.items() if k != "step"}
        self.state.log_history.append({**logs, "step": int(record.get("step", self.state.global_step))})
        self._fire("on_log", run_state, logs=logs)

    def on_evaluate(self, run_state, metrics: dict) -> None:
        got = {k: v for k, v in metrics.items() if k != "step"}
        got.update({"eval_" + k[len("eval/") :]: v for k, v in metrics.items() if k.startswith("eval/")})
        self._fire("on_evaluate", run_state, metrics=got)

    def on_save(self, run_state, checkpoint) -> None:
        self.control.should_save = False
        self._fire("on_save", run_state, checkpoint=checkpoint)

    def on_train_end(self, run_state, summary: dict) -> None:
        self._fire("on_epoch_end", run_state)
        self._fire("on_train_end", run_state)


__all__ = ["TrainerCallbackAdapter", "is_trainer_callback", "training_arguments"]
