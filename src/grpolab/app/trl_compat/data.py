"""train_dataset / eval_dataset as TRL reads them, as grpolab task=dataset settings.

Rows: a `datasets.Dataset` (to_list), a map-style dataset (a torch Dataset or anything with __len__ and
__getitem__: rows 0 .. len-1, so `list(ds)` over __getitem__ never loops past the end), or a list of dicts.
An iterable without a length (a streaming `datasets.IterableDataset`, a generator function's iterable) is
read as a stream, as TRL reads it: in its own order, never shuffled, only as far as the run goes (max_steps
x prompts per step rows, starting the stream again where it ends), so a stream larger than memory trains;
TRL requires max_steps for one, and so does grpolab.

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


def is_stream(data: Any) -> bool:
    """An iterable without a length (a streaming IterableDataset): read with stream_rows."""
    if isinstance(data, (list, tuple, dict, str)):
        return False
    return hasattr(data, "__iter__") and not hasattr(data, "__len__")  # IterableDataset has a to_list: not read


def stream_rows(data: Any, n: int, name: str) -> list[dict]:
    """The first n rows a run reads from a stream: its rows in order, the stream started again (a new
    epoch) when it ends, as TRL's data loader repeats an IterableDataset; no more than n are ever held."""
    import itertools

    rows: list[dict] = []
    while len(rows) < n:
        before = len(rows)
        rows.extend(itertools.islice(iter(data), n - len(rows)))
        if len(rows) == before:
            raise ConfigError(f"{name}: the stream gave no rows")
    return rows


def rows_needed(recipe: dict) -> int | None:
    """Prompts a run reads: steps x batch_size / G (None when steps is -1: the epochs decide)."""
    steps = int(recipe.get("steps", -1))
    if steps < 1:
        return None
    per_step = int(recipe.get("batch_size", 8)) // max(1, int(recipe.get("G", 8)))
    return steps * max(1, per_step)


def rows_of(data: Any, name: str, limit: int | None = None) -> list[dict]:
    """The rows of `data` as a list of dicts (see the module docstring); a stream up to `limit` rows (the
    run's, rows_needed); ConfigError naming `name` otherwise."""
    if isinstance(data, dict):  # a DatasetDict or {name: dataset}: TRL's several evaluation sets
        raise ConfigError(
            f"{name}: a dict of datasets ({', '.join(map(str, data))}); give one split (e.g. "
            f"{name}={name}[{next(iter(data), 'train')!r}]), or read each with eval_sets"
        )
    if is_stream(data) and limit is None and name.startswith("eval"):
        rows = list(data)  # an evaluation stream is read once to its end, as TRL's evaluation loop reads it
    elif is_stream(data):
        if limit is None:
            raise ConfigError(
                f"{name}: a stream ({type(data).__name__}, no length) needs max_steps, as in TRL: the "
                f"epochs cannot count its rows; give max_steps=N"
            )
        rows = stream_rows(data, limit, name)
    elif hasattr(data, "to_list"):
        rows = data.to_list()
    elif isinstance(data, (list, tuple)):
        rows = list(data)
    elif hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        rows = [data[i] for i in range(len(data))]  # map-style: indexed by its length
    else:
        raise ConfigError(
            f"{name}: expected a datasets.Dataset, a map-style dataset (__len__ and __getitem__), a "
            f"stream with max_steps, or a list of dicts, got {type(data).__name__}"
        )
    if not rows:
        raise ConfigError(f"{name}: no rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ConfigError(
                f'{name}: row {i} is {type(r).__name__}, expected a dict of columns (e.g. {{"prompt": ...}})'
            )
    return rows


def eval_sets(data: Any) -> dict[str, list[dict]] | None:
    """TRL's eval_dataset as named row sets: a dict or DatasetDict of datasets -> {name: rows} (TRL then
    logs eval_<name>_<metric>); one dataset -> None (read it with rows_of)."""
    if not isinstance(data, dict):
        return None
    return {str(k): rows_of(v, f"eval_dataset[{k!r}]") for k, v in data.items()}


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


def trl_reading(data: Any, recipe: dict, *, environment: bool, eval_given: bool) -> tuple[list[dict], dict]:
    """train_dataset read as GRPOTrainer reads it: (rows, the recipe settings that go with them): task_args
    for TRL's columns (task_args), nothing held out when there is no eval_dataset (eval_size=0), the rows
    in epochs (TRL's num_train_epochs 3 unless given; max_steps still ends the run), and a stream in its
    own order (shuffle=False)."""
    stream = is_stream(data)
    rows = rows_of(data, "train_dataset", rows_needed(recipe) if stream else None)
    args = task_args(rows, environment)
    extra: dict = {}
    if eval_given:
        args.pop("eval_size")
    else:
        extra["eval_size"] = 0  # TRL evaluates eval_dataset only
    if recipe.get("num_train_epochs") is None:
        extra["num_train_epochs"] = 3.0  # TRL's default: the rows are read in epochs, never drawn at random
    if stream:
        extra["shuffle"] = False
    return rows, {"task_args": args, **extra}


__all__ = ["eval_sets", "is_stream", "rows_needed", "rows_of", "stream_rows", "task_args", "trl_reading", "write_rows"]
