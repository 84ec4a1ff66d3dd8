"""CodeTask: built-in problems, splits, and the MBPP / HumanEval loaders."""

from __future__ import annotations

import json
import random

import pytest

from grpolab.rewards.code import convert_tests
from grpolab.sandbox import SandboxConfig, run_many
from grpolab.tasks import build_task
from grpolab.tasks.code import CodeTask, load_problems
from grpolab.types import ConfigError


def test_builtin_problems_and_split():
    t = build_task("code", seed=0)
    assert t.name == "code" and t.default_rewards == [{"name": "code", "weight": 1.0}]
    assert len(t._train) + len(t._eval) >= 30
    ev = t.eval_set()
    assert ev == CodeTask(seed=0).eval_set()
    assert {e.id for e in ev} != {e.id for e in CodeTask(seed=1).eval_set()}
    assert not {e.id for e in ev} & {e.id for e in t._train}
    batch = t.sample(5, random.Random(0))
    assert len(batch) == 5 and all("```python" in e.prompt for e in batch)
    assert all(e.meta["tests"] and e.meta["entry_point"] for e in batch)
    json.dumps([e.meta for e in batch])  # meta is plain JSON (samples.jsonl)


def test_every_builtin_reference_solution_passes_and_a_stub_fails():
    probs = load_problems(None)
    assert len(probs) >= 30
    jobs = [(p["solution"], convert_tests(p["tests"], p["entry_point"])) for p in probs]
    res = run_many(jobs, SandboxConfig(timeout_s=5.0))
    assert [p["id"] for p, r in zip(probs, res) if r.fraction != 1.0] == []
    stubs = run_many([(f"def {p['entry_point']}(*a):\n    return None\n", j[1]) for p, j in zip(probs[:5], jobs)],
                     SandboxConfig(timeout_s=5.0))
    assert all(r.fraction < 1.0 for r in stubs)


def test_mbpp_and_humaneval_loader(tmp_path):
    path = tmp_path / "mix.jsonl"
    rows = [
        {"task_id": 1, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
         "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": ""},
        {"task_id": 2, "text": "Unconvertible.", "code": "def f(x):\n    return x",
         "test_list": ["assert f(1) > 0"], "test_setup_code": ""},
        {"task_id": "HumanEval/0", "prompt": "from typing import List\n\ndef inc(xs: List[int]) -> List[int]:\n    \"\"\"Add 1.\"\"\"\n",
         "canonical_solution": "    return [x + 1 for x in xs]\n", "entry_point": "inc",
         "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2]) == [2, 3]\n    assert candidate([]) == []\n"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    probs = load_problems(str(path))
    assert [p["entry_point"] for p in probs] == ["add", "inc"]  # the unconvertible one is skipped
    he = probs[1]
    assert he["tests"] == ["assert inc([1, 2]) == [2, 3]", "assert inc([]) == []"]
    assert he["setup"] == "from typing import List"
    res = run_many([(p["solution"], convert_tests(p["tests"], p["entry_point"])) for p in probs])
    assert [r.fraction for r in res] == [1.0, 1.0]
    assert len(load_problems(str(path), allow_assert_tests=True)) == 3
    t = build_task("code", seed=0, task_args={"path": str(path), "eval_size": 1})
    assert len(t.eval_set()) == 1 and len(t.sample(3, random.Random(0))) == 3


def test_loader_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        build_task("code", 0, {"path": str(tmp_path / "missing.jsonl")})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        build_task("code", 0, {"path": str(bad)})
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"question": "?"}) + "\n")
    with pytest.raises(ConfigError, match="unrecognised"):
        build_task("code", 0, {"path": str(odd)})
    with pytest.raises(ConfigError, match="eval_size"):
        build_task("code", 0, {"eval_size": -1})
    with pytest.raises(ConfigError):
        build_task("code", 0, {"bogus": 1})
