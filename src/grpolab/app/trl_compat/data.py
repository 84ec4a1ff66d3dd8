"""train_dataset / eval_dataset as TRL reads them, as grpolab task=dataset settings.

Rows: a `datasets.Dataset` (to_list), a map-style dataset (a torch Dataset or anything with __len__ and
__getitem__: rows 0 .. len-1, so `list(ds)` over __getitem__ never loops past the end), or a list of dicts.
An iterable without a length is refused: the epochs count its rows.

TRL's reading (grpolab.tasks.dataset options): the prompt is the `prompt` column; a string prompt is the
model's input text as it is (string_prompts=raw, TRL's standard format) and a list of messages gets the
chat template (conversational format); no answer column is needed (answer_column=null): every column
but the prompt reaches the reward functions as keyword arguments, as it is; nothing is held out of the
training rows (eval_size=0): evaluation reads eval_dataset only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write


def rows_of(data: Any, name: str) -> list[dict]:
    """The rows of `data` as a list of dicts (see the module docstring); ConfigError naming `name` otherwise."""
    if hasattr(data, "to_list"):
        rows = data.to_list()
    elif isinstance(data, (list, tuple)):
        rows = list(data)
    elif hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        rows = [data[i] for i in range(len(data))]  # map-style: indexed by its length
    else:
        raise ConfigError(
            f"{name}: expected a datasets.Dataset, a map-style dataset (__len__ and __getitem__) "
            f"or a list of dicts, got {type(data).__name__} (an iterable without a length cannot "
            f"be counted in epochs; materialise it, e.g. datasets.Dataset.from_list(list(it)))"
        )
    if not rows:
        raise ConfigError(f"{name}: no rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ConfigError(
                f'{name}: row {i} is {type(r).__name__}, expected a dict of columns (e.g. {{"prompt": ...}})'
            )
    return rows


def write_rows(rows: list[dict], path: Path, name: str) -> Path:
    """Rows -> a JSONL file (atomic), which the run's config names so that it resumes."""
    try:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}: rows must be JSON data (strings, numbers, lists, dicts): {e}") from e
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return path


def task_args(rows: list[dict], environment: bool) -> dict:
    """task=dataset's options for TRL's reading of `rows` (the module docstring)."""
    args: dict = {"answer_column": None, "string_prompts": "raw", "eval_size": 0}
    if "prompt" in rows[0]:
        args["prompt_column"] = "prompt"
    elif not environment:
        raise ConfigError(
            f"train_dataset: TRL reads the prompt from a `prompt` column; the first row has "
            f"{', '.join(map(repr, rows[0])) or 'no columns'}"
        )
    return args


__all__ = ["rows_of", "task_args", "write_rows"]
