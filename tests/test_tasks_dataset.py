"""task=dataset: datasets directories, JSONL, parquet and CSV; column mapping; chat-message prompts;
held-out splits from the data's own split or a seeded fraction; bad rows named by file and row."""

from __future__ import annotations

import csv
import json
import random

import pytest

from grpolab.model.template import chat_prompts
from grpolab.tasks import TASKS, build_task
from grpolab.util.fields import ConfigError

ROWS = [{"q": f"What is {i} + {i}?", "a": str(2 * i), "level": i % 3} for i in range(20)]
MESSAGES = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2 + 2?"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task(path, seed=0, **args):
    return build_task("dataset", seed, {"path": str(path), **args})


def test_registered():
    assert TASKS["dataset"] == "grpolab.tasks.dataset:DatasetTask"


def test_jsonl_column_mapping_meta_and_seeded_fraction(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    t = task(path, prompt_column="q", answer_column="a", eval_fraction=0.25)
    held, train = t.eval_set(), t._train
    assert len(held) == 5 and len(train) == 15
    assert {e.prompt for e in held} | {e.prompt for e in train} == {r["q"] for r in ROWS}
    assert not {e.prompt for e in held} & {e.prompt for e in train}
    ex = next(e for e in train + held if e.prompt == "What is 3 + 3?")
    assert ex.answer == "6" and ex.meta == {"a": "6", "level": 0} and ex.id == "d.jsonl:4"
    # seeded: the same seed gives the same split, another seed another one
    assert [e.id for e in task(path, prompt_column="q", answer_column="a", eval_fraction=0.25).eval_set()] == [
        e.id for e in held
    ]
    assert [e.id for e in task(path, seed=1, prompt_column="q", answer_column="a", eval_fraction=0.25).eval_set()] != [
        e.id for e in held
    ]
    assert len(task(path, prompt_column="q", answer_column="a").eval_set()) == 4  # a fifth by default
    assert len(task(path, prompt_column="q", answer_column="a", eval_size=2).eval_set()) == 2
    batch = t.sample(4, random.Random(0))
    assert len(batch) == 4 and all(e in train for e in batch)


def test_default_columns_and_gsm8k_answers(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm.jsonl",
        [
            {"question": "Q1", "answer": "work... #### 1,234"},
            {"question": "Q2", "answer": 7},
            {"question": "Q3", "answer": 2.5},
        ],
    )
    t = task(path, eval_size=0)
    assert [(e.prompt, e.answer) for e in t._train] == [("Q1", "1234"), ("Q2", "7"), ("Q3", "2.5")]
    assert t._train[0].meta["answer"] == "work... #### 1,234"  # the raw column stays for rewards


def test_chat_message_prompts(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": MESSAGES, "answer": "4"}] * 3)
    t = task(path, eval_size=1)
    ex = t.eval_set()[0]
    assert ex.prompt == MESSAGES
    (ids,) = chat_prompts(tiny_tokenizer, [ex.prompt], None)
    assert ids == list(
        tiny_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    )
    text = tiny_tokenizer.decode(ids)
    assert "Answer with a number." in text and "What is 2 + 2?" in text
    # the task's system prompt goes first only when the messages have none
    (with_sys,) = chat_prompts(tiny_tokenizer, [MESSAGES[1:]], "Be terse.")
    assert "Be terse." in tiny_tokenizer.decode(with_sys)
    (own_sys,) = chat_prompts(tiny_tokenizer, [MESSAGES], "Be terse.")
    assert own_sys == ids


def test_string_prompts_are_templated_as_before(tiny_tokenizer):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    want = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert chat_prompts(tiny_tokenizer, ["hi"], "S") == [list(want)]


def test_csv_and_parquet(tmp_path):
    with (tmp_path / "d.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["q", "a", "level"])
        w.writeheader()
        w.writerows(ROWS)
    t = task(tmp_path / "d.csv", prompt_column="q", answer_column="a", eval_size=0)
    assert [(e.prompt, e.answer, e.meta["level"]) for e in t._train][:2] == [
        ("What is 0 + 0?", "0", "0"),
        ("What is 1 + 1?", "2", "1"),
    ]
    assert t._train[0].id == "d.csv:2"  # line 2: after the header
    import pyarrow as pa  # the parquet extra (make test installs it)
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": MESSAGES, "answer": "4", "k": 1}] * 2), tmp_path / "d.parquet")
    t = task(tmp_path / "d.parquet", eval_size=0)
    assert t._train[0].prompt == MESSAGES and t._train[0].meta == {"answer": "4", "k": 1}


def test_split_column_is_the_held_out_split(tmp_path):
    rows = [{**r, "split": "test" if i % 4 == 0 else "train"} for i, r in enumerate(ROWS)]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    t = task(path, prompt_column="q", answer_column="a")
    assert [e.prompt for e in t.eval_set()] == [r["q"] for r in rows if r["split"] == "test"]
    assert len(t._train) == 15 and t.split_source == "split 'test'"
    with pytest.raises(ConfigError, match="eval_fraction: the held-out rows come from split 'test'"):
        task(path, prompt_column="q", answer_column="a", eval_fraction=0.5)
    with pytest.raises(ConfigError, match="no row of .*s.jsonl has split 'dev'"):
        task(path, prompt_column="q", answer_column="a", eval_split="dev")


def test_datasets_directory(tmp_path):
    import datasets  # in the test extra (make test installs it)

    rows = [{"prompt": f"P{i}", "solution": str(i), "difficulty": i} for i in range(10)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    t = task(tmp_path / "one", eval_size=2)
    assert len(t.eval_set()) == 2 and len(t._train) == 8
    ex = t._train[0]
    assert ex.answer == ex.meta["solution"] and "difficulty" in ex.meta
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:7]), "test": datasets.Dataset.from_list(rows[7:])}
    )
    dd.save_to_disk(str(tmp_path / "dict"))
    t = task(tmp_path / "dict")
    assert [e.prompt for e in t.eval_set()] == ["P7", "P8", "P9"] and len(t._train) == 7
    assert t.split_source == "split 'test'" and "[test]: row 1" in t.eval_set()[0].id
    with pytest.raises(ConfigError, match="has no split 'dev'; its splits: test, train"):
        task(tmp_path / "dict", split="dev")


