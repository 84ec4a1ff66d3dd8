"""GRPOTrainer with TRL's constructor and methods, running grpolab.

    from grpolab import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(model="smollm2-135m", reward_funcs=reward_len, args=GRPOConfig(output_dir="runs/x"),
                          train_dataset=dataset)
    trainer.train()                  # grpolab.train with the config the mapping table gives
    trainer.save_model("runs/x/final")   # a Hugging Face model directory (LoRA merged)

Everything is checked when the trainer is built, as TRL checks it: a refused field, a reward model given
by a hub id (grpolab never downloads; a local directory or a loaded model is scored as TRL scores it:
grpolab.app.trl_compat.rewards), a dataset without a `prompt` column raise ConfigError (exit 2 on the
command line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from grpolab.app.trl_compat import data as trl_data
from grpolab.app.trl_compat.config import GRPOConfig, trl_recipe
from grpolab.util.fields import ConfigError

PEFT_FIELDS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout"}
PEFT_DEFAULTS = {
    "bias": "none",
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "layers_to_transform": None,
    "init_lora_weights": True,
}


class TrainOutput(NamedTuple):
    """What Trainer.train returns in transformers: the steps, the mean training loss, the metrics (here the
    run's summary, OUT/summary.json)."""

    global_step: int
    training_loss: float
    metrics: dict


def _model_name(model: Any) -> str:
    if isinstance(model, (str, Path)):
        return Path(str(model)).name
    return str(getattr(getattr(model, "config", None), "_name_or_path", "model")).rstrip("/").split("/")[-1]


def _reward_specs(reward_funcs: Any, weights: list[float] | None, processing_classes: Any = None) -> list[dict]:
    """reward_funcs -> grpolab reward specs: functions, grpolab reward names, reward models (a local
    directory or a loaded model, with reward_processing_classes); a hub id is refused
    (grpolab.app.trl_compat.rewards)."""
    from grpolab.app.trl_compat.rewards import reward_specs

    return reward_specs(reward_funcs, weights, processing_classes)


def _lora(peft_config: Any, model_path: str | None) -> dict:
    """peft's LoraConfig -> grpolab's lora.* (target_modules None: peft's default for the model type)."""
    if peft_config is None:
        return {}
    if type(peft_config).__name__ != "LoraConfig":
        raise ConfigError(f"peft_config: refused: grpolab trains LoRA adapters only, got {type(peft_config).__name__}")
    for key, default in PEFT_DEFAULTS.items():
        if (
            getattr(peft_config, key, default) not in (default, None, False)
            and getattr(peft_config, key, default) != default
        ):
            raise ConfigError(
                f"peft_config.{key}={getattr(peft_config, key)!r}: refused: grpolab's adapter is "
                f"plain LoRA ({key}={default!r})"
            )
    out = {dst: getattr(peft_config, src) for src, dst in PEFT_FIELDS.items()}
    targets = peft_config.target_modules
    if targets is None:
        targets = _peft_default_targets(model_path)
    out["target_modules"] = targets if isinstance(targets, str) else sorted(targets)
    return out


def _peft_default_targets(model_path: str | None) -> list[str]:
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    kind = None
    if model_path is not None and (Path(model_path) / "config.json").exists():
        kind = json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    if kind not in DEFAULTS:
        raise ConfigError(
            "peft_config.target_modules: None means peft's default for the model type, which grpolab "
            "cannot tell for this model; name the modules (e.g. 'all-linear')"
        )
    return list(DEFAULTS[kind])


class GRPOTrainer:
    """TRL's GRPOTrainer, running grpolab (module docstring). Arguments as TRL 1.16's; `optimizers`,
    `quantization_config` and `rollout_func` are refused when given."""

    def __init__(
        self,
        model,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        for name, value, why in (
            (
                "optimizers",
                None if optimizers == (None, None) else optimizers,
                "grpolab builds its AdamW from the config (learning_rate, adam_beta1/2, weight_decay)",
            ),
            ("quantization_config", quantization_config, "grpolab trains fp32 weights (no bitsandbytes)"),
            ("rollout_func", rollout_func, "use environment_factory or tools for custom rollouts"),
        ):
            if value is not None:
                raise ConfigError(f"{name}: refused: {why}")
        if reward_funcs is None and environment_factory is None:
            raise ConfigError(
                "reward_funcs: give reward functions (or an environment_factory whose environment has get_reward)"
            )
        self.args = args if args is not None else GRPOConfig(output_dir=f"{_model_name(model)}-GRPO")
        self.recipe, self.notes, weights = trl_recipe(self.args)  # refused fields raise here
        self.model = model
        self.processing_class = processing_class
        self.callbacks = list(callbacks or [])
        self.environment_factory, self.tools = environment_factory, tools
        self.reward_specs = (
            _reward_specs(reward_funcs, weights, reward_processing_classes) if reward_funcs is not None else None
        )
        self.train_rows = trl_data.rows_of(train_dataset, "train_dataset") if train_dataset is not None else None
        self.eval_rows = trl_data.rows_of(eval_dataset, "eval_dataset") if eval_dataset is not None else None
        model_path = str(model) if isinstance(model, (str, Path)) else None
        self.recipe["lora"] = _lora(peft_config, model_path)
        if self.train_rows is not None:
            self.recipe["task_args"] = trl_data.task_args(self.train_rows, environment_factory is not None)
        if processing_class is not None and model_path is not None:
            self._check_processing_class(processing_class, model_path)
        self.summary: dict | None = None

    @staticmethod
    def _check_processing_class(tok: Any, model_path: str) -> None:
        from grpolab.model.load import model_dir

        named = getattr(tok, "name_or_path", None)
        try:
            same = (
                named is not None
                and Path(model_dir(model_path, log=lambda *_: None)).resolve() == Path(named).resolve()
            )
        except (ConfigError, OSError):
            same = False
        if not same:
            raise ConfigError(
                "processing_class: grpolab reads the tokenizer (and chat template) from the model "
                "directory; save yours there (processing_class.save_pretrained(MODEL_DIR)) and leave "
                "processing_class out"
            )

    @property
    def output_dir(self) -> Path:
        return Path(self.recipe["out"])

    def _model_setting(self) -> str:
        if isinstance(self.model, (str, Path)):
            return str(self.model)
        if not hasattr(self.model, "save_pretrained"):
            raise ConfigError(
                f"model: expected a model name or directory, or a transformers model, got {type(self.model).__name__}"
            )
        path = self.output_dir / "initial_model"  # a model object: saved once, as the run's starting weights
        self.model.save_pretrained(str(path))
        if self.processing_class is None:
            raise ConfigError("processing_class: a model object needs its tokenizer (processing_class=...)")
        self.processing_class.save_pretrained(str(path))
        return str(path)

    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Run grpolab.train on the mapped config; resume_from_checkpoint (True or the output_dir) continues
        the run in output_dir. Returns TrainOutput(global_step, training_loss, metrics=summary)."""
        from rich.console import Console

        from grpolab.app import api

        console = Console()
        for note in self.notes:
            console.print(f"TRL compatibility: {note}")
        recipe = dict(self.recipe)
        recipe["model"] = self._model_setting() if not resume_from_checkpoint else recipe.get("model", "")
        kwargs: dict = {"environment_factory": self.environment_factory, "tools": self.tools, "console": console}
        if self.callbacks:
            kwargs["callbacks"] = self.callbacks
        if self.train_rows is not None:
            kwargs["dataset"] = self.train_rows
        if self.eval_rows is not None:
            kwargs["eval_dataset"] = self.eval_rows
            recipe["task_args"] = {k: v for k, v in recipe.get("task_args", {}).items() if k != "eval_size"}
        elif self.train_rows is not None:
            recipe["eval_size"] = 0  # TRL evaluates eval_dataset only
        if resume_from_checkpoint:
            kwargs["resume"] = str(self.output_dir)
            recipe = None
        self.summary = api.train(recipe, rewards=self.reward_specs, **kwargs)
        losses = [m.get("loss/policy") for m in _metrics(self.output_dir)]
        losses = [x for x in losses if isinstance(x, (int, float))]
        return TrainOutput(
            int(self.summary.get("steps", 0)), sum(losses) / len(losses) if losses else float("nan"), self.summary
        )

    def save_model(self, output_dir: str | None = None) -> Path:
        """The run's newest checkpoint as a Hugging Face model directory (a LoRA adapter merged into the
        weights), written to output_dir (default: args.output_dir, beside the run's files)."""
        import torch

        from grpolab.app.export import checkpoint_of
        from grpolab.model.load import load_policy
        from grpolab.model.lora import is_peft

        target = Path(output_dir) if output_dir is not None else self.output_dir
        ck = checkpoint_of(self.output_dir, log=lambda *_: None)
        model = load_policy(ck, torch.device("cpu"))
        if is_peft(model):
            model = model.merge_and_unload()
        from transformers import AutoTokenizer

        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(target), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(ck)).save_pretrained(str(target))
        return target


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


__all__ = ["GRPOTrainer", "TrainOutput"]
