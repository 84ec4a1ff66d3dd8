"""The kinds of entry of the TRL mapping table and the helpers its rows are written with.

An Entry is one field of TRL's GRPOConfig: its name, TRL 1.16's default, and one of

    map     the value becomes grpolab settings: convert(value, args) -> {dotted Config path: value}
            (`args` holds every TRL field, for the conversions that read two fields, e.g. adam_beta1/2);
    refuse  any value but TRL's default is refused, naming the field and the reason (hub uploads,
            engines grpolab has not); the default itself changes nothing;
    ignore  any value is accepted and has no effect, for the reason given (only where the field cannot
            change what is trained: log formatting, DataLoader workers, DDP bucket sizes).

Every path a conversion writes is a setting of grpolab's Config (tests/test_trl_compat.py checks it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpolab.util.fields import ConfigError

Convert = Callable[[Any, dict], dict]


@dataclass(frozen=True)
class Entry:
    """One TRL field: name, TRL's default, kind (map | refuse | ignore), target (the grpolab path(s), for
    the docs), convert (map only) and reason (why refused or ignored; for map, a note on the meaning)."""

    name: str
    default: Any
    kind: str
    target: str = ""
    convert: Convert | None = None
    reason: str = ""


def to(path: str, fn: Callable[[Any], Any] = lambda v: v) -> Convert:
    """A conversion writing one grpolab path: {path: fn(value)}."""
    return lambda v, a: {path: fn(v)}


def same(name: str, path: str, default: Any, note: str = "") -> Entry:
    """A field whose value is the grpolab setting's as it is."""
    return Entry(name, default, "map", path, to(path), note)


def refuse(name: str, default: Any, reason: str) -> Entry:
    return Entry(name, default, "refuse", "", None, reason)


def ignore(name: str, default: Any, reason: str) -> Entry:
    return Entry(name, default, "ignore", "", None, reason)


def value_of(v: Any) -> Any:
    """An enum's value (TRL's fields hold SchedulerType, IntervalStrategy, ... after __post_init__)."""
    return getattr(v, "value", v)


def fail(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {why}")


def _settings_type(cls: type, part: str):
    hints = typing.get_type_hints(cls)
    return hints.get(part)


def config_has(path: str) -> bool:
    """Whether grpolab's Config has the dotted setting `path` (algo.*, lora.*, env.*, rollout.* nested)."""
    from grpolab.training.config import Config

    cls: Any = Config
    for part in path.split("."):
        if not (dataclasses.is_dataclass(cls) and part in {f.name for f in dataclasses.fields(cls)}):
            return False
        cls = _settings_type(cls, part)
    return True


__all__ = ["Entry", "config_has", "fail", "ignore", "refuse", "same", "to", "value_of"]
