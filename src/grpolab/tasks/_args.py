"""Validation of `task_args` shared by the tasks; every failure is a ConfigError naming `task_args.KEY`."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, TypeVar

from grpolab.util.fields import ConfigError
from grpolab.util.fileio import parse_jsonl

T = TypeVar("T")


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


def check_optional_int(key: str, value, lo: int) -> int | None:
    """None or an int (not a bool) >= lo."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < lo):
        raise ConfigError(f"task_args.{key}: expected an integer >= {lo}, got {value!r}")
    return value


def check_optional_fraction(key: str, value) -> float | None:
    """None or a number strictly between 0 and 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1):
        raise ConfigError(f"task_args.{key}: expected a number in (0, 1), got {value!r}")
    return value


def check_held_out(eval_size, eval_fraction) -> None:
    """eval_size (None or >= 0) and eval_fraction (None or in (0, 1)), not both."""
    check_optional_count("eval_size", eval_size)
    check_optional_fraction("eval_fraction", eval_fraction)
    if eval_fraction is not None and eval_size is not None:
        raise ConfigError("task_args.eval_fraction: give eval_size or eval_fraction, not both")


def check_choice(key: str, value, allowed: tuple[str, ...]) -> str:
    """One of `allowed`."""
    if value not in allowed:
        raise ConfigError(f"task_args.{key}: allowed values are {', '.join(allowed)}, got {value!r}")
    return value


def check_optional_name(key: str, value, what: str = "a field name") -> str | None:
    """None or a non-empty string (the name of a field, column or split)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"task_args.{key}: expected {what} (string), got {value!r}")
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
        raise ConfigError(f'task_args.operators: expected a subset of "{allowed}" as a string or list, got {value!r}')
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
        preset = f"a preset ({', '.join(presets)}) or " if presets else ""
        raise ConfigError(
            f"task_args.template: expected {preset}a format string containing {' and '.join(placeholders)}, got {value!r}"
        )
    try:
        value.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"task_args.template: not a valid format string ({e!r}); write literal braces as {{{{ }}}}"
        ) from e
    return value


def read_jsonl(path: str | Path) -> list[tuple[str, Any]]:
    """[("file.jsonl:LINE", record)] for each non-blank line of the file named by task_args.path; a
    line that is not a JSON object is a ConfigError naming file and line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task_args.path: no such file {str(p)!r}")
    try:
        return parse_jsonl(p.read_text(encoding="utf-8"), p.name, strict=True)
    except ConfigError as e:
        raise ConfigError(f"task_args.path: {e}") from e


def split_held_out(items: list[T], seed: int, eval_size: int | None) -> tuple[list[T], list[T]]:
    """(train, held_out): a seeded shuffle picks the held-out items (eval_size of them, default a fifth,
    at least one); both keep the file's order. If nothing is left to train on, train is every item."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n = max(1, len(items) // 5) if eval_size is None else min(eval_size, len(items))
    held_out = [items[i] for i in sorted(order[:n])]
    train = [items[i] for i in sorted(order[n:])] or list(items)
    return train, held_out


def draw(items: list[T], n: int, rng: random.Random) -> list[T]:
    """`n` items drawn with `rng`: without replacement within one call (when there are at least `n`),
    with replacement across calls."""
    if n <= len(items):
        return [items[i] for i in rng.sample(range(len(items)), n)]
    return [rng.choice(items) for _ in range(n)]


def epoch_order(rows: int, start: int, n: int, seed: int, shuffle: bool = True) -> list[int]:
    """Row indices at positions start .. start+n-1 of consecutive epochs over `rows` rows: epoch e
    (positions e*rows .. (e+1)*rows - 1) is a permutation of range(rows), seeded by (seed, e) when
    `shuffle` (random.Random(f"{seed}:{e}").shuffle: Python seeds a str through SHA-512, the same on
    every machine and process), else the rows' own order. A batch may span two epochs, as TRL's
    sampler's does."""
    out: list[int] = []
    cache: dict[int, list[int]] = {}
    for p in range(start, start + n):
        e, i = divmod(p, rows)
        if e not in cache:
            order = list(range(rows))
            if shuffle:
                random.Random(f"{seed}:{e}").shuffle(order)
            cache[e] = order
        out.append(cache[e][i])
    return out


class FileSplitTask:
    """What a task read from a file does with its rows once it holds `self._train` and `self._eval`
    (lists of Example): draw training rows, hand out the held-out ones, count them."""

    _train: list
    _eval: list

    def sample(self, n: int, rng: random.Random) -> list:
        """`n` training rows (`draw`: without replacement within one call when possible)."""
        return draw(self._train, n, rng)

    def epoch_rows(self, start: int, n: int, seed: int, shuffle: bool = True) -> list:
        """Rows start .. start+n-1 of the endless sequence of epochs over the training rows (`epoch_order`):
        step s of a run with P prompts per step takes epoch_rows((s-1) P, P, ...), so every row comes once
        per epoch, and a resumed run takes what it would have."""
        return [self._train[i] for i in epoch_order(len(self._train), start, n, seed, shuffle)]

    def eval_set(self) -> list:
        """The held-out rows, in file order."""
        return list(self._eval)

    def __len__(self) -> int:
        return len(self._train)
