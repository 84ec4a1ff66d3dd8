"""TRL's fields around the steps mean in grpolab what transformers 5.x and TRL 1.16 do with them, checked against
the installed libraries: tf32 (transformers' TF32 switch, and its refusal on a CPU), full_determinism
(enable_full_determinism's state), eval_delay (DefaultFlowCallback's schedule), optim_args and
optim_target_modules (what transformers' AdamW reads), label_smoothing_factor (TRL's GRPO loss), the
continuous-batching fields (TRL's generation config), and the fields that are only stored
(resume_from_checkpoint, enable_jit_checkpoint). The runs that use them are tests/test_trl_run_fields_e2e.py."""

from __future__ import annotations

import os
import random

import pytest
import torch

from grpolab import GRPOConfig
from grpolab.app.trl_compat import trl_recipe
from grpolab.app.trl_compat.fields import TABLE
from grpolab.app.trl_compat.fields_precision import tf32_setting
from grpolab.model import numerics
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

transformers = pytest.importorskip("transformers")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a CUDA GPU")


@pytest.fixture()
def torch_state(monkeypatch):
    """Put back what tf32 and full_determinism change process-wide (and the environment they write)."""
    for k in numerics.DETERMINISM_ENV:
        monkeypatch.delenv(k, raising=False)
    before = (
        torch.backends.fp32_precision,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.backends.fp32_precision = before[0]
    torch.use_deterministic_algorithms(before[1], warn_only=before[2])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[3], before[4]


def _recipe(**fields) -> dict:
    return trl_recipe(GRPOConfig(**fields))[0]


def test_the_refused_fields_are_only_what_cannot_apply():
    fields = {
        "tf32",
        "full_determinism",
        "eval_delay",
        "save_only_model",
        "enable_jit_checkpoint",
        "resume_from_checkpoint",
        "label_smoothing_factor",
        "optim_args",
        "ignore_data_skip",
        "use_transformers_continuous_batching",
        "transformers_continuous_batching_config",
        "use_transformers_paged",
        "optim_target_modules",
    }
    assert {name for name in fields if TABLE[name].kind == "refuse"} == set()


@NO_GPU
def test_tf32_true_on_a_cpu_is_refused_as_transformers_refuses_it(tmp_path, torch_state):
    with pytest.raises(ValueError, match="requires Ampere") as theirs:
        transformers.TrainingArguments(output_dir=str(tmp_path), tf32=True, use_cpu=True)
    assert str(theirs.value) == numerics.TF32_UNAVAILABLE
    with pytest.raises(ConfigError, match="tf32=True") as ours:
        trl_recipe(GRPOConfig(tf32=True))
    assert numerics.TF32_UNAVAILABLE in str(ours.value)
    cfg = build_config({"tf32": True})  # grpolab's own setting: refused when the run starts (exit 2)
    with pytest.raises(ConfigError, match="tf32=true"):
        numerics.start_numerics(cfg.seed, cfg.tf32, cfg.full_determinism)


@NO_GPU
@pytest.mark.parametrize("value", [False, None])
def test_tf32_false_or_none_on_a_cpu_changes_nothing_as_in_transformers(value, tmp_path, torch_state):
    def state():
        return torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision

    before = state()
    transformers.TrainingArguments(output_dir=str(tmp_path), tf32=value, use_cpu=True, torch_compile=True)
    assert state() == before  # transformers: no TF32 GPU, nothing switched, even for torch_compile
    recipe = _recipe(tf32=value, torch_compile=True, gradient_checkpointing=False)
    assert recipe.get("tf32") == value if value is not None else "tf32" not in recipe
    numerics.start_numerics(0, recipe.get("tf32"))
    assert state() == before


@pytest.mark.parametrize("enable", [True, False])
def test_tf32_on_a_tf32_gpu_sets_what_transformers_enable_tf32_sets(enable, monkeypatch, torch_state):
    """On a GPU of the Ampere generation or newer (made so here): grpolab's switch leaves torch as transformers'
    enable_tf32 leaves it (torch >= 2.9: the generic fp32_precision)."""
    from transformers.utils.import_utils import enable_tf32

    torch.backends.fp32_precision = "none"
    enable_tf32.__wrapped__(enable)  # (lru_cached in transformers: the function itself)
    theirs = torch.backends.fp32_precision
    torch.backends.fp32_precision = "none"
    monkeypatch.setattr(numerics, "tf32_available", lambda: True)
    numerics.apply_tf32(enable)
    assert torch.backends.fp32_precision == theirs == ("tf32" if enable else "ieee")


@pytest.mark.parametrize(
    "fields",
    [
        {"torch_compile": True},
        {"torch_compile_backend": "inductor"},
        {"torch_compile": True, "bf16": False},
        {"torch_compile": True, "fp16": True, "bf16": False},
        {"torch_compile": True, "tf32": False},
        {"tf32": True},
        {"tf32": False},
        {},
    ],
)
def test_tf32_under_torch_compile_follows_transformers_on_a_tf32_gpu(fields, tmp_path, monkeypatch):
    """transformers turns TF32 on for torch_compile on a TF32 GPU unless fp16 (bf16 aside), and an explicit tf32
    then wins: the last enable_tf32 call of TrainingArguments (made on a TF32 GPU) is grpolab's tf32."""
    import transformers.training_args as ta

    calls: list[bool] = []
    monkeypatch.setattr(ta, "is_torch_tf32_available", lambda: True)
    monkeypatch.setattr(ta, "enable_tf32", calls.append)
    monkeypatch.setattr(numerics, "tf32_available", lambda: True)
    bf16 = fields.get("bf16", True)  # TRL's GRPOConfig: bf16 unless fp16
    theirs = {k: v for k, v in fields.items() if k != "bf16"}
    transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=bf16, **theirs)
    values = {name: e.default for name, e in TABLE.items()} | fields
    ours = tf32_setting(values["tf32"], values)
    assert ours.get("tf32") == (calls[-1] if calls else None)


