"""Question/answer files on local disk: JSONL or parquet (GSM8K, MATH, your own data).

Each record needs a question and an answer. By default the question is read from the first of
`question`, `problem`, `prompt` that the record has, and the answer from `answer` or `solution`.

Reference answers are normalised (`answer_format`):
    gsm8k: the text after the last "#### ", commas removed ("... #### 1,234" -> "1234").
    boxed: the content of the last \\boxed{...} (MATH-style solutions).
    raw:   the text as is (stripped).
    auto (default): gsm8k when the text contains "####", else boxed when it contains "\\boxed{",
          else raw.
The full reference text is kept in `meta["solution"]` when it differs from the answer.

Held-out split: every record is ranked by a hash of its question text (so duplicated questions never
straddle the split) and the `eval_size` lowest-ranked form the evaluation set; with `eval_fraction`
that many are held out instead. The split is a function of the file contents only (not of the seed),
so runs with different seeds evaluate on the same questions. With `eval_path`, that file is the
evaluation set and all of `path` is for training.

Options (`task_args`):
    path:           the training file (.jsonl / .json lines, or .parquet). Required.
    eval_path:      an optional separate evaluation file (same format rules).
    format:         "auto" (by extension; default), "jsonl" or "parquet".
    question_key:   field holding the question (default: question / problem / prompt).
    answer_key:     field holding the answer (default: answer / solution).
    id_key:         field holding a stable id (default "id"; else one is made from the question).
    answer_format:  auto | gsm8k | boxed | raw (see above).
    eval_size:      number of held-out records (default: min(64, 10% of the file) when neither this
                    nor eval_fraction is given; with eval_path, at most this many of that file).
    eval_fraction:  fraction of records held out, in (0, 1).
    limit:          read at most this many records of `path` (default: all).
    template:       format string with {question} (default "{question}").
    system_prompt:  str, or None for the chat template's default (default None).
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

from grpolab.batch import Example
from grpolab.rewards.extract import gsm8k_answer, last_boxed
from grpolab.tasks._args import (
    FileSplitTask,
    check_choice,
    check_held_out,
    check_optional_int,
    check_optional_name,
    check_optional_path,
    check_optional_str,
    resolve_template,
)
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import iter_jsonl

QUESTION_KEYS = ("question", "problem", "prompt")
ANSWER_KEYS = ("answer", "solution")
ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "raw")
FORMATS = ("auto", "jsonl", "parquet")


def normalise_answer(text: str, answer_format: str = "auto") -> str:
    """Reference answer text -> the string a verifier compares against (see module docstring)."""
    text = text.strip()
    if answer_format == "gsm8k" or (answer_format == "auto" and "####" in text):
        return (gsm8k_answer(text) or "").replace(",", "")  # the final line after '####', commas stripped
    if answer_format in ("boxed", "auto"):
        boxed = last_boxed(text)
        if boxed is not None:
            return boxed
        if answer_format == "boxed":
            raise ValueError("no \\boxed{...} in the answer")
    return text


def _question_rank(question: str) -> str:
    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()


def _read_records(path: Path, fmt: str, key: str, limit: int | None = None) -> list[tuple[str, dict]]:
    """[(location, record)] where location is "file:line" (JSONL) or "file:row N" (parquet)."""
    if not path.exists():
        raise ConfigError(f"task_args.{key}: file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"task_args.{key}: not a file: {path}")
    if fmt == "auto":
        fmt = "parquet" if path.suffix.lower() in (".parquet", ".pq") else "jsonl"
    out: list[tuple[str, dict]] = []
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ConfigError(
                f"task_args.{key}: reading parquet ({path}) needs pyarrow: pip install grpolab[parquet]"
            ) from e
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises its own error types for corrupt files
            raise ConfigError(f"{path}: not a readable parquet file ({e})") from e
        for n, row in enumerate(rows[:limit] if limit is not None else rows, start=1):
            out.append((f"{path}: row {n}", row))
        return out
    with path.open(encoding="utf-8") as f:
        return list(itertools.islice(iter_jsonl(f, str(path), strict=True), limit))


def _field(rec: dict, where: str, key: str | None, defaults: tuple[str, ...], what: str, opt: str) -> str:
    names = (key,) if key is not None else defaults
    for name in names:
        if name in rec and rec[name] is not None:
            value = rec[name]
            if isinstance(value, (dict, list)):
                raise ConfigError(f"{where}: field {name!r} ({what}) must be text or a number, got {value!r:.80}")
            return str(value)
    raise ConfigError(
        f"{where}: no {what} field (looked for {', '.join(map(repr, names))}; the record has "
        f"{', '.join(map(repr, rec)) or 'no fields'}); set task_args.{opt}"
    )


class QATask(FileSplitTask):
    name = "qa"

    def __init__(
        self,
        seed: int,
        path: str | None = None,
        eval_path: str | None = None,
        format: str = "auto",
        question_key: str | None = None,
        answer_key: str | None = None,
        id_key: str = "id",
        answer_format: str = "auto",
        eval_size: int | None = None,
        eval_fraction: float | None = None,
        limit: int | None = None,
        template: str = "{question}",
        system_prompt: str | None = None,
    ):
        self.seed = seed
        if path is None:
            raise ConfigError("task_args.path: required for task 'qa' (a .jsonl or .parquet file)")
        check_optional_path("path", path)
        check_optional_path("eval_path", eval_path)
        check_choice("format", format, FORMATS)
        check_choice("answer_format", answer_format, ANSWER_FORMATS)
        for key, value in (("question_key", question_key), ("answer_key", answer_key), ("id_key", id_key)):
            check_optional_name(key, value)
        check_held_out(eval_size, eval_fraction)
        check_optional_int("limit", limit, 1)
        self.template = resolve_template(template, {})
        self.system_prompt = check_optional_str("system_prompt", system_prompt)
        self.default_rewards = [{"name": "math", "weight": 1.0, "extract": "auto"}]
        self._opts = dict(question_key=question_key, answer_key=answer_key, id_key=id_key, answer_format=answer_format)

        self.path = Path(path)
        records = self._load(self.path, format, "path", limit)
        if eval_path is not None:
            self.eval_path: Path | None = Path(eval_path)
            train, held = records, self._load(self.eval_path, format, "eval_path", None)
            if eval_size is not None:
                held = sorted(held, key=lambda ex: _question_rank(ex.meta["question"]))[:eval_size]
            elif eval_fraction is not None:
                raise ConfigError("task_args.eval_fraction: not used with eval_path (use eval_size to cap it)")
            held_q = {ex.meta["question"].strip() for ex in held}
            train = [ex for ex in train if ex.meta["question"].strip() not in held_q]  # no leakage
        else:
            self.eval_path = None
            n = len(records)
            if eval_fraction is not None:
                k = round(n * eval_fraction)
            elif eval_size is not None:
                k = eval_size
            else:
                k = min(64, n // 10)
            ranked = sorted(records, key=lambda ex: _question_rank(ex.meta["question"]))
            # Cut at a question boundary: duplicates of a held-out question stay held out.
            held_q = {ex.meta["question"].strip() for ex in ranked[:k]}
            held = [ex for ex in records if ex.meta["question"].strip() in held_q]
            train = [ex for ex in records if ex.meta["question"].strip() not in held_q]
        if not train:
            raise ConfigError(
                f"task_args.eval_size: the held-out split leaves no training records in {self.path} "
                f"({len(records)} records); lower eval_size / eval_fraction"
            )
        self._train = train
        self._eval = held
        self.eval_size = len(held)

    def _load(self, path: Path, fmt: str, key: str, limit: int | None) -> list[Example]:
        o = self._opts
        out = []
        seen_ids: dict[str, int] = {}
        for where, rec in _read_records(path, fmt, key, limit):
            question = _field(rec, where, o["question_key"], QUESTION_KEYS, "question", "question_key")
            raw = _field(rec, where, o["answer_key"], ANSWER_KEYS, "answer", "answer_key")
            try:
                answer = normalise_answer(raw, o["answer_format"])
            except ValueError as e:
                raise ConfigError(f"{where}: {e} (task_args.answer_format is {o['answer_format']!r})") from e
            if not answer:
                raise ConfigError(f"{where}: empty answer")
            if o["id_key"] in rec and rec[o["id_key"]] is not None:
                rid = str(rec[o["id_key"]])
            else:
                rid = f"{path.stem}:{_question_rank(question)[:12]}"
            # Keep ids unique within a file (duplicated questions get a suffix).
            count = seen_ids.get(rid, 0)
            seen_ids[rid] = count + 1
            if count:
                rid = f"{rid}#{count}"
            meta = {"question": question, "source": where}
            if raw.strip() != answer:
                meta["solution"] = raw
            out.append(Example(prompt=self.template.format(question=question), answer=answer, meta=meta, id=rid))
        if not out:
            raise ConfigError(f"task_args.{key}: no records in {path}")
        return out
