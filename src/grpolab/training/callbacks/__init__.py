"""Callbacks: your code at the points of a run people hook into, able to stop it.

    class StopWhenSolved(grpolab.Callback):
        def on_step_end(self, state, metrics):
            return metrics["reward/mean"] > 0.9          # True: stop after this step

    grpolab.train("recipes/demo.yaml", callbacks=[StopWhenSolved()])

Hooks (each optional; `state` is the run's TrainingState):

    on_train_begin(state)                 before the first step (and before the evaluation that precedes it)
    on_step_begin(state)                  before each step
    on_step_end(state, metrics)           after each step, with that step's metrics.jsonl row
    on_log(state, record)                 every row logged: the step rows, and evaluation rows
    on_evaluate(state, metrics)           every evaluation row (its eval/... keys and `step`)
    on_save(state, checkpoint)            after a checkpoint is written (its directory; None off rank 0)
    on_train_end(state, summary)          after the run ends (its last step or a stop), with the summary

A hook stops the run by returning True or calling state.stop(reason): the step in progress finishes, a
checkpoint is written, the held-out evaluation, summary and report follow as at a normal end, and the
command exits 0. A transformers TrainerCallback (an instance or its class) is accepted as it is
(grpolab.training.callbacks.transformers_adapter): it is called as TRL's GRPOTrainer calls it (per optimizer
update, with TRL's metric names in `logs`), its control.should_training_stop stops the run, and
control.should_save writes a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError

HOOKS = ("on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_evaluate", "on_save", "on_train_end")


@dataclass
class TrainingState:
    """What a callback sees of the run."""

    max_steps: int
    """The run's `steps`."""
    out: Path
    """The run directory."""
    config: Any
    """The run's Config."""
    step: int = 0
    """The last step started (0 before the first)."""
    is_main: bool = True
    """Whether this is rank 0 (the process that writes the files); every rank calls its callbacks."""
    log_history: list[dict] = field(default_factory=list)
    """Every row logged so far in this process: step rows and evaluation rows, each with its `step`."""
    should_stop: bool = False
    """Set (by stop()) to end the run after the current step."""
    stop_reason: str = ""
    """Who asked to stop, and why."""
    should_save: bool = False
    """Set to write a checkpoint after the current step (reset after it is written)."""
    rows: int | None = None
    """The training rows one epoch passes over (None for a task that generates its prompts)."""
    updates: list[dict] = field(default_factory=list)
    """The last step's optimizer updates (grpolab.training.run.Run.updates: the learning rate each used, its
    gradient norm and loss), set before on_step_end."""

    def stop(self, reason: str = "") -> None:
        """End the run after the current step (checkpoint, evaluation, summary and report as at a normal end)."""
        self.should_stop = True
        self.stop_reason = self.stop_reason or reason or "a callback asked to stop"


class Callback:
    """Base class of a callback: every hook does nothing; override those you need (see the module docstring).
    Returning True from a hook stops the run after the current step."""

    def on_train_begin(self, state: TrainingState) -> bool | None: ...

    def on_step_begin(self, state: TrainingState) -> bool | None: ...

    def on_step_end(self, state: TrainingState, metrics: dict) -> bool | None: ...

    def on_log(self, state: TrainingState, record: dict) -> bool | None: ...

    def on_evaluate(self, state: TrainingState, metrics: dict) -> bool | None: ...

    def on_save(self, state: TrainingState, checkpoint: Path | None) -> bool | None: ...

    def on_train_end(self, state: TrainingState, summary: dict) -> bool | None: ...


def is_eval_row(record: dict) -> bool:
    """Whether a logged row carries evaluation metrics (any eval/... key)."""
    return any(k.startswith("eval/") for k in record)