def test_full_determinism_sets_what_enable_full_determinism_sets(monkeypatch, torch_state):
    from transformers.trainer_utils import enable_full_determinism

    def state():
        return (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            {k: os.environ.get(k) for k in numerics.DETERMINISM_ENV},
            torch.rand(2).tolist(),
            random.random(),
        )

    enable_full_determinism(7)
    theirs = state()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    for k in numerics.DETERMINISM_ENV:
        monkeypatch.delenv(k)
    assert _recipe(full_determinism=True, seed=7)["full_determinism"] is True
    numerics.start_numerics(7, None, full_determinism=True)
    assert state() == theirs
    assert theirs[0] and theirs[4]["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def _their_evaluations(max_steps: int, eval_steps: int, eval_delay: float) -> list[int]:
    """The optimizer steps at which transformers' DefaultFlowCallback evaluates."""
    from transformers import DefaultFlowCallback, TrainerControl, TrainerState

    args = transformers.TrainingArguments(
        output_dir="unused", eval_strategy="steps", eval_steps=eval_steps, eval_delay=eval_delay, use_cpu=True
    )
    state = TrainerState(max_steps=max_steps, eval_steps=eval_steps, logging_steps=500, save_steps=500)
    flow, out = DefaultFlowCallback(), []
    for g in range(1, max_steps + 1):
        state.global_step = g
        if flow.on_step_end(args, state, TrainerControl()).should_evaluate:
            out.append(g)
    return out


@pytest.mark.parametrize(
    "max_steps, eval_steps, eval_delay, num_iterations",
    [(12, 2, 5, 1), (12, 4, 0, 1), (13, 3, 7.5, 1), (16, 4, 6, 2), (12, 4, 30, 1), (8, 2, 1, 2)],
)
def test_eval_delay_evaluates_at_the_steps_transformers_does(max_steps, eval_steps, eval_delay, num_iterations):
    """grpolab's Evaluator.due over its steps (TRL's optimizer steps / per) against DefaultFlowCallback's."""
    from types import SimpleNamespace

    from grpolab.training.evaluation import Evaluator

    recipe = _recipe(
        max_steps=max_steps,
        eval_strategy="steps",
        eval_steps=eval_steps,
        eval_delay=eval_delay,
        num_iterations=num_iterations,
    )
    cfg = build_config({**recipe, "eval_size": 8})
    evaluator = SimpleNamespace(run=SimpleNamespace(cfg=cfg), every=cfg.eval_steps)  # what due() reads
    ours = [s * num_iterations for s in range(1, cfg.steps + 1) if Evaluator.due(evaluator, s)]  # type: ignore[arg-type]
    assert ours == _their_evaluations(max_steps, eval_steps, eval_delay)


def test_eval_delay_without_step_evaluation_changes_nothing():
    assert _recipe(eval_delay=3) == _recipe()
    with pytest.raises(ConfigError, match="eval_delay"):
        build_config({"eval_delay": -1})


def _optimizer(**fields):
    from transformers import Trainer

    args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, **fields)
    model = torch.nn.Linear(2, 2)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls, kwargs


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused"])
def test_optim_args_and_target_modules_are_not_read_by_transformers_adamw(optim):
    plain = _optimizer(optim=optim)
    assert _optimizer(optim=optim, optim_args="beta1=0.5,eps=1e-3,weight_decay=0.3") == plain
    assert _optimizer(optim=optim, optim_target_modules=["q_proj", "v_proj"]) == plain
    base = _recipe(optim=optim)
    assert _recipe(optim=optim, optim_args="beta1=0.5, eps=1e-3") == base
    assert _recipe(optim=optim, optim_target_modules=["q_proj"]) == base


