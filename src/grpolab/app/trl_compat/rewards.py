"""GRPOTrainer's `reward_funcs`, `reward_weights` and `reward_processing_classes` as grpolab reward specs.

TRL 1.16 takes, per reward function: a function (TRL's form), a string, or a model. Here:

    a function                       {name: fn, weight}                          (as grpolab.train takes it)
    the name of a grpolab reward     {name: "math", weight}
    a local directory (str or Path)  {name: reward_model, path: DIR, label, weight}
                                     (TRL: AutoModelForSequenceClassification.from_pretrained(DIR, num_labels=1))
    a directory and its tokenizer    the model loaded here with that tokenizer (reward_processing_classes[i])
    a loaded model                   {name: RewardModel(model, tokenizer), label, weight}

A reward model's label is TRL's name for it, the last part of the path it was loaded from (metrics:
reward/<label>/mean and /std, TRL's rewards/<label>/mean and /std). A string that is neither a grpolab reward
nor a local directory is a hub id, refused: grpolab never downloads. reward_processing_classes, as TRL's:
one entry per reward function (a single tokenizer for a single function), read for models only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def processing_classes(classes: Any, n: int) -> list:
    """One tokenizer (or None) per reward function, as TRL lines them up (ConfigError on a count mismatch)."""
    if classes is None:
        return [None] * n
    out = _as_list(classes)
    if len(out) != n:
        raise ConfigError(
            f"reward_processing_classes: {len(out)} for {n} reward functions: the number of reward processing "
            f"classes must match the number of reward functions; give one per reward function (None for a function)"
        )
    return out


def _is_model(fn: Any) -> bool:
    return hasattr(fn, "parameters") and hasattr(fn, "config")


def _directory_spec(i: int, fn: str | Path, tokenizer: Any, weight: float) -> dict:
    from grpolab.rewards import reward_model as rm

    path = rm.local_dir(fn, f"reward_funcs[{i}]").resolve()
    label = Path(str(fn)).name or path.name
    if tokenizer is None:  # kept as a path: config.yaml names it, and a resumed run loads it again
        return {"name": "reward_model", "path": str(path), "label": label, "weight": weight}
    model, _ = rm.load_reward_model(path, where=f"reward_funcs[{i}]")
    return {"name": rm.RewardModel(model, tokenizer, name=label), "label": label, "weight": weight}


def reward_specs(reward_funcs: Any, weights: list[float] | None, reward_processing_classes: Any = None) -> list[dict]:
    """reward_funcs -> grpolab reward specs (the module docstring)."""
    from grpolab.rewards import REWARDS
    from grpolab.rewards import reward_model as rm

    funcs = _as_list(reward_funcs)
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward functions")
    tokenizers = processing_classes(reward_processing_classes, len(funcs))
    specs = []
    for i, (fn, tok) in enumerate(zip(funcs, tokenizers)):
        weight = 1.0 if weights is None else float(weights[i])
        if isinstance(fn, str) and fn in REWARDS and not Path(fn).is_dir():
            specs.append({"name": fn, "weight": weight})
        elif isinstance(fn, (str, Path)):
            if isinstance(fn, str) and not Path(fn).expanduser().exists():
                known = ", ".join(sorted(REWARDS))
                raise ConfigError(
                    f"reward_funcs[{i}]={fn!r}: not a local directory nor a grpolab reward ({known}). A reward "
                    f"model's hub id is refused: grpolab never downloads; fetch it yourself (e.g. `hf download "
                    f"{fn} --local-dir DIR`) and pass DIR, or pass a function (completions, **kwargs) -> list[float]"
                )
            specs.append(_directory_spec(i, fn, tok, weight))
        elif _is_model(fn):
            model = rm.of_object(fn, tok, where=f"reward_funcs[{i}]")
            specs.append({"name": model, "label": model.name, "weight": weight})
        elif callable(fn):
            specs.append({"name": fn, "weight": weight})
        else:
            raise ConfigError(
                f"reward_funcs[{i}]: a {type(fn).__name__}; pass a function (completions, **kwargs) -> list[float], "
                f"a reward model's local directory or a loaded sequence-classification model"
            )
    return specs


__all__ = ["processing_classes", "reward_specs"]
