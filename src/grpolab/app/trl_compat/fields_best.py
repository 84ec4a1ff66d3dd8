"""TRL's best-model fields (transformers' TrainingArguments) -> grpolab's save_best and save_best_higher.

What transformers 5 does with them (TrainingArguments.__post_init__, Trainer.__init__,
Trainer._determine_best_metric, Trainer.train's end):

    metric_for_best_model   None with load_best_model_at_end -> "loss" (eval_loss); "eval_" is added where the
                            name lacks it; a name the evaluation's metrics lack raises KeyError naming them
    greater_is_better       None -> not metric_for_best_model.endswith("loss")
    save_strategy="best"    a checkpoint at each evaluation that improves the metric; without a metric
                            (and without load_best_model_at_end) the Trainer raises
    load_best_model_at_end  the best checkpoint's weights loaded into the model when train() ends

grpolab keeps the best model in OUT/checkpoints/best (save_best, by the evaluation metric of grpolab's name that
TRL's names: grpolab.training.trl_names), compared as greater_is_better says (save_best_higher), and a
GRPOTrainer loads it into trainer.model at the end of train() with load_best_model_at_end. A metric without
load_best_model_at_end or save_strategy="best" is followed in trainer.state.best_metric only, as in transformers.
"""

from __future__ import annotations

from grpolab.app.trl_compat.entries import Entry, fail, value_of
from grpolab.training.config_checks import EVAL_METRIC
from grpolab.training.trl_names import EVAL, MISSING, grpolab_name

TRL_EVAL_NAMES = ", ".join(trl.replace("{}", "NAME") for trl, _ in EVAL)


def eval_key(metric: str) -> str:
    """transformers' key of metric_for_best_model in an evaluation's metrics: "eval_" added where missing."""
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def grpolab_metric(metric: str) -> str:
    """The grpolab evaluation metric TRL's metric_for_best_model names ("reward" -> eval/reward, "loss" ->
    eval/loss, "eval_completions/mean_length" -> eval/length, "accuracy" -> eval/accuracy); ConfigError naming
    the metrics grpolab's evaluation logs where it logs no such number."""
    key = eval_key(str(metric))
    if key in MISSING:
        raise fail("metric_for_best_model", metric, f"TRL logs {key}; grpolab's evaluation has no number for it")
    name = grpolab_name(key)
    if not EVAL_METRIC.fullmatch(name):
        raise fail(
            "metric_for_best_model",
            metric,
            f"grpolab's evaluation logs no {key}; it logs TRL's {TRL_EVAL_NAMES} and its own eval_accuracy, "
            f"eval_pass@K, eval_extract/NAME/right, ... (the name with or without eval_)",
        )
    return name


def greater_is_better(metric: str, given: bool | None) -> bool:
    """transformers' greater_is_better: as given, else not metric.endswith("loss")."""
    return not str(metric).endswith("loss") if given is None else bool(given)


def best_model(v, a) -> dict:
    """load_best_model_at_end, metric_for_best_model, greater_is_better and save_strategy="best" of TRL fields
    `a` -> {"save_best": metric, "save_best_higher": bool}, or {} where no best model is kept."""
    load_best = bool(a["load_best_model_at_end"])
    best_strategy = value_of(a["save_strategy"]) == "best"
    given = a["metric_for_best_model"]
    metric = "loss" if given is None and load_best else given  # transformers' __post_init__
    if metric is None:
        if best_strategy:
            raise fail(
                "save_strategy",
                "best",
                "needs metric_for_best_model, as transformers' Trainer does (e.g. metric_for_best_model='reward')",
            )
        return {}
    name = grpolab_metric(metric)
    if not (load_best or best_strategy):
        return {}  # trainer.state.best_metric follows it (grpolab.training.callbacks.transformers_adapter)
    if name == "eval/loss" and float(a["beta"]) != 0.0:
        default = " (transformers' default with load_best_model_at_end)" if given is None else ""
        raise fail(
            "metric_for_best_model",
            metric,
            f"eval_loss{default} is measured by grpolab's evaluation only with beta=0.0 (it loads no reference "
            f"model); rank the checkpoints by another metric, e.g. metric_for_best_model='reward'",
        )
    return {"save_best": name, "save_best_higher": greater_is_better(metric, a["greater_is_better"])}


BEST_FIELDS: list[Entry] = [
    Entry(
        "load_best_model_at_end",
        False,
        "map",
        "save_best, save_best_higher",
        best_model,
        "With save_strategy='best' too: the best model by metric_for_best_model kept in output_dir/checkpoints/best "
        "at each evaluation that improves it; True: loaded into trainer.model when train() ends, as transformers.",
    ),
    Entry(
        "metric_for_best_model",
        None,
        "map",
        "save_best",
        lambda v, a: {},
        "Read with load_best_model_at_end: TRL's evaluation metric, with or without eval_ (None with "
        "load_best_model_at_end: loss, as transformers; eval_loss needs beta=0.0): reward, loss, reward_std, "
        "completions/mean_length, rewards/NAME/mean, ... and grpolab's accuracy, pass@K; one grpolab's evaluation "
        "does not log is refused, naming those it logs. Alone: trainer.state.best_metric follows it.",
    ),
    Entry(
        "greater_is_better",
        None,
        "map",
        "save_best_higher",
        lambda v, a: {},
        "Read with load_best_model_at_end (None: higher unless metric_for_best_model ends in loss, as transformers).",
    ),
]
"""The three entries, in TRL's order (grpolab.app.trl_compat.fields_hf places them)."""

__all__ = ["BEST_FIELDS", "best_model", "eval_key", "greater_is_better", "grpolab_metric"]
