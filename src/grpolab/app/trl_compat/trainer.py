"""GRPOTrainer: the object a TRL 1.16 script holds, with grpolab's run inside.

    from grpolab import GRPOConfig, GRPOTrainer          # was: from trl import ...

    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), processing_class=tok,
                          reward_funcs=reward_len, args=GRPOConfig(output_dir="runs/x"), train_dataset=ds)
    trainer.train()                 # grpolab.train on the mapped config, training trainer.model in place
    trainer.state.log_history       # TRL's rows: per optimizer update, TRL's metric names
    trainer.evaluate()              # {"eval_reward": ..., ...}
    trainer.save_model()            # trainer.model (the trained weights) with save_pretrained
    trainer.ref_model               # the KL term's frozen reference (None when beta == 0.0 or with PEFT)
    get_last_checkpoint(OUT)        # OUT/checkpoint-N (N in optimizer steps; grpolab.training.checkpoint_views)

It is one thin layer over the Run the command line drives (grpolab.app.api.train -> grpolab.training.trainer):
the model object (or the one loaded from a name or directory here, as TRL loads it) and the tokenizer are
handed to the run, which trains that object; `state` is the transformers TrainerState the run's callbacks
keep in optimizer updates (grpolab.training.callbacks.transformers_adapter), and metrics.jsonl keeps grpolab's
names (grpolab.training.trl_names maps the two). Everything is checked when the trainer is built, as TRL
checks it: a refused field, a reward model, a dataset without a `prompt` column raise ConfigError (exit 2 on
the command line).
"""

from __future__ import annotations

import os
from pathlib import Path