@pytest.mark.parametrize(
    "row,message",
    [
        ({"question": "Q"}, r"bad.jsonl:2: no answer column \(looked for 'answer', 'solution', 'ground_truth'"),
        ({"answer": "1"}, r"bad.jsonl:2: no prompt column \(looked for 'prompt', 'messages'"),
        ({"prompt": "   ", "answer": "1"}, r"bad.jsonl:2: empty prompt \(column 'prompt'\)"),
        ({"prompt": [], "answer": "1"}, r"bad.jsonl:2: empty prompt"),
        (
            {"prompt": "Q", "answer": ["1"]},
            r"bad.jsonl:2: the answer \(column 'answer'\) must be text or a number, got list",
        ),
        ({"prompt": "Q", "answer": True}, r"bad.jsonl:2: the answer .* got bool"),
        ({"prompt": "Q", "answer": ""}, r"bad.jsonl:2: empty answer"),
        ({"prompt": [{"role": "robot", "content": "x"}], "answer": "1"}, r"bad.jsonl:2: message 0 .* role 'robot'"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, r"bad.jsonl:2: message 0 of column 'prompt' must be"),
        ({"prompt": MESSAGES + [{"role": "assistant", "content": "4"}], "answer": "1"}, r"must end with a user turn"),
        (
            {"prompt": {"text": "Q"}, "answer": "1"},
            r"bad.jsonl:2: the prompt .* must be text or a list of chat messages",
        ),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine", "answer": "1"}, row])
    with pytest.raises(ConfigError, match=message):
        task(path)


def test_bad_options_and_files(tmp_path):
    with pytest.raises(ConfigError, match="task_args.path: required"):
        build_task("dataset", 0, {})
    with pytest.raises(ConfigError, match="not found"):
        task(tmp_path / "missing.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ConfigError, match="cannot tell the format .* set task_args.format"):
        task(tmp_path / "d.txt")
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(
        ConfigError, match=r"d.jsonl:1: no column 'question' \(task_args.prompt_column\); the row has 'q', 'a', 'level'"
    ):
        task(path, prompt_column="question")
    with pytest.raises(ConfigError, match="task_args.eval_split: .* no splits"):
        task(path, prompt_column="q", answer_column="a", eval_split="test")
    with pytest.raises(ConfigError, match="task_args.format: allowed values"):
        task(path, format="xml")
    with pytest.raises(ConfigError, match="task_args: .*unexpected keyword argument 'colum'"):
        task(path, colum="q")
    (tmp_path / "notds").mkdir()
    with pytest.raises(ConfigError, match="notds"):
        task(tmp_path / "notds")


def test_no_answer_column(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "write a haiku"}] * 3)
    t = task(path, answer_column=None, eval_size=1)
    assert t.eval_set()[0].answer == "" and len(t._train) == 2


def test_cli_trains_on_a_datasets_directory(tiny_model_dir, tmp_path):
    """End to end: a DatasetDict saved with save_to_disk, chat prompts, a TRL reward that reads a column."""
    import datasets

    from grpolab.app.cli import main
    from grpolab.util.fileio import read_jsonl

    rows = [
        {"prompt": [{"role": "user", "content": f"Say {i}."}], "solution": str(i), "bonus": i % 2} for i in range(8)
    ]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:6]), "test": datasets.Dataset.from_list(rows[6:])}
    ).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "r.py").write_text(
        "def bonus(completions, bonus, **kwargs):\n"
        "    assert isinstance(completions[0], list) and completions[0][0]['role'] == 'assistant'\n"
        "    return [float(b) for b in bonus]\n"
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                f"model={tiny_model_dir}",
                f"out={out}",
                "task=dataset",
                f"task_args.path={tmp_path / 'ds'}",
                f'rewards=[{{name: "{tmp_path / "r.py"}:bonus"}}]',
                "steps=1",
                "batch_size=8",
                "G=4",
                "max_new_tokens=4",
                "micro_batch=8",
                "progress=false",
                "tensorboard=false",
            ]
        )
        == 0
    )
    (m,) = read_jsonl(out / "metrics.jsonl", strict=True)
    assert m["reward/errors"] == 0 and m["reward/bonus/mean"] in (0.0, 0.5, 1.0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_before"]["n"] == 2  # the directory's own test split
    samples = read_jsonl(out / "samples.jsonl", strict=True)
    assert samples[0]["prompt"][0]["role"] == "user"
