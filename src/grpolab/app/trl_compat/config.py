"""GRPOConfig with TRL 1.16's field names and defaults, and the conversion of any TRL config (grpolab's
GRPOConfig, a real trl.GRPOConfig, or TRL names given as settings) into a grpolab recipe through the
one mapping table (grpolab.app.trl_compat.fields.TABLE).

    args = GRPOConfig(output_dir="runs/x", max_steps=10)     # TRL's defaults for everything else
    recipe, notes, weights = trl_recipe(args)                # {"out": "runs/x", "steps": 10, "lr": 1e-06, ...}
    grpolab.build_config(recipe)

A TRL name given among grpolab settings (`grpolab train max_steps=10 learning_rate=1e-6`, or
`grpolab.train(max_steps=10)`) is converted by the same table (trl_overrides): the fields it reads
besides itself take TRL's defaults.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from grpolab.app.trl_compat.entries import value_of
from grpolab.app.trl_compat.fields import TABLE
from grpolab.app.trl_compat.fields_model import NOTES
from grpolab.app.trl_compat.fields_types import METADATA, TYPES
from grpolab.util.fields import ConfigError


def help_of(e) -> str:
    """The --help line of a field: what it becomes in grpolab (argparse's % escaped)."""
    if e.kind == "map":
        text = f"grpolab: {e.target}" + (f". {e.reason}" if e.reason else "")
    elif e.kind == "refuse":
        text = f"Refused unless {e.default!r}: {e.reason}"
    else:
        text = f"Accepted and ignored: {e.reason}"
    return text.replace("%", "%%")


def _field(e):
    metadata: dict = {"help": help_of(e), **METADATA.get(e.name, {})}
    if isinstance(e.default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=e.default: copy.deepcopy(d), metadata=metadata)
    return dataclasses.field(default=e.default, metadata=metadata)


class _GRPOConfigBase:
    """Methods of GRPOConfig (the fields come from the mapping table)."""

    def to_dict(self) -> dict:
        """Every field and its value, as TrainingArguments.to_dict gives them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def to_grpolab(self) -> dict:
        """The grpolab recipe this configuration means (trl_recipe)."""
        return trl_recipe(self)[0]


GRPOConfig = dataclasses.make_dataclass(
    "GRPOConfig",
    [(e.name, TYPES[e.name], _field(e)) for e in TABLE.values()],
    bases=(_GRPOConfigBase,),
    namespace={
        "__module__": __name__,
        "__doc__": (
            "TRL's GRPOConfig (trl 1.16): the same field names, in the same order, with TRL's defaults "
            "(learning_rate 1e-06, beta 0.0, loss_type 'dapo', max_completion_length 512, seed 42, ...) and "
            "TRL's types, so that HfArgumentParser and TrlParser read it as they read TRL's. "
            "docs/migrating-from-trl.md says what each field becomes in grpolab, or why it is refused."
        ),
    },
)


def trl_value(name: str, raw: str) -> Any:
    """A command line's KEY=VALUE text of TRL field `name`, read as TRL's parser reads `--name VALUE`
    (save_strategy=no is the string "no", shuffle_dataset=no is False, max_steps=5 the int 5); a YAML
    list or mapping (reward_weights=[1, 0.5], model_init_kwargs={dtype: bfloat16}) is taken as it is,
    null / None for a field whose default is None. ConfigError naming the field otherwise."""
    import yaml
    from transformers import HfArgumentParser

    parsed = yaml.safe_load(raw) if raw.strip() else raw
    if isinstance(parsed, (list, dict)):
        return parsed
    if raw.strip() in ("null", "None", "~") and TABLE[name].default is None:
        return None
    action = next(a for a in HfArgumentParser(GRPOConfig)._actions if f"--{name}" in a.option_strings)
    try:
        value = action.type(raw) if action.type is not None else raw
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}={raw!r}: not a value TRL's GRPOConfig takes for it ({e})") from e
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{name}={raw!r}: TRL's choices are {', '.join(map(str, action.choices))}")
    return [value] if action.nargs == "+" else value


def _is_default(value: Any, default: Any) -> bool:
    value = value_of(value)
    empty = (None, "", [], {})
    if value == default:
        return True
    return value in empty and default in empty


def values_of(args: Any) -> dict:
    """{TRL field: value} of grpolab's GRPOConfig, a real trl.GRPOConfig (after its __post_init__) or a dict
    of TRL names; a field this table does not know is refused by name (a newer TRL)."""
    if isinstance(args, dict):
        given = dict(args)
    elif dataclasses.is_dataclass(args):
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    else:
        raise ConfigError(f"args: expected a GRPOConfig (grpolab's or trl's), got {type(args).__name__}")
    unknown = sorted(k for k in given if k not in TABLE)
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: not a field of TRL 1.16's GRPOConfig, which grpolab's mapping covers "
            f"(docs/migrating-from-trl.md)"
        )
    values = {name: e.default for name, e in TABLE.items()}
    values.update(given)
    return values


def _set(recipe: dict, path: str, value: Any) -> None:
    parts = path.split(".")
    d = recipe
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def convert(values: dict, names) -> tuple[dict, list[str]]:
    """The grpolab settings of TRL fields `names` (their values and the fields they read in `values`):
    ({dotted path: value}, notes). Refused values raise ConfigError naming the field and the reason."""
    settings: dict[str, Any] = {}
    notes: list[str] = []
    for name in names:
        e, v = TABLE[name], values[name]
        if e.kind == "ignore":
            continue
        if e.kind == "refuse":
            if not _is_default(v, e.default):
                raise ConfigError(f"{name}={value_of(v)!r}: refused: {e.reason}")
            continue
        assert e.convert is not None
        try:
            out = e.convert(v, values)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{name}={value_of(v)!r}: {err}") from err
        out = dict(out)
        notes += out.pop(NOTES, [])
        settings.update(out)
    return settings, notes


def trl_recipe(args: Any) -> tuple[dict, list[str], list[float] | None]:
    """(grpolab recipe, notes, reward_weights) for a whole TRL config: every field through the table, on
    the GRPO preset (whose KL estimator k3 in the loss is TRL's)."""
    values = values_of(args)
    settings, notes = convert(values, list(TABLE))
    # TRL raises at the first reward function that fails: a step whose completions all failed stops the run
    recipe: dict = {"algo": {"name": "grpo"}, "max_reward_error_steps": 1}
    for path, val in settings.items():
        _set(recipe, path, val)
    weights = values.get("reward_weights")
    return recipe, notes, (list(weights) if weights is not None else None)


def trl_overrides(settings: dict) -> tuple[dict, list[str]]:
    """Top-level TRL names among grpolab settings -> (grpolab settings with those converted, notes). A
    name that is also grpolab's (seed, temperature, top_p, ...) means the same and is kept as it is."""
    from grpolab.training.config import Config

    own = {f.name for f in dataclasses.fields(Config)}
    trl = {k: v for k, v in settings.items() if k in TABLE and k not in own}
    if not trl:
        return dict(settings), []
    values = values_of(trl)
    converted, notes = convert(values, list(trl))
    ignored = [k for k in trl if TABLE[k].kind == "ignore"]
    notes += [f"{k}: accepted and ignored: {TABLE[k].reason}" for k in ignored]
    out = {k: v for k, v in settings.items() if k not in trl}
    nested: dict = {}
    for path, val in converted.items():
        _set(nested, path, val)
    for k, v in nested.items():
        if k == "algo" and isinstance(out.get(k), str):
            out[k] = {"name": out[k], **v}
        elif k in out and isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = {**out[k], **v}
        elif k in out:
            raise ConfigError(
                f"{k}: given both as a grpolab setting and through TRL's {', '.join(sorted(trl))}; give it one way"
            )
        else:
            out[k] = v
    return out, notes


__all__ = ["GRPOConfig", "convert", "trl_overrides", "trl_recipe", "trl_value", "values_of"]