def as_callbacks(items) -> list:
    """The callbacks of `callbacks=`, checked before anything runs: an object with at least one hook, a
    transformers TrainerCallback (instance or class, wrapped in TrainerCallbackAdapter), or a class of
    either (instantiated without arguments). ConfigError (exit 2) for anything else."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        items = [items]
    out, trainer_callbacks = [], []
    for i, item in enumerate(items):
        from grpolab.training.callbacks.transformers_adapter import TrainerCallbackAdapter, is_trainer_callback

        if isinstance(item, type):
            if not (is_trainer_callback(item) or any(hasattr(item, h) for h in HOOKS)):
                raise ConfigError(_not_a_callback(i, item))
            item = item()
        if is_trainer_callback(item):
            if not trainer_callbacks:  # every TrainerCallback shares one adapter, where the first stood
                out.append(TrainerCallbackAdapter(trainer_callbacks))
            trainer_callbacks.append(item)
        elif any(callable(getattr(item, h, None)) for h in HOOKS):
            out.append(item)
        else:
            raise ConfigError(_not_a_callback(i, item))
    for item in out:
        if isinstance(item, TrainerCallbackAdapter) and not item.handler.callbacks[1:]:
            for cb in trainer_callbacks:
                item.handler.add_callback(cb)
    return out


def _not_a_callback(i: int, item) -> str:
    return (
        f"callbacks[{i}]: {item!r} has none of the hooks {', '.join(HOOKS)}; give an object with some of "
        f"them (subclass grpolab.Callback) or a transformers TrainerCallback"
    )


class Callbacks:
    """The run's callbacks, called in order by the training loop (grpolab.training.trainer.train).

    `listener` is handed to the MetricsLogger: every row logged reaches on_log, and evaluation rows also
    on_evaluate, whichever part of the run logged them."""

    def __init__(self, items=None):
        self.items = as_callbacks(items)
        self.state: TrainingState | None = None

    def __bool__(self) -> bool:
        return bool(self.items)

    def _call(self, hook: str, *args) -> None:
        for cb in self.items:
            fn = getattr(cb, hook, None)
            if fn is not None and fn(self.state, *args) is True:
                self.state.stop(f"{type(cb).__name__}.{hook} returned True")

    def begin(
        self, cfg, out: Path, start: int, *, is_main: bool = True, rows: int | None = None, objects: dict | None = None
    ) -> None:
        """on_train_begin. objects: what transformers passes a TrainerCallback (model, processing_class,
        optimizer, lr_scheduler); rows: the training rows of an epoch (None: generated prompts)."""
        self.state = TrainingState(
            max_steps=cfg.steps, out=Path(out), config=cfg, step=start, is_main=is_main, rows=rows
        )
        for cb in self.items:
            if hasattr(cb, "bind"):
                cb.bind(self.state, objects or {})
        self._call("on_train_begin")

    def step_begin(self, step: int) -> None:
        self.state.step = step
        self._call("on_step_begin")

    def step_end(self, step: int, metrics: dict, updates: list[dict] | None = None) -> None:
        self.state.step = step
        self.state.updates = list(updates or [])
        self._call("on_step_end", metrics)

    def listener(self, record: dict) -> None:
        """A row was logged (MetricsLogger listener): on_log, and on_evaluate for an evaluation row."""
        if self.state is None:
            return
        self.state.log_history.append(dict(record))
        self._call("on_log", record)
        if is_eval_row(record):
            self._call("on_evaluate", {k: v for k, v in record.items() if k == "step" or k.startswith("eval/")})

    def saved(self, checkpoint: Path | None) -> None:
        self.state.should_save = False
        self._call("on_save", checkpoint)

    def end(self, summary: dict) -> None:
        self._call("on_train_end", summary)

    @property
    def should_stop(self) -> bool:
        return self.state is not None and self.state.should_stop

    @property
    def should_save(self) -> bool:
        return self.state is not None and self.state.should_save


__all__ = ["HOOKS", "Callback", "Callbacks", "TrainingState", "as_callbacks", "is_eval_row"]
