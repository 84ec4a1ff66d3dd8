"""Validation of `task_args` shared by the tasks; every failure is a ConfigError naming `task_args.KEY`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpolab.types import ConfigError


def check_int(key: str, value, lo: int, hi: int | None = None) -> int:
    """An int (not a bool) in [lo, hi] (no upper bound when hi is None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"task_args.{key}: expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ConfigError(f"task_args.{key}: must be {allowed}, got {value}")
    return value


def check_range(key: str, value, lo: int, hi: int | None = None) -> tuple[int, int]:
    """[a, b] (or a single int a, meaning [a, a]) with lo <= a <= b <= hi."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ConfigError(f"task_args.{key}: expected [lo, hi] (two integers), got {value!r}")
    a = check_int(f"{key}[0]", value[0], lo, hi)
    b = check_int(f"{key}[1]", value[1], lo, hi)
    if a > b:
        raise ConfigError(f"task_args.{key}: lo must be <= hi, got {list(value)}")
    return a, b


def check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"task_args.{key}: expected true or false, got {value!r}")
    return value


def check_optional_str(key: str, value) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"task_args.{key}: expected a string or null, got {value!r}")
    return value


def check_optional_count(key: str, value) -> int | None:
    """None or an int >= 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"task_args.{key}: expected a non-negative integer, got {value!r}")
    return value


def check_optional_path(key: str, value) -> str | Path | None:
    if value is not None and not isinstance(value, (str, Path)):
        raise ConfigError(f"task_args.{key}: expected a file path, got {value!r}")
    return value


def parse_operators(value, allowed: str) -> tuple[str, ...]:
    """A non-empty subset of the operators in `allowed`, given as a string ("+-") or a list
    (["+", "-"]); de-duplicated, order kept."""
    if isinstance(value, str):
        items = [c for c in value if not c.isspace() and c != ","]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(
            f'task_args.operators: expected a subset of "{allowed}" as a string or list, got {value!r}'
        )
    if not items or any(len(o) != 1 or o not in allowed for o in items):
        names = ", ".join(f'"{o}"' for o in allowed)
        raise ConfigError(f"task_args.operators: allowed operators are {names} (a non-empty subset), got {value!r}")
    return tuple(dict.fromkeys(items))


def resolve_template(value, presets: dict[str, str], fields: tuple[str, ...] = ("question",)) -> str:
    """A preset name, or a format string that contains every one of `fields` (as {name}) and no other
    field -> the format string."""
    if not isinstance(value, str):
        raise ConfigError(f"task_args.template: expected a string, got {value!r}")
    if value in presets:
        return presets[value]
    placeholders = [f"{{{name}}}" for name in fields]
    if any(p not in value for p in placeholders):
        raise ConfigError(
            f"task_args.template: expected a preset ({', '.join(presets)}) or a format string "
            f"containing {' and '.join(placeholders)}, got {value!r}"
        )
    try:
        value.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"task_args.template: not a valid format string ({e!r}); write literal braces as {{{{ }}}}"
        ) from e
    return value


def read_jsonl(path: str | Path) -> list[tuple[str, Any]]:
    """[("file.jsonl:LINE", record)] for each non-blank line of the file named by task_args.path."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task_args.path: no such file {str(p)!r}")
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            where = f"{p.name}:{i + 1}"
            try:
                out.append((where, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(f"task_args.path: {where} is not valid JSON ({e})") from e
    return out
