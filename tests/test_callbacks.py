"""Callbacks (grpolab.train(callbacks=[...])): the hooks in their order with the step's metrics, the
evaluations and the checkpoints; a callback stopping a run at a chosen step, which then ends as a finished run
does (checkpoint, evaluation, summary, report, exit 0); a transformers TrainerCallback called as transformers'
Trainer calls it, its control.should_training_stop and should_save honoured; bad callbacks refused first."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import grpolab
from grpolab.training.callbacks import Callbacks, TrainingState, as_callbacks
from grpolab.training.callbacks.transformers_adapter import TrainerCallbackAdapter
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(
    steps=5,
    batch_size=8,
    G=4,
    max_new_tokens=6,
    micro_batch=8,
    eval_size=4,
    progress=False,
    save_every=0,
    samples_per_step=1,
    report_to="none",
)


class StopAtTwo(grpolab.Callback):
    """Records every hook; stops the run by returning True at the end of step 2."""

    def __init__(self):
        self.calls = []

    def on_train_begin(self, state):
        self.calls.append(("train_begin", state.step, state.max_steps))

    def on_step_begin(self, state):
        self.calls.append(("step_begin", state.step))

    def on_step_end(self, state, metrics):
        self.calls.append(("step_end", state.step, metrics["step"], "reward/mean" in metrics))
        return state.step == 2

    def on_evaluate(self, state, metrics):
        self.calls.append(("evaluate", metrics["step"], sorted(metrics)))

    def on_save(self, state, checkpoint):
        self.calls.append(("save", Path(checkpoint).name))

    def on_train_end(self, state, summary):
        self.calls.append(("train_end", summary["steps"], summary["stopped"]["step"], len(state.log_history)))


class Recorder(TrainerCallback):
    """A TrainerCallback that only watches."""

    def __init__(self):
        self.calls = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.calls.append(("on_train_begin", args.output_dir, args.max_steps, args.learning_rate, sorted(kwargs)))

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.calls.append(("on_epoch_begin",))

    def on_step_begin(self, args, state, control, **kwargs):
        self.calls.append(("on_step_begin", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.calls.append(("on_step_end", state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.calls.append(("on_log", state.global_step, state.log_history[-1]["step"], "step" in logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.calls.append(("on_evaluate", "eval_reward" in metrics and not any("/" in k[:5] for k in metrics)))

    def on_save(self, args, state, control, **kwargs):
        self.calls.append(("on_save", state.global_step, Path(kwargs["checkpoint"]).name))

    def on_epoch_end(self, args, state, control, **kwargs):
        self.calls.append(("on_epoch_end",))

    def on_train_end(self, args, state, control, **kwargs):
        self.calls.append(("on_train_end", state.global_step, state.epoch))


@pytest.fixture(scope="module")
def stopped_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("callbacks") / "run"
    stop, watch = StopAtTwo(), Recorder()
    summary = grpolab.train(model=str(tiny_model_dir), out=str(out), report=True, callbacks=[stop, watch], **TINY)
    return out, summary, stop.calls, watch.calls


def test_a_callback_stops_the_run_after_the_step_it_chose(stopped_run):
    out, summary, _, _ = stopped_run
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]  # of steps=5
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000002"]
    assert summary["stopped"] == {"step": 2, "reason": "StopAtTwo.on_step_end returned True"}
    assert summary["eval_after"]["n"] == 4 and summary["steps"] == 2  # evaluated after the stop, as at an end
    assert json.loads((out / "summary.json").read_text())["stopped"]["step"] == 2
    assert (out / "report.html").is_file()


def test_the_hooks_come_in_order_with_the_metrics(stopped_run):
    _, _, calls, _ = stopped_run
    evals = [
        "eval/accuracy",
        "eval/accuracy_hi",
        "eval/accuracy_lo",
        "eval/ended_length_max",
        "eval/ended_length_mean",
        "eval/ended_length_min",
        "eval/extract/math/no_answer",
        "eval/extract/math/right",
        "eval/extract/math/wrong",
        "eval/length",
        "eval/length_max",
        "eval/length_min",
        "eval/pass@1",
        "eval/pass@1_hi",
        "eval/pass@1_lo",
        "eval/prompts",
        "eval/reward",
        "eval/reward/math/mean",
        "eval/reward/math/std",
        "eval/reward_std",
        "eval/samples_per_prompt",
        "eval/truncated_frac",
        "eval/zero_std_frac",
        "step",
    ]
    assert calls == [
        ("train_begin", 0, 5),
        ("evaluate", 0, evals),
        ("step_begin", 1),
        ("step_end", 1, 1, True),
        ("step_begin", 2),
        ("step_end", 2, 2, True),
        ("save", "step-000002"),
        ("evaluate", 2, evals),
        ("train_end", 2, 2, 4),
    ]  # log_history: the evaluation before, 2 steps, the evaluation after


def test_a_trainer_callback_is_called_as_transformers_calls_it(stopped_run, tmp_path):
    out, _, _, calls = stopped_run
    objects = ["eval_dataloader", "lr_scheduler", "model", "optimizer", "processing_class", "train_dataloader"]
    assert calls[0] == ("on_train_begin", str(out), 5, 2e-5, objects)  # transformers' CallbackHandler's kwargs
    assert calls[1:] == [
        ("on_epoch_begin",),
        ("on_log", 0, 0, False),
        ("on_evaluate", True),
        ("on_step_begin", 0),
        ("on_step_end", 1),
        ("on_log", 1, 1, False),
        ("on_step_begin", 1),
        ("on_step_end", 2),
        ("on_log", 2, 2, False),
        ("on_save", 2, "step-000002"),
        ("on_log", 2, 2, False),
        ("on_evaluate", True),
        ("on_epoch_end",),
        ("on_log", 2, 2, False),  # the closing row: train_runtime, train_loss, ...
        ("on_train_end", 2, 0.4),
    ]


class SaveThenStop(TrainerCallback):
    """Asks for a checkpoint after step 1 (control.should_save) and stops after step 3."""

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step == 1
        control.should_training_stop = state.global_step == 3
        return control


def test_trainer_control_saves_and_stops_a_cli_like_process_that_exits_0(tiny_model_dir, tmp_path):
    """In a process of its own: the run stops after step 3 of 5 with exit status 0, a checkpoint written
    at step 1 (should_save) and at step 3, the summary and the report."""
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import grpolab, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_callbacks import SaveThenStop, TINY
        grpolab.train(model={str(tiny_model_dir)!r}, out={str(out)!r}, report=True, callbacks=[SaveThenStop],
                      **{{**TINY, "eval_size": 0, "keep_checkpoints": 5}})
    """)
    )
    res = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000001", "step-000003"]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] == {"step": 3, "reason": "SaveThenStop.on_step_end set control.should_training_stop"}
    assert (out / "report.html").is_file()
    assert "stopped after step 3" in " ".join(res.stdout.split())