def test_a_malformed_optim_args_fails_as_in_transformers():
    with pytest.raises(ValueError):
        _optimizer(optim="adamw_torch", optim_args="beta1")
    with pytest.raises(ConfigError, match="optim_args='beta1'"):
        _recipe(optim_args="beta1")


def test_resume_from_checkpoint_and_jit_checkpoint_are_stored_only():
    trl = pytest.importorskip("trl")
    args = GRPOConfig(resume_from_checkpoint="runs/x/checkpoint-4", enable_jit_checkpoint=True)
    assert args.resume_from_checkpoint == "runs/x/checkpoint-4"  # scripts read it and pass it to train()
    assert trl_recipe(args)[0] == _recipe()
    theirs = trl.GRPOConfig(output_dir="unused", resume_from_checkpoint="runs/x/checkpoint-4", use_cpu=True)
    assert theirs.resume_from_checkpoint == "runs/x/checkpoint-4"


def test_label_smoothing_does_not_change_trls_grpo_loss(tiny_model_dir, tmp_path):
    """TRL's GRPOTrainer on the same forced completions with and without label_smoothing_factor: the same loss,
    gradient norm and learning rates (its compute_loss never calls the Trainer's label smoother)."""
    pytest.importorskip("trl")
    from trl_parity import trl_config, trl_step

    torch.manual_seed(0)
    plain = trl_step(tiny_model_dir, trl_config(tmp_path / "a"))
    torch.manual_seed(0)
    smoothed = trl_step(tiny_model_dir, trl_config(tmp_path / "b", label_smoothing_factor=0.1))
    assert smoothed == plain
    assert _recipe(label_smoothing_factor=0.1) == _recipe()


def test_continuous_batching_samples_with_trls_generation_config(tiny_model_dir, tmp_path):
    """TRL builds the same GenerationConfig with use_transformers_continuous_batching; grpolab's rollout engine
    samples with those settings (the same recipe), noting the weights TRL would cast; a config that is not
    ContinuousBatchingConfig's is refused by both."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl_parity import trl_config

    def trainer(**fields):
        return GRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=lambda completions, **k: [0.0] * len(completions),
            args=trl_config(tmp_path / "t", temperature=0.7, top_k=5, **fields),
            train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        )

    plain = trainer().generation_config.to_dict()
    batched = trainer(use_transformers_continuous_batching=True, transformers_continuous_batching_config={"seed": 1})
    assert batched.generation_config.to_dict() == plain and batched.continuous_batching_config.seed == 1
    with pytest.raises(TypeError):
        trainer(use_transformers_continuous_batching=True, transformers_continuous_batching_config={"nope": 1})
    recipe, notes, _ = trl_recipe(GRPOConfig(use_transformers_continuous_batching=True))
    assert recipe == _recipe() and any("cast the model's weights to bf16" in n for n in notes)
    _, notes, _ = trl_recipe(GRPOConfig(use_transformers_paged=True, bf16=False))
    assert notes == [
        "use_transformers_continuous_batching=True: grpolab's rollout engine samples with the same settings"
    ]
    with pytest.raises(ConfigError, match="ContinuousBatchingConfig"):
        _recipe(use_transformers_continuous_batching=True, transformers_continuous_batching_config={"nope": 1})


def test_the_trl_command_line_points_a_resume_from_checkpoint_to_resume(capsys):
    from grpolab.app.cli import main

    assert main(["train", "--trl", "resume_from_checkpoint=runs/x/checkpoint-4"]) == 2
    said = " ".join("".join(capsys.readouterr()).split())
    assert "resume_from_checkpoint='runs/x/checkpoint-4'" in said and "grpolab train --resume OUTPUT_DIR" in said
