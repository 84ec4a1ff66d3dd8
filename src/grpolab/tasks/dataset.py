"""Datasets as users have them: a Hugging Face `datasets` directory, JSONL, parquet or CSV on local disk.

    grpolab train task=dataset task_args.path=data/train.jsonl rewards='[{name: "my_rewards.py:fn"}]'

Each row gives a prompt and (usually) a reference answer; every other column is kept in the example's
meta, so a TRL-style reward receives it as a keyword argument (grpolab.rewards.custom), as TRL passes
a dataset's columns.

The prompt is a string (the user message; the task's `system_prompt` goes before it) or a list of
chat messages ([{"role": "system", ...}, {"role": "user", ...}], each with a string `content`,
ending with a user turn), the conversational form TRL and many datasets use. The answer is a string
(or a number, written as text); `answer_format` normalises it as task=qa does (GSM8K's `#### 42`
-> `42`, the last \\boxed{...}, or raw).

Held-out split, in this order:
    eval_path     a separate file (or datasets directory) is the evaluation set;
    the file's own split: a `datasets` DatasetDict's `eval_split` (default: its "test" or
                  "validation" split), or, in a single file with a `split` column, the rows whose
                  split is `eval_split` (default "test" or "validation") while `split` (default
                  "train") picks the training rows;
    otherwise     a seeded fraction of the rows (grpolab.tasks._args.split_held_out): eval_size rows,
                  or eval_fraction of them, or a fifth by default.

Options (`task_args`):
    path            a .jsonl, .parquet or .csv file, or a directory written by `Dataset.save_to_disk`
                    / `DatasetDict.save_to_disk` (needs `pip install grpolab[datasets]`). Required.
    format          auto (by extension; a directory is `datasets`), jsonl, parquet, csv, datasets.
    prompt_column   column holding the prompt (default: the first of prompt, messages, question,
                    problem that the row has).
    answer_column   column holding the reference answer (default: the first of answer, solution,
                    ground_truth); null for data without one (the answer is then "").
    id_column       column holding a stable id (default "id"; else FILE:ROW).
    answer_format   auto | gsm8k | boxed | raw (default auto; see grpolab.tasks.qa).
    split           training split of a DatasetDict or value of the `split` column (default "train").
    eval_split      held-out split (default: "test" or "validation" when the data has one).
    eval_path       a separate evaluation file or directory.
    eval_size       held-out rows (with a split or eval_path: at most this many of them).
    eval_fraction   fraction of rows held out, in (0, 1) (no file split, no eval_path).
    limit           read at most this many training rows.
    system_prompt   system message for string prompts (default: the chat template's own).
    string_prompts  chat (default): a string prompt is the user message, wrapped in the chat template;
                    raw: it is the model's input text as it is (TRL's "standard" format: no template,
                    so a prompt already templated is not templated twice). Message lists always get
                    the template.

Every bad row is a ConfigError naming the file and row: a missing column, an empty prompt, a
malformed message list, an answer that is not text.

In a run with an environment (build_task(..., environment=True), which the trainer passes when env.name
or env.factories is set) the environment may write the prompt, as in TRL: a row may then have an
empty prompt (text, or messages whose user turns are empty: reset's text is appended to the last one),
no prompt column at all (TRL's routing rows carry only an `environment` column), and no answer (the
answer is then "", and with no answer in any row the default rewards are none but the environment's).
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

from grpolab.batch import Example
from grpolab.tasks._args import (
    FileSplitTask,
    check_choice,
    check_held_out,
    check_optional_int,
    check_optional_name,
    check_optional_path,
    check_optional_str,
    split_held_out,
)
from grpolab.tasks.qa import ANSWER_FORMATS, normalise_answer
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import iter_jsonl
from grpolab.util.text import safe_data

log = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "parquet", "csv", "datasets")
PROMPT_COLUMNS = ("prompt", "messages", "question", "problem")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth")
EVAL_SPLITS = ("test", "validation")
ROLES = ("system", "user", "assistant")
STRING_PROMPTS = ("chat", "raw")
_AUTO = "auto"


def detect_format(path: Path, fmt: str, key: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "datasets"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ConfigError(
        f"task_args.{key}: cannot tell the format of {path} from its extension; "
        f"set task_args.format to one of {', '.join(FORMATS[1:])}"
    )


def _load_datasets_dir(path: Path, key: str):
    try:
        import datasets
    except ImportError as e:
        raise ConfigError(
            f"task_args.{key}: reading a datasets directory ({path}) needs the `datasets` "
            f"package: pip install grpolab[datasets]"
        ) from e
    try:
        return datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise ConfigError(f"task_args.{key}: {path} is not a directory written by save_to_disk ({e})") from e
    except Exception as e:  # datasets raises its own error types for a damaged directory
        raise ConfigError(f"task_args.{key}: cannot load {path} with datasets.load_from_disk ({e})") from e


def read_splits(path: Path, fmt: str, key: str) -> dict[str | None, list[tuple[str, dict]]]:
    """{split name or None (a single table): [(location, row)]}; location names file and row.

    Every string of every row is valid Unicode (grpolab.util.text): bytes that are not UTF-8 and
    lone surrogates (JSON's "\\ud800" escape) become U+FFFD, pairs their character; how many rows
    were repaired is logged once per file. No tokenizer or UTF-8 file accepts such text."""
    splits = _read_splits(path, fmt, key)
    repaired = 0
    for name, rows in splits.items():
        fixed = []
        for where, row in rows:
            row2, n = safe_data(row)
            repaired += n > 0
            fixed.append((where, row2))
        splits[name] = fixed
    if repaired:
        log.warning(
            "%s: %d row(s) held text that is not valid Unicode (bytes that are not UTF-8, or lone "
            "surrogates); repaired to U+FFFD",
            path,
            repaired,
        )
    return splits


def _read_splits(path: Path, fmt: str, key: str) -> dict[str | None, list[tuple[str, dict]]]:
    if not path.exists():
        raise ConfigError(f"task_args.{key}: not found: {path}")
    fmt = detect_format(path, fmt, key)
    if fmt == "datasets":
        ds = _load_datasets_dir(path, key)
        tables = dict(ds) if hasattr(ds, "keys") else {None: ds}
        return {
            name: [
                (f"{path}{f' [{name}]' if name else ''}: row {n}", row)
                for n, row in enumerate(table.to_list(), start=1)
            ]
            for name, table in tables.items()
        }
    if path.is_dir():
        raise ConfigError(f"task_args.{key}: {path} is a directory; give a file, or format=datasets")
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ConfigError(
                f"task_args.{key}: reading parquet ({path}) needs pyarrow: pip install grpolab[parquet]"
            ) from e
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises its own error types for a corrupt file
            raise ConfigError(f"{path}: not a readable parquet file ({e})") from e
        return {None: [(f"{path}: row {n}", row) for n, row in enumerate(rows, start=1)]}
    # bytes that are not UTF-8 are read as lone surrogates (surrogateescape), which read_splits repairs and counts
    with path.open(encoding="utf-8", errors="surrogateescape", newline="" if fmt == "csv" else None) as f:
        if fmt == "jsonl":
            return {None: list(iter_jsonl(f, str(path), strict=True))}
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise ConfigError(f"{path}: empty CSV file (expected a header row)")
        # DictReader's line_num is the line the row ended on (a quoted field may span lines)
        return {None: [(f"{path}:{reader.line_num}", row) for row in reader]}


def _columns_of(row: dict) -> str:
    return ", ".join(map(repr, row)) or "no columns"


def _pick(row: dict, where: str, column: str | None, defaults: tuple[str, ...], what: str, opt: str) -> str:
    if column is not None:
        if column not in row:
            raise ConfigError(f"{where}: no column {column!r} (task_args.{opt}); the row has {_columns_of(row)}")
        return column
    for name in defaults:
        if name in row and row[name] is not None:
            return name
    unset = (
        " (or null: data without reference answers, scored by your reward functions alone)"
        if opt == "answer_column"
        else ""
    )
    raise ConfigError(
        f"{where}: no {what} column (looked for {', '.join(map(repr, defaults))}; the row has "
        f"{_columns_of(row)}); set task_args.{opt}{unset}"
    )


def _user_text_empty(msgs: list[dict]) -> bool:
    return not any(m["content"].strip() for m in msgs if m["role"] == "user")


def parse_prompt(value, where: str, column: str, allow_empty: bool = False) -> str | list[dict]:
    """A non-empty string, or a list of chat messages ending with a user turn (allow_empty: whose user
    turns may all be empty, when an environment writes the prompt)."""
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where}: empty prompt (column {column!r})")
        return value
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            f"{where}: the prompt (column {column!r}) must be text or a list of chat messages, "
            f"got {type(value).__name__} {value!r:.60}"
        )
    if not value:
        raise ConfigError(f"{where}: empty prompt (column {column!r} is an empty message list)")
    msgs = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(
                f'{where}: message {i} of column {column!r} must be {{"role": ..., "content": "text"}}, got {m!r:.80}'
            )
        if m["role"] not in ROLES:
            raise ConfigError(
                f"{where}: message {i} of column {column!r} has role {m['role']!r}; allowed roles: {', '.join(ROLES)}"
            )
        msgs.append({"role": m["role"], "content": m["content"]})
    if msgs[-1]["role"] != "user":
        raise ConfigError(
            f"{where}: the messages of column {column!r} must end with a user turn "
            f"(the model writes the next assistant turn), got {msgs[-1]['role']!r}"
        )
    if _user_text_empty(msgs) and not allow_empty:
        raise ConfigError(f"{where}: empty prompt (every user message of column {column!r} is empty)")
    return msgs


def parse_answer(value, where: str, column: str, answer_format: str) -> str:
    """The reference answer as text (numbers are written out; anything else is an error)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(
            f"{where}: the answer (column {column!r}) must be text or a number, got "
            f"{type(value).__name__} {value!r:.60}"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: the answer (column {column!r}) is {value}")
        value = str(int(value)) if value.is_integer() else repr(value)
    text = str(value)
    try:
        answer = normalise_answer(text, answer_format)
    except ValueError as e:
        raise ConfigError(f"{where}: {e} (task_args.answer_format is {answer_format!r})") from e
    if not answer:
        raise ConfigError(f"{where}: empty answer (column {column!r})")
    return answer


class DatasetTask(FileSplitTask):
    name = "dataset"

    def __init__(
        self,
        seed: int,
        path=None,
        format: str = "auto",
        prompt_column: str | None = None,
        answer_column: str | None = _AUTO,
        id_column: str = "id",
        answer_format: str = "auto",
        split: str = "train",
        eval_split: str | None = None,
        eval_path=None,
        eval_size: int | None = None,
        eval_fraction: float | None = None,
        limit: int | None = None,
        system_prompt: str | None = None,
        string_prompts: str = "chat",
        environment: bool = False,
    ):
        self.seed = seed
        self.environment = environment
        if path is None:
            raise ConfigError(
                "task_args.path: required for task 'dataset' (a .jsonl, .parquet or .csv file, "
                "or a directory written by Dataset.save_to_disk)"
            )
        check_optional_path("path", path)
        check_optional_path("eval_path", eval_path)
        check_choice("format", format, FORMATS)
        check_choice("answer_format", answer_format, ANSWER_FORMATS)
        for key, value in (
            ("prompt_column", prompt_column),
            ("answer_column", answer_column),
            ("id_column", id_column),
            ("split", split),
            ("eval_split", eval_split),
        ):
            check_optional_name(key, value, "a column or split name")
        check_held_out(eval_size, eval_fraction)
        check_optional_int("limit", limit, 1)
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.raw_string_prompts = check_choice("string_prompts", string_prompts, STRING_PROMPTS) == "raw"
        self.default_rewards = [{"name": "math", "weight": 1.0, "extract": "auto"}]
        self._opts = dict(
            prompt_column=prompt_column, answer_column=answer_column, id_column=id_column, answer_format=answer_format
        )
        self.path = Path(path).expanduser()

        splits = read_splits(self.path, format, "path")
        train_rows, held_rows, self.split_source = self._split_rows(
            splits, split, eval_split, eval_path, format, eval_fraction
        )
        if limit is not None:
            train_rows = train_rows[:limit]
        train = self._examples(train_rows, "path")
        if held_rows is None:  # a seeded fraction of the training rows
            k = round(len(train) * eval_fraction) if eval_fraction is not None else eval_size
            train, held = split_held_out(train, seed, k)
        else:
            held = self._examples(held_rows, "eval_path" if eval_path is not None else "path", allow_empty=True)
            if eval_size is not None:
                held = held[:eval_size]
        self._train, self._eval = train, held
        self.eval_size = len(held)
        if environment and not any(e.answer for e in train + held):
            self.default_rewards = []  # no reference answers: the environment's reward is the reward

    def _split_rows(self, splits, split, eval_split, eval_path, fmt, eval_fraction):
        """(training rows, held-out rows or None for a seeded fraction, where the held-out rows came from)."""
        if None not in splits:  # a DatasetDict
            names = sorted(splits)
            if split not in splits:
                raise ConfigError(
                    f"task_args.split: {self.path} has no split {split!r}; its splits: {', '.join(names)}"
                )
            train = splits[split]
            if eval_path is None:
                held_name = eval_split or next((s for s in EVAL_SPLITS if s in splits and s != split), None)
                if eval_split is not None and eval_split not in splits:
                    raise ConfigError(
                        f"task_args.eval_split: {self.path} has no split {eval_split!r}; its splits: {', '.join(names)}"
                    )
                if held_name is not None:
                    self._no_fraction(eval_fraction, f"split {held_name!r}")
                    return train, splits[held_name], f"split {held_name!r}"
        else:
            rows = splits[None]
            if rows and "split" in rows[0][1]:  # a split column
                values = {str(r.get("split")) for _, r in rows}
                train = [(w, r) for w, r in rows if str(r.get("split")) == split]
                if not train:
                    raise ConfigError(
                        f"task_args.split: no row of {self.path} has split {split!r} "
                        f"(its split column holds {', '.join(sorted(values))})"
                    )
                held_name = eval_split or next((s for s in EVAL_SPLITS if s in values), None)
                if eval_split is not None and eval_split not in values:
                    raise ConfigError(f"task_args.eval_split: no row of {self.path} has split {eval_split!r}")
                if eval_path is None and held_name is not None:
                    self._no_fraction(eval_fraction, f"split {held_name!r}")
                    return train, [(w, r) for w, r in rows if str(r.get("split")) == held_name], f"split {held_name!r}"
            else:
                if eval_split is not None:
                    raise ConfigError(f"task_args.eval_split: {self.path} has no splits (no split column)")
                train = rows
        if eval_path is not None:
            self._no_fraction(eval_fraction, "eval_path")
            held_splits = read_splits(Path(eval_path).expanduser(), fmt, "eval_path")
            held = held_splits.get(None) or held_splits.get(eval_split or "test") or next(iter(held_splits.values()))
            return train, held, str(eval_path)
        return train, None, "seeded fraction"

    @staticmethod
    def _no_fraction(eval_fraction, source: str) -> None:
        if eval_fraction is not None:
            raise ConfigError(
                f"task_args.eval_fraction: the held-out rows come from {source}; use eval_size to cap them"
            )

    def _examples(self, rows: list[tuple[str, dict]], key: str, allow_empty: bool = False) -> list[Example]:
        o = self._opts
        out = []
        for where, row in rows:
            pcol, prompt = self._prompt(row, where)
            answer = self._answer(row, where)
            rid = row.get(o["id_column"])
            meta = {k: v for k, v in row.items() if k != pcol}
            out.append(
                Example(prompt=prompt, answer=answer, meta=meta, id=str(rid) if rid is not None else Path(where).name)
            )
        if not out and not allow_empty:
            raise ConfigError(f"task_args.{key}: no rows in {self.path}")
        return out

    def _prompt(self, row: dict, where: str) -> tuple[str | None, str | list[dict]]:
        """(the prompt's column, the prompt); with an environment, "" or empty messages are allowed."""
        o = self._opts
        try:
            pcol = _pick(row, where, o["prompt_column"], PROMPT_COLUMNS, "prompt", "prompt_column")
        except ConfigError:
            if self.environment and o["prompt_column"] is None:
                return None, ""  # no prompt column: reset's text is the prompt
            raise
        value = row[pcol]
        if self.environment and (value == "" or value == [] or (isinstance(value, str) and not value.strip())):
            return pcol, ""
        prompt = parse_prompt(value, where, pcol, allow_empty=self.environment)
        return pcol, prompt

    def _answer(self, row: dict, where: str) -> str:
        """The reference answer; with an environment, a row without one has "" (the environment scores)."""
        o = self._opts
        if o["answer_column"] is None:
            return ""
        try:
            acol = _pick(
                row,
                where,
                None if o["answer_column"] == _AUTO else o["answer_column"],
                ANSWER_COLUMNS,
                "answer",
                "answer_column",
            )
        except ConfigError:
            if self.environment and o["answer_column"] == _AUTO:
                return ""
            raise
        if self.environment and row[acol] in ("", None):
            return ""
        return parse_answer(row[acol], where, acol, o["answer_format"])