def test_the_adapter_fills_trainer_state_and_reads_the_control(tmp_path):
    """Without a run: grpolab's hooks drive a TrainerCallback; TrainerState's global_step, epoch and
    log_history follow; a control returned by a hook replaces the adapter's, as transformers does."""
    seen = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append((state.global_step, state.epoch, [r["step"] for r in state.log_history]))
            if state.global_step == 2:
                fresh = TrainerControl()
                fresh.should_training_stop = True
                return fresh

    cfg = build_config({}, [f"out={tmp_path}", "steps=4"])
    hooks = Callbacks([Watch()])
    (adapter,) = hooks.items
    assert isinstance(adapter, TrainerCallbackAdapter)
    hooks.begin(cfg, tmp_path, 0)
    assert isinstance(adapter.args, TrainingArguments) and isinstance(adapter.state, TrainerState)
    assert adapter.args.output_dir == str(tmp_path) and adapter.args.report_to == []
    for step in (1, 2):
        hooks.step_begin(step)
        hooks.step_end(step, {"step": step, "reward/mean": 0.5})
        hooks.listener({"step": step, "reward/mean": 0.5})
        assert hooks.should_stop == (step == 2)
    assert seen == [(1, 0.25, []), (2, 0.5, [1])]
    # TRL's names; at step 2 the hook's fresh control (should_log False) replaced DefaultFlowCallback's, so no
    # row is logged there, as in transformers
    assert [(r["reward"], r["step"]) for r in adapter.state.log_history] == [(0.5, 1)]
    assert "reward/mean" not in adapter.state.log_history[0]
    assert hooks.state.stop_reason == "Watch.on_step_end set control.should_training_stop"


def test_state_stop_and_class_callbacks(tmp_path):
    class ViaState:
        def on_step_end(self, state, metrics):
            if metrics["kl"] > 0.1:
                state.stop("kl over 0.1")

    hooks = Callbacks([ViaState, StopAtTwo()])  # a class is instantiated, as transformers does
    hooks.begin(build_config({}, [f"out={tmp_path}"]), tmp_path, 0)
    hooks.step_begin(1)
    hooks.step_end(1, {"step": 1, "kl": 0.05, "reward/mean": 0})
    assert not hooks.should_stop
    hooks.step_begin(2)
    hooks.step_end(2, {"step": 2, "kl": 0.2, "reward/mean": 0})
    assert hooks.should_stop and hooks.state.stop_reason == "kl over 0.1"  # the first reason is kept
    assert isinstance(hooks.state, TrainingState) and hooks.state.step == 2


@pytest.mark.parametrize("bad", [lambda state: None, object(), "on_step_end", [42]])
def test_a_bad_callback_is_refused_before_the_run(bad, tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"callbacks\[0\]: .* has none of the hooks"):
        as_callbacks(bad)
    out = tmp_path / "never"
    with pytest.raises(ConfigError, match="callbacks"):
        grpolab.train(model=str(tiny_model_dir), out=str(out), callbacks=bad, **TINY)
    assert not out.exists()
