"""`trl grpo`'s script arguments on grpolab's command line: `grpolab train --trl model_name_or_path=DIR
dataset_name=DIR dataset_config=NAME ...` reads what `trl grpo --model_name_or_path DIR --dataset_name DIR
...` reads (TRL's ScriptArguments, GRPOScriptArguments and ModelConfig), with local paths only.

    model_name_or_path           model=
    dataset_name                 a local dataset: a folder laid out as on the hub (configs in its README),
                                 a `save_to_disk` folder, or a .jsonl / .json / .parquet / .csv file;
                                 read with dataset_config, split by dataset_train_split (default "train")
                                 and dataset_test_split (default "test", evaluated when eval_strategy is
                                 not "no", as the script does); dataset_streaming reads it as a stream
    reward_funcs                 grpolab reward names, or TRL's dotted import paths (pkg.mod.fn -> pkg.mod:fn)
    reward_model_name_or_path    a reward model's local directory, scored first (as the script puts it)
    model_revision, attn_implementation, dtype
                                 into model_init_kwargs, as the script does (grpolab.app.trl_compat.fields_model)
    use_peft, lora_r, lora_alpha, lora_dropout, lora_target_modules
                                 lora.* (peft's LoRA, as get_peft_config builds it)

A hub id (a dataset or model name that is no local path) is refused by name: grpolab never downloads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError

DATASET_KEYS = ("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming")
MODEL_INIT = {"model_revision": "revision", "attn_implementation": "attn_implementation", "dtype": "dtype"}
LORA = {"lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "lora_target_modules": "target_modules"}
SCRIPT_KEYS = (
    "model_name_or_path",
    *DATASET_KEYS,
    "reward_funcs",
    "reward_model_name_or_path",
    *MODEL_INIT,
    "use_peft",
    *LORA,
    "trust_remote_code",
)
"""TRL's script-argument names grpolab takes on the --trl command line (trust_remote_code: GRPOConfig's too)."""

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def split_script_args(settings: dict) -> tuple[dict, dict]:
    """(TRL script arguments, the other settings) of top-level KEY=VALUE settings."""
    script = {k: v for k, v in settings.items() if k in SCRIPT_KEYS and k != "trust_remote_code"}
    return script, {k: v for k, v in settings.items() if k not in script}


def _local(name: str, value: Any) -> Path:
    path = Path(str(value)).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{name}={value!r}: no such local path; grpolab never downloads from the hub: fetch it yourself "
            f"(e.g. `hf download --repo-type dataset {value} --local-dir DIR`) and give DIR"
        )
    return path


def load_local_dataset(script: dict):
    """The DatasetDict (or IterableDatasetDict) of dataset_name, a local path (module docstring)."""
    try:
        import datasets
    except ImportError as e:
        raise ConfigError("dataset_name: reading a dataset needs `pip install grpolab[datasets]`") from e
    path = _local("dataset_name", script["dataset_name"])
    streaming = bool(script.get("dataset_streaming", False))
    config = script.get("dataset_config")
    if path.is_file():
        kind = SUFFIXES.get(path.suffix)
        if kind is None:
            raise ConfigError(f"dataset_name={str(path)!r}: a file must be one of {', '.join(SUFFIXES)}")
        return datasets.load_dataset(kind, data_files={"train": str(path)}, streaming=streaming)
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(path))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    return datasets.load_dataset(str(path), name=config, streaming=streaming)


def _reward_spec(name: str) -> dict:
    from grpolab.rewards import REWARDS

    if name in REWARDS or ":" in name:
        return {"name": name}
    if "." in name:  # TRL's dotted import path pkg.mod.fn; the script imports it with the cwd on sys.path
        module, fn = name.rsplit(".", 1)
        local = Path.cwd() / (module.replace(".", "/") + ".py")
        return {"name": f"{local}:{fn}" if local.is_file() else f"{module}:{fn}"}
    raise ConfigError(
        f"reward_funcs: {name!r} is not a grpolab reward ({', '.join(sorted(REWARDS))}) nor an import path "
        f"(pkg.module.fn); TRL's accuracy_reward, think_format_reward, ... are TRL's own functions: give "
        f"trl.rewards.accuracy_reward to use TRL's"
    )


def script_settings(script: dict) -> tuple[dict, dict]:
    """TRL script arguments -> (grpolab settings, TRL GRPOConfig fields they set: model_init_kwargs)."""
    out: dict = {}
    trl: dict = {}
    if "model_name_or_path" in script:
        value = str(script["model_name_or_path"])
        if "/" in value and not Path(value).expanduser().exists():
            _local("model_name_or_path", value)  # a hub id: refused by name
        out["model"] = value
    init = {dst: script[src] for src, dst in MODEL_INIT.items() if script.get(src) is not None}
    if init:
        trl["model_init_kwargs"] = init
    rewards = []
    if script.get("reward_model_name_or_path"):
        path = _local("reward_model_name_or_path", script["reward_model_name_or_path"])
        rewards.append({"name": "reward_model", "path": str(path)})
    names = script.get("reward_funcs") or []
    for name in [names] if isinstance(names, str) else names:
        rewards.append(_reward_spec(str(name)))
    if rewards:
        out["rewards"] = rewards
    if script.get("use_peft"):
        lora = {dst: script[src] for src, dst in LORA.items() if script.get(src) is not None}
        lora.setdefault("r", 16)  # ModelConfig's lora_r, lora_alpha 32, lora_dropout 0.05
        lora.setdefault("alpha", 32)
        lora.setdefault("dropout", 0.05)
        out["lora"] = lora
    return out, trl


def script_datasets(script: dict, eval_wanted: bool):
    """(train_dataset, eval_dataset or None) of dataset_name, as trl/scripts/grpo.py picks the splits."""
    if "dataset_name" not in script:
        return None, None
    data = load_local_dataset(script)
    train_split = script.get("dataset_train_split", "train")
    test_split = script.get("dataset_test_split", "test")
    if train_split not in data:
        raise ConfigError(f"dataset_train_split={train_split!r}: the dataset's splits are {', '.join(data)}")
    if eval_wanted and test_split not in data:
        raise ConfigError(f"dataset_test_split={test_split!r}: the dataset's splits are {', '.join(data)}")
    return data[train_split], (data[test_split] if eval_wanted else None)


__all__ = ["SCRIPT_KEYS", "load_local_dataset", "script_datasets", "script_settings", "split_script_args"]


def trl_command(args: list[str]) -> tuple[dict, list[str], list[str], Any, Any]:
    """`grpolab train --trl KEY=VALUE ...` -> (recipe, grpolab overrides, notes, train_dataset, eval_dataset).

    Every key TRL's GRPOConfig has is read as TRL's parser reads it (trl_value) and the whole config goes
    through the mapping table, from TRL's defaults; the script arguments above set the model, data,
    rewards, model_init_kwargs and LoRA; a dotted key under a TRL dict field (model_init_kwargs.dtype=...)
    fills that dict; any other KEY=VALUE is grpolab's own setting."""
    from grpolab.app.trl_compat.config import GRPOConfig, trl_recipe, trl_value
    from grpolab.app.trl_compat.fields import TABLE
    from grpolab.training.recipe import parse_overrides

    trl: dict = {}
    raw_script: list[str] = []
    own: list[str] = []
    for arg in args:
        key, _, raw = arg.partition("=")
        head, _, rest = key.partition(".")
        if key in SCRIPT_KEYS and key != "trust_remote_code":
            raw_script.append(arg)
        elif key in TABLE:
            trl[key] = trl_value(key, raw)
        elif rest and head in TABLE and TABLE[head].default is None and "kwargs" in head:
            trl.setdefault(head, {})[rest] = parse_overrides([f"x={raw}"])["x"]
        else:
            own.append(arg)
    if trl.get("resume_from_checkpoint"):  # `trl grpo` hands it to trainer.train(); the field itself is only stored
        raise ConfigError(
            f"resume_from_checkpoint={trl['resume_from_checkpoint']!r}: on grpolab's command line a run continues "
            f"with `grpolab train --resume OUTPUT_DIR [max_steps=N]` (its newest checkpoint)"
        )
    script = parse_overrides(raw_script)
    settings, trl_extra = script_settings(script)
    if trl_extra.get("model_init_kwargs"):
        trl["model_init_kwargs"] = {**trl_extra["model_init_kwargs"], **(trl.get("model_init_kwargs") or {})}
    recipe, notes, weights = trl_recipe(GRPOConfig(**trl))
    if weights is not None and "rewards" in settings:
        if len(weights) != len(settings["rewards"]):
            raise ConfigError(f"reward_weights: {len(weights)} weights for {len(settings['rewards'])} reward functions")
        settings["rewards"] = [{**r, "weight": float(w)} for r, w in zip(settings["rewards"], weights)]
    recipe.update(settings)
    eval_wanted = str(getattr(trl.get("eval_strategy"), "value", trl.get("eval_strategy", "no"))) != "no"
    train, evaluation = script_datasets(script, eval_wanted)
    return recipe, own, notes, train, evaluation


__all__ += ["trl_command"]
