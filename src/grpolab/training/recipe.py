"""A recipe and its overrides as data: the YAML file read, dotted KEY=VALUE overrides parsed, the two merged,
and the merged mapping applied to a settings dataclass field by field (grpolab.training.config builds the
Config from them: defaults <- recipe <- overrides).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from grpolab.util.fields import ConfigError, coerce_field, field_types

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # shipped in the package; ./recipes links here


def _type_of(cls: type, name: str):
    return field_types(cls)[name]


def merge_into(cls: type, current: Any, updates: dict, prefix: str) -> Any:
    """Return a copy of dataclass `current` with `updates` applied (nested dataclasses merge recursively)."""
    if not isinstance(updates, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'recipe'}: expected a mapping, got {updates!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {n: getattr(current, n) for n in names}
    for k, v in updates.items():
        key = f"{prefix}{k}"
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{key}: unknown key.{hint} Known keys: {', '.join(names)}")
        typ = _type_of(cls, k)
        if k == "algo":
            kwargs[k] = v  # handled by the caller (presets: resolve_algo)
        elif dataclasses.is_dataclass(typ):
            kwargs[k] = merge_into(typ, getattr(current, k), v, f"{key}.")  # lora.*
        else:
            kwargs[k] = coerce_field(key, v, typ)
    return cls(**kwargs)


def _apply(cfg_dict: dict, key: str, value: Any) -> None:
    """Set a dotted `key` in a nested dict, creating levels as needed."""
    parts = key.split(".")
    d = cfg_dict
    for p in parts[:-1]:
        if not isinstance(d.get(p), dict):
            d[p] = {} if p not in d or d[p] is None else ({"name": d[p]} if isinstance(d[p], str) else d[p])
        d = d[p]
    last = parts[-1]
    if isinstance(d.get(last), dict) and isinstance(value, str) and key == "algo":
        d[last]["name"] = value  # `algo.beta=0.1 algo=dapo`: the preset name must not drop algo.beta
    else:
        d[last] = value


def parse_overrides(items: list[str]) -> dict:
    """`["steps=5", "algo.beta=0.04"]` -> nested dict; values are parsed as YAML scalars."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{item!r}: overrides are KEY=VALUE (for example steps=10 or algo.beta=0.04)")
        k, v = item.split("=", 1)
        if not k:
            raise ConfigError(f"{item!r}: empty key")
        try:
            val = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError:
            val = v
        _apply(out, k.strip(), val)
    return out


def load_recipe(path: str | Path) -> dict:
    """Read a YAML recipe: a file path, or the name of a file in recipes/ (`dapo` -> recipes/dapo.yaml)."""
    p = Path(path)
    if not p.exists() and (RECIPES_DIR / f"{path}.yaml").exists():
        p = RECIPES_DIR / f"{path}.yaml"
    if not p.exists():
        known = sorted(x.stem for x in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.exists() else []
        raise ConfigError(f"recipe {str(path)!r} not found; give a YAML file path or one of: {', '.join(known)}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {p}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {p}: expected a mapping of keys to values at the top level")
    return data


def deep_update(base: dict, upd: dict) -> dict:
    for k, v in upd.items():
        if k == "algo" and isinstance(v, str):
            v = {"name": v}
        if isinstance(v, dict) and isinstance(base.get(k), dict) and k != "rewards":
            deep_update(base[k], v)
        else:
            base[k] = v
    return base