from grpolab.app.trl_compat import data as trl_data
from grpolab.app.trl_compat.accelerator import Accelerator
from grpolab.app.trl_compat.checks import (
    check_sources,
    environment_rewards,
    environment_tools,
    reward_func_name,
    reward_weight_tensor,
    router_aux_loss,
    stream_loader_settings,
    warn_sequence_level,
)
from grpolab.app.trl_compat.config import GRPOConfig, trl_recipe
from grpolab.app.trl_compat.entries import value_of
from grpolab.app.trl_compat.inputs import (
    check_peft,
    lora_settings,
    model_name,
    policy_of,
    reference_model,
    reward_specs,
    source_of,
    wrap_peft,
    wrapped_targets,
)
from grpolab.app.trl_compat.rewards import processing_classes
from grpolab.util.fields import ConfigError


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
        from transformers import TrainerControl

        from grpolab.training.callbacks.transformers_adapter import TrainerCallbackAdapter, new_state

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
        self.args = args if args is not None else GRPOConfig(output_dir=f"{model_name(model)}-GRPO")
        check_sources(self.args, reward_funcs, train_dataset, environment_factory)
        self.recipe, self.notes, weights = trl_recipe(self.args)  # refused fields raise here
        warn_sequence_level(self.args)
        self.reward_specs = (
            reward_specs(reward_funcs, weights, reward_processing_classes) if reward_funcs is not None else None
        )
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        funcs = [f for f in funcs if f is not None]
        self.reward_processing_classes = processing_classes(reward_processing_classes, len(funcs))
        own = environment_rewards(environment_factory)  # TRL's columns of get_reward, weight 1 each
        self.reward_funcs = funcs + [fn for _, fn in own]
        self.reward_func_names = [reward_func_name(spec) for spec in self.reward_specs or []] + [n for n, _ in own]
        self.reward_weights = reward_weight_tensor(
            [s.get("weight", 1.0) for s in self.reward_specs or []] + [1.0] * len(own)
        )
        self.environment_factory, self._tools = environment_factory, tools
        self.tools = environment_tools(environment_factory, tools)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.train_rows = None
        if train_dataset is not None:
            self.train_rows, reading = trl_data.trl_reading(
                train_dataset, self.recipe, environment=environment_factory is not None, eval_given=False
            )
            self.recipe["task_args"] = reading["task_args"]
            self.recipe.update({k: v for k, v in reading.items() if k in ("shuffle",)})
            if trl_data.is_stream(train_dataset):
                stream_loader_settings(self.args)
        self.eval_sets = trl_data.eval_sets(eval_dataset) if eval_dataset is not None else None
        self.eval_rows = (
            trl_data.rows_of(eval_dataset, "eval_dataset") if eval_dataset is not None and not self.eval_sets else None
        )
        if self.eval_sets and str(value_of(self.args.eval_strategy)) != "no":
            raise ConfigError(
                f"eval_dataset: several evaluation sets ({', '.join(self.eval_sets)}) with eval_strategy="
                f"{value_of(self.args.eval_strategy)!r}: grpolab's training run evaluates one set; give one set, or "
                f"keep eval_strategy='no' and call trainer.evaluate() (which evaluates each)"
            )
        self.recipe["model"] = source_of(model)
        path = str(model) if isinstance(model, (str, Path)) else None
        if peft_config is not None:
            check_peft(peft_config)  # before the model is loaded or wrapped
        module, self.processing_class = policy_of(model, processing_class)
        self.model = wrap_peft(module, peft_config)  # TRL wraps it here too: trainer.model is the peft model
        self.beta = float(self.args.beta)
        self.ref_model = reference_model(self.model, self.beta)  # the run's reference (train() hands it over)
        self.aux_loss_enabled, self.router_aux_loss_coef = router_aux_loss(self.model, self.args)
        self.recipe["lora"] = lora_settings(peft_config, path, wrapped=wrapped_targets(self.model, peft_config))
        self.model_wrapped = self.model
        self.accelerator = Accelerator()
        self.optimizer = self.lr_scheduler = None
        self.summary: dict | None = None
        self._adapter = TrainerCallbackAdapter(list(callbacks or []), args=self.args, views=True)
        self._adapter.handler.model, self._adapter.handler.processing_class = self.model, self.processing_class
        self.state = self._adapter.state = new_state(self.args, 0)
        self.control = TrainerControl()
        self.callback_handler.on_init_end(self.args, self.state, self.control)

    # -- the Trainer's small methods -------------------------------------------------------------------------

    @property
    def entropy_coef(self) -> float:
        """TRL's entropy coefficient: args.entropy_coef, then the adaptive control's after each update."""
        log = self._adapter.log
        return log.entropy_coef if log is not None and log.entropy_coef is not None else float(self.args.entropy_coef)

    @property
    def callback_handler(self):
        """transformers' CallbackHandler holding the callbacks (DefaultFlowCallback first)."""
        return self._adapter.handler

    def add_callback(self, callback) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback) -> None:
        self.callback_handler.remove_callback(callback)

    def is_world_process_zero(self) -> bool:
        return self.accelerator.is_main_process

    def is_local_process_zero(self) -> bool:
        return self.accelerator.is_local_main_process

    @property
    def output_dir(self) -> Path:
        return Path(self.recipe["out"])

    def log(self, logs: dict, start_time: float | None = None) -> None:
        """transformers' Trainer.log: the row (with epoch) into state.log_history, then the callbacks' on_log."""
        logs = dict(logs)
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    def log_metrics(self, split: str, metrics: dict) -> None:
        from transformers.trainer_pt_utils import log_metrics

        log_metrics(self, split, metrics)

    def metrics_format(self, metrics: dict) -> dict:
        from transformers.trainer_pt_utils import metrics_format

        return metrics_format(metrics)

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        from transformers.trainer_pt_utils import save_metrics

        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        save_metrics(self, split, metrics, combined)

    def save_state(self) -> None:
        """state as OUT/trainer_state.json (transformers' format)."""
        if self.is_world_process_zero():
            Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))

    def end(self) -> None:
        """transformers' Trainer.end: finishes the trackers (grpolab's close at the end of train())."""

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """OUT/README.md: a short model card (the base model, the dataset, the method, the tags)."""
        if not self.is_world_process_zero():
            return
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        lines = [
            "---",
            f"base_model: {self.recipe.get('model', '')}",
            f"tags: [{', '.join(['grpo', 'grpolab', *tags])}]",
            "---",
            "",
            f"# {model_name or Path(self.args.output_dir).name}",
            "",
            f"Trained with GRPO by grpolab{f' on {dataset_name}' if dataset_name else ''}.",
            "",
        ]
        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.args.output_dir) / "README.md").write_text("\n".join(lines))

    def push_to_hub(self, *args, **kwargs):
        raise ConfigError(
            "push_to_hub: refused: grpolab never contacts the Hugging Face Hub; upload output_dir yourself"
        )

    # -- training, evaluation, saving ------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: bool | str | None = None, trial=None, ignore_keys_for_eval=None):
        """grpolab.train on the mapped config, training trainer.model in place. resume_from_checkpoint: True
        (output_dir's newest checkpoint) or a checkpoint directory continues that run to this trainer's
        max_steps. Returns transformers' TrainOutput(global_step in optimizer updates, training_loss, metrics)."""
        from rich.console import Console
        from transformers.trainer_utils import TrainOutput

        from grpolab.app import api

        if trial is not None:
            raise ConfigError("trial: refused: grpolab has no hyperparameter search")
        console = Console()
        for note in self.notes:
            console.print(f"TRL compatibility: {note}")
        recipe = dict(self.recipe)
        kwargs: dict = {
            "environment_factory": self.environment_factory,
            "tools": self._tools,
            "console": console,
            "callbacks": [self._adapter],
            "policy": self.model,
            "tokenizer": self.processing_class,
            "reference": self.ref_model,
        }
        if self.train_rows is not None:
            kwargs["dataset"] = self.train_rows
        if self.eval_rows is not None:
            kwargs["eval_dataset"] = self.eval_rows
            recipe["task_args"] = {k: v for k, v in recipe.get("task_args", {}).items() if k != "eval_size"}
        elif self.train_rows is not None:
            recipe["eval_size"] = 0  # TRL evaluates eval_dataset only
        if resume_from_checkpoint:
            kwargs["resume"] = str(self._run_of(resume_from_checkpoint))
            # a larger max_steps trains on; ignore_data_skip is read on resume, as the Trainer reads it
            kwargs.update({k: recipe[k] for k in ("steps", "ignore_data_skip") if k in recipe})
            recipe = None
            self.state = self._adapter.state = self._resumed_state(kwargs["resume"])
        self.summary = api.train(recipe, rewards=self.reward_specs, **kwargs)
        self.state = self._adapter.state
        if self.args.load_best_model_at_end:
            self._load_best_model()
        metrics = {k: v for k, v in self._adapter.output.items() if k != "total_flos"}  # as TRL returns them
        return TrainOutput(self.state.global_step, metrics.get("train_loss", 0.0), metrics)

    def _load_best_model(self) -> None:
        """transformers' load_best_model_at_end: the best model's weights (output_dir/checkpoints/best, which
        save_best wrote: full weights, or the LoRA adapter) loaded into trainer.model in place when train()
        ends; nothing where no evaluation kept one."""
        best = (self.summary or {}).get("best")
        if not best:
            return
        from grpolab.training.checkpoint import _load_model_weights  # the loader of checkpoints and their copies

        _load_model_weights(Path(best["path"]), self.model)

    def _run_of(self, resume) -> Path:
        """The run directory a resume_from_checkpoint names: True -> output_dir; a checkpoint's directory -> the
        run holding it; a run directory as it is."""
        if resume is True:
            return self.output_dir
        path = Path(str(resume))
        return path.parent if (path / "trainer_state.json").is_file() and not (path / "config.yaml").is_file() else path

    def _resumed_state(self, run: str):
        """The TrainerState saved with the run's newest checkpoint, in its OUT/checkpoint-N (log_history, the
        tokens seen, the best metric: continued as TRL continues them), or this trainer's own where there is none."""
        from grpolab.training.checkpoint import latest_checkpoint
        from grpolab.training.checkpoint_views import saved_state

        ck = latest_checkpoint(Path(run))
        saved = saved_state(ck) if ck is not None else None
        return saved if saved is not None else self.state

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """grpolab's held-out evaluation of trainer.model on eval_dataset (default: the trainer's), with TRL's
        metric names (eval_reward, eval_completions/mean_length, ...; grpolab's own after them), logged into
        state.log_history and passed to the callbacks' on_evaluate. Several sets (a dict or DatasetDict):
        each evaluated in turn, as transformers does, its metrics named eval_<name>_... Returns the metrics."""
        from grpolab.app.trl_compat.evaluate import evaluate_rows

        sets = trl_data.eval_sets(eval_dataset) if eval_dataset is not None else self.eval_sets
        if sets:  # transformers: each set evaluated in turn, its metrics named {prefix}_{name}_...
            metrics: dict = {}
            for name, set_rows in sets.items():
                metrics.update(self.evaluate(set_rows, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        rows = trl_data.rows_of(eval_dataset, "eval_dataset") if eval_dataset is not None else self.eval_rows
        if rows is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        row = evaluate_rows(self, rows, float(self.state.num_input_tokens_seen))
        row = {(f"{metric_key_prefix}_{k[5:]}" if k.startswith("eval_") else k): v for k, v in row.items()}
        row["epoch"] = self.state.epoch
        self.state.log_history.append({**row, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, row)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, row)
        return row

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> Path:
        """trainer.model with save_pretrained (a peft model: its adapter, as TRL saves it) and the tokenizer,
        into output_dir (default: args.output_dir)."""
        target = Path(output_dir) if output_dir is not None else Path(self.args.output_dir)
        target.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(target), safe_serialization=True)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(str(target))
        return target


__all__ = ["GRPOTrainer"]
