"""Tasks: determinism by seed, held-out disjointness, correct answers, file loading, error messages."""

from __future__ import annotations

import ast
import json
import random
import sys
from collections import Counter
from fractions import Fraction

import pytest

from grpolab.batch import Example
from grpolab.tasks import build_task
from grpolab.tasks.arithmetic import TEMPLATES as ARITH_TEMPLATES
from grpolab.tasks.qa import normalise_answer
from grpolab.util.fields import ConfigError


def _as_tuples(examples: list[Example]):
    return [(e.prompt, e.answer, json.dumps(e.meta, sort_keys=True), e.id) for e in examples]


# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------


def _python_value(question: str) -> int:
    """Recompute an arithmetic question independently: integer-only `ast` walk (no eval)."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)]
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(question, mode="eval"))


def test_arithmetic_default_prompt_and_answers():
    task = build_task("arithmetic", seed=0)
    assert task.name == "arithmetic"
    assert task.system_prompt is None
    assert task.default_rewards == [{"name": "math", "weight": 1.0, "extract": "last_number"}]
    batch = task.sample(50, random.Random(1))
    for ex in batch:
        a, b = ex.meta["operands"]
        assert 0 <= a <= 9 and 0 <= b <= 9
        assert ex.prompt == f"What is {a} + {b}? Give the final answer as a number."
        assert ex.answer == str(a + b)
        assert ex.id == f"arithmetic:{a}+{b}"


@pytest.mark.parametrize(
    "args",
    [
        {"digits": 2, "operators": "+-*", "n_operands": 3},
        {"min_digits": 1, "max_digits": 3, "operators": ["-", "*"], "n_operands": 4, "allow_negative": True},
        {"digits": 1, "operators": "-", "n_operands": 2},
    ],
)
def test_arithmetic_answers_recomputed(args):
    task = build_task("arithmetic", seed=3, task_args=args)
    for ex in task.sample(200, random.Random(0)) + task.eval_set():
        assert int(ex.answer) == _python_value(ex.meta["question"])
        if not args.get("allow_negative"):
            assert int(ex.answer) >= 0
        assert len(ex.meta["operands"]) == args["n_operands"]
        assert set(ex.meta["operators"]) <= set(args["operators"])
        lo = args.get("min_digits", args.get("digits"))
        hi = args.get("max_digits", args.get("digits"))
        assert all(lo <= len(str(x)) <= hi for x in ex.meta["operands"])


def test_arithmetic_deterministic_by_seed():
    a, b, c = (build_task("arithmetic", s, {"digits": 2, "operators": "+-"}) for s in (5, 5, 6))
    assert _as_tuples(a.eval_set()) == _as_tuples(b.eval_set())
    assert _as_tuples(a.eval_set()) != _as_tuples(c.eval_set())
    assert _as_tuples(a.sample(20, random.Random(9))) == _as_tuples(b.sample(20, random.Random(9)))
    assert _as_tuples(a.sample(20, random.Random(9))) != _as_tuples(a.sample(20, random.Random(10)))


def test_arithmetic_heldout_disjoint_and_sized():
    task = build_task("arithmetic", seed=0, task_args={"digits": 2, "eval_size": 30})
    held = task.eval_set()
    assert len(held) == 30 and len({e.id for e in held}) == 30
    train_ids = {e.id for e in task.sample(3000, random.Random(0))}
    assert not train_ids & {e.id for e in held}


def test_arithmetic_small_space_caps_default_eval_size():
    # Single-digit sums: 100 problems. The default eval_size (64) is lowered to half the space,
    # and training covers exactly the other half.
    task = build_task("arithmetic", seed=0)
    assert task.space_size == 100 and task.eval_size == 50
    held = {e.id for e in task.eval_set()}
    train = {e.id for e in task.sample(2000, random.Random(0))}
    assert len(held) == 50 and len(train) == 50 and not held & train
    with pytest.raises(ConfigError, match=r"task_args\.eval_size: at most 50"):
        build_task("arithmetic", seed=0, task_args={"eval_size": 64})


def test_arithmetic_templates():
    for name, fmt in ARITH_TEMPLATES.items():
        ex = build_task("arithmetic", 0, {"template": name}).sample(1, random.Random(0))[0]
        assert ex.prompt == fmt.format(question=ex.meta["question"])
    ex = build_task("arithmetic", 0, {"template": "Q: {question} =", "system_prompt": "Be brief."})
    assert ex.system_prompt == "Be brief."
    assert ex.sample(1, random.Random(0))[0].prompt.startswith("Q: ")


@pytest.mark.parametrize(
    "args, match",
    [
        ({"digits": 0}, r"task_args\.digits: must be between 1 and 18"),
        ({"digits": "2"}, r"task_args\.digits: expected an integer"),
        ({"operators": "+/"}, r'task_args\.operators: allowed operators are "\+", "-", "\*"'),
        ({"operators": ""}, r"task_args\.operators"),
        ({"operators": ["+-"]}, r"task_args\.operators: allowed operators"),  # one operator per item
        ({"operators": [""]}, r"task_args\.operators: allowed operators"),
        ({"operators": 5}, r'task_args\.operators: expected a subset of "\+-\*"'),
        ({"n_operands": 1}, r"task_args\.n_operands: must be between 2 and 8"),
        ({"min_digits": 3, "max_digits": 2}, r"task_args\.min_digits: must be <= max_digits"),
        ({"template": "no placeholder"}, r"task_args\.template: expected a preset \(short, .*\{question\}"),
        ({"template": "{question} {oops}"}, r"task_args\.template: not a valid format string"),
        ({"template": "{question} {numbers}"}, r"task_args\.template: not a valid format string"),
        ({"eval_size": -1}, r"task_args\.eval_size: must be >= 0"),
        ({"allow_negative": "yes"}, r"task_args\.allow_negative"),
        ({"system_prompt": 3}, r"task_args\.system_prompt"),
        ({"colour": "red"}, r"task_args: .*colour"),
    ],
)
def test_arithmetic_bad_options(args, match):
    with pytest.raises(ConfigError, match=match):
        build_task("arithmetic", seed=0, task_args=args)


# ---------------------------------------------------------------------------------------------
# countdown
# ---------------------------------------------------------------------------------------------


def _countdown_value(expr: str, numbers: list[int]) -> Fraction:
    """Evaluate `expr` exactly (Fractions over an `ast` walk, no eval) and check that it uses
    each of `numbers` exactly once."""
    used: list[int] = []

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            return a / b  # ZeroDivisionError would fail the test, as it should
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    value = walk(ast.parse(expr, mode="eval"))
    assert Counter(used) == Counter(numbers), (expr, numbers)
    return value


def test_countdown_answers_valid():
    task = build_task("countdown", seed=0)
    assert task.default_rewards == [{"name": "format", "weight": 0.1}, {"name": "countdown", "weight": 1.0}]
    for ex in task.sample(300, random.Random(0)) + task.eval_set():
        nums, target = ex.meta["numbers"], ex.meta["target"]
        assert set(ex.meta) == {"numbers", "target"}
        assert 3 <= len(nums) <= 4 and all(1 <= x <= 99 for x in nums)
        assert isinstance(target, int) and 1 <= target <= 100
        assert _countdown_value(ex.answer, nums) == target
        assert str(nums) in ex.prompt and str(target) in ex.prompt
        assert "<think>" in ex.prompt and "<answer>" in ex.prompt


def test_countdown_options_and_fraction_steps():
    args = {
        "n_numbers": 4,
        "number_range": [1, 20],
        "target_range": [10, 50],
        "operators": "*/-",
        "integer_steps": False,
        "eval_size": 10,
        "template": "short",
    }
    task = build_task("countdown", seed=1, task_args=args)
    assert len(task.eval_set()) == 10
    for ex in task.sample(100, random.Random(0)):
        assert len(ex.meta["numbers"]) == 4 and all(1 <= x <= 20 for x in ex.meta["numbers"])
        assert 10 <= ex.meta["target"] <= 50
        assert "+" not in ex.answer
        assert _countdown_value(ex.answer, ex.meta["numbers"]) == ex.meta["target"]


def test_countdown_deterministic_and_disjoint():
    a, b, c = (build_task("countdown", s, {"eval_size": 40}) for s in (7, 7, 8))
    assert _as_tuples(a.eval_set()) == _as_tuples(b.eval_set())
    assert _as_tuples(a.eval_set()) != _as_tuples(c.eval_set())
    assert _as_tuples(a.sample(10, random.Random(2))) == _as_tuples(b.sample(10, random.Random(2)))
    held = {e.id for e in a.eval_set()}
    assert len(held) == 40
    # A small space so that collisions with the held-out set would certainly happen if not excluded.
    small = build_task(
        "countdown",
        0,
        {"n_numbers": 2, "number_range": [1, 6], "operators": "+", "target_range": [2, 12], "eval_size": 8},
    )
    held = {e.id for e in small.eval_set()}
    train = {e.id for e in small.sample(500, random.Random(0))}
    assert len(held) == 8 and train and not held & train


@pytest.mark.parametrize(
    "args, match",
    [
        ({"n_numbers": 1}, r"task_args\.n_numbers\[0\]: must be between 2 and 6"),
        ({"n_numbers": [4, 3]}, r"task_args\.n_numbers: lo must be <= hi"),
        ({"number_range": "1-99"}, r"task_args\.number_range: expected \[lo, hi\]"),
        ({"operators": "+^"}, r"task_args\.operators: allowed operators"),
        ({"operators": ["+-"]}, r"task_args\.operators: allowed operators"),
        ({"operators": 5}, r'task_args\.operators: expected a subset of "\+-\*/"'),
        ({"integer_steps": "no"}, r"task_args\.integer_steps: expected true or false"),
        ({"system_prompt": 3}, r"task_args\.system_prompt: expected a string or null"),
        ({"template": "{numbers} {target} {x}"}, r"task_args\.template: not a valid format string"),
        ({"template": "make {target}"}, r"task_args\.template: .*\{numbers\} and \{target\}"),
        ({"target_range": [5000, 6000], "number_range": [1, 3], "n_numbers": 2}, r"could not generate"),
        ({"eval_size": 200, "number_range": [1, 3], "n_numbers": 2, "operators": "+"}, r"task_args\.eval_size"),
    ],
)
def test_countdown_bad_options(args, match):
    with pytest.raises(ConfigError, match=match):
        build_task("countdown", seed=0, task_args=args)


# ---------------------------------------------------------------------------------------------
# qa
# ---------------------------------------------------------------------------------------------


def test_gsm8k_and_boxed_parsing():
    assert normalise_answer("She pays 2 * 3 = <<2*3=6>>6.\n#### 6") == "6"
    assert normalise_answer("a #### 1 \n more #### 1,234,567") == "1234567"
    assert normalise_answer("#### -3.5", "gsm8k") == "-3.5"
    assert normalise_answer("#### 7\n(a note on the next line)") == "7"  # the answer line only
    assert normalise_answer("Total $1,000.\n#### 1,000") == "1000"
    assert normalise_answer(r"so \boxed{1} then \boxed{\frac{1}{2}}.", "boxed") == r"\frac{1}{2}"
    assert normalise_answer(r"The answer is $\boxed{x^{2}}$") == "x^{2}"
    assert normalise_answer("  42 ") == "42"
    assert normalise_answer("#### 5", "raw") == "#### 5"
    with pytest.raises(ValueError):
        normalise_answer("no box", "boxed")


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _gsm_rows(n):
    return [
        {
            "question": f"Tom has {i} apples and buys 1,000 more. How many?",
            "answer": f"{i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000}\n#### {i + 1000:,}",
        }
        for i in range(n)
    ]


def test_qa_jsonl_gsm8k(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", _gsm_rows(100))
    task = build_task(
        "qa",
        seed=0,
        task_args={"path": str(path), "eval_size": 10, "template": "{question}\nGive the final answer as a number."},
    )
    assert task.default_rewards == [{"name": "math", "weight": 1.0, "extract": "auto"}]
    held = task.eval_set()
    assert len(held) == 10 and len(task) == 90
    for ex in held + task.sample(90, random.Random(0)):
        i = int(ex.meta["question"].split()[2])
        assert ex.answer == str(i + 1000)
        assert ex.prompt == ex.meta["question"] + "\nGive the final answer as a number."
        assert ex.meta["solution"].endswith(f"#### {i + 1000:,}")
    # Disjoint, and every record is in exactly one split.
    train_ids = {e.id for e in task.sample(90, random.Random(0))}
    assert len(train_ids) == 90 and not train_ids & {e.id for e in held}
    # The split depends on the file only: a different seed gives the same held-out questions;
    # sampling is deterministic given the rng.
    other = build_task("qa", seed=1, task_args={"path": str(path), "eval_size": 10})
    assert [e.id for e in other.eval_set()] == [e.id for e in held]
    assert _as_tuples(other.sample(5, random.Random(3))) == _as_tuples(other.sample(5, random.Random(3)))
    # eval_fraction and the default split.
    assert len(build_task("qa", 0, {"path": str(path), "eval_fraction": 0.25}).eval_set()) == 25
    assert len(build_task("qa", 0, {"path": str(path)}).eval_set()) == 10  # min(64, 10%)


def test_qa_default_and_custom_keys(tmp_path):
    rows = [
        {"problem": "1+1?", "solution": r"It is $\boxed{2}$.", "id": "p1"},
        {"prompt": "2+2?", "answer": 4},
        {"question": "3+3?", "answer": "6"},
        {"question": "4+4?", "answer": "8"},
    ]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    task = build_task("qa", 0, {"path": str(path), "eval_size": 1})
    got = {e.meta["question"]: (e.answer, e.id) for e in task.eval_set() + task._train}
    assert got["1+1?"] == ("2", "p1")
    assert got["2+2?"][0] == "4" and got["2+2?"][1].startswith("mixed:")
    custom = _write_jsonl(tmp_path / "custom.jsonl", [{"q": f"x{i}", "a": str(i)} for i in range(5)])
    task = build_task("qa", 0, {"path": str(custom), "question_key": "q", "answer_key": "a", "eval_size": 2})
    assert sorted(e.answer for e in task.eval_set() + task._train) == ["0", "1", "2", "3", "4"]


def test_qa_duplicates_never_straddle_split(tmp_path):
    rows = _gsm_rows(30) * 2  # every question twice
    path = _write_jsonl(tmp_path / "dup.jsonl", rows)
    task = build_task("qa", 0, {"path": str(path), "eval_size": 5})
    held_q = {e.meta["question"] for e in task.eval_set()}
    assert not held_q & {e.meta["question"] for e in task._train}
    assert len({e.id for e in task.eval_set() + task._train}) == 60  # ids stay unique


def test_qa_eval_path(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", _gsm_rows(20))
    test = _write_jsonl(tmp_path / "test.jsonl", _gsm_rows(25)[15:])  # 5 questions overlap train
    task = build_task("qa", 0, {"path": str(train), "eval_path": str(test)})
    assert len(task.eval_set()) == 10 and len(task) == 15
    task = build_task("qa", 0, {"path": str(train), "eval_path": str(test), "eval_size": 3})
    assert len(task.eval_set()) == 3


def test_qa_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = _gsm_rows(20)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    task = build_task("qa", 0, {"path": str(path), "eval_size": 4})
    assert len(task.eval_set()) == 4 and len(task) == 16
    assert all(e.answer == str(int(e.meta["question"].split()[2]) + 1000) for e in task.eval_set())
    assert task.eval_set()[0].meta["source"].startswith(f"{path}: row ")
    # Same records from JSONL give the same split.
    jl = _write_jsonl(tmp_path / "train.jsonl", rows)
    assert [e.answer for e in build_task("qa", 0, {"path": str(jl), "eval_size": 4}).eval_set()] == [
        e.answer for e in task.eval_set()
    ]


def test_qa_parquet_without_pyarrow(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"pip install grpolab\[parquet\]"):
        build_task("qa", 0, {"path": str(path)})


def test_qa_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"task_args\.path: required"):
        build_task("qa", 0, {})
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ConfigError, match=r"task_args\.path: file not found: .*nope\.jsonl"):
        build_task("qa", 0, {"path": str(missing)})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": \n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:3: invalid JSON"):
        build_task("qa", 0, {"path": str(bad)})
    notobj = tmp_path / "list.jsonl"
    notobj.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match=r"list\.jsonl:1: expected a JSON object"):
        build_task("qa", 0, {"path": str(notobj)})
    nokey = _write_jsonl(tmp_path / "nokey.jsonl", [{"question": "a", "answer": "1"}, {"text": "b", "answer": "2"}])
    with pytest.raises(ConfigError, match=r"nokey\.jsonl:2: no question field .*'text'.*task_args\.question_key"):
        build_task("qa", 0, {"path": str(nokey)})
    one = _write_jsonl(tmp_path / "one.jsonl", [{"question": "a", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"leaves no training records"):
        build_task("qa", 0, {"path": str(one), "eval_size": 1})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"no records in"):
        build_task("qa", 0, {"path": str(empty)})
    for args, match in [
        ({"eval_fraction": 1.5}, r"task_args\.eval_fraction: expected a number in \(0, 1\)"),
        ({"eval_fraction": 0.1, "eval_size": 3}, r"not both"),
        ({"answer_format": "latex"}, r"task_args\.answer_format: allowed values are auto, gsm8k"),
        ({"format": "csv"}, r"task_args\.format: allowed values are auto, jsonl, parquet"),
        ({"template": "Q:"}, r"task_args\.template: .*\{question\}"),
        ({"answer_format": "boxed"}, r"one\.jsonl:1: no \\boxed"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_task("qa", 0, {"path": str(one), **args})
