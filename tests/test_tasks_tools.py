"""ToolsTask: generated questions are solvable by their reference call; local loader."""

from __future__ import annotations

import json
import random

import pytest

from grpolab.rewards import build_rewards, score_completions
from grpolab.tasks import build_task
from grpolab.util.fields import ConfigError


def test_builtin_questions_are_consistent():
    t = build_task("tools", seed=3)
    assert t.name == "tools" and t.default_rewards == [{"name": "tool_call", "weight": 1.0}]
    ev = t.eval_set()
    assert len(ev) == 50 and [e.prompt for e in ev] == [e.prompt for e in build_task("tools", 3).eval_set()]
    batch = t.sample(40, random.Random(0))
    assert not {e.prompt for e in batch} & {e.prompt for e in ev}
    fns = build_rewards(t.default_rewards)
    s = score_completions(fns, [e.answer for e in batch + ev], batch + ev)
    assert s.per_fn["tool_call"] == [1.0] * 90
    wrong = score_completions(fns, ["<tool_call>{}</tool_call>"] * 5, batch[:5])
    assert wrong.total == [0.0] * 5
    json.dumps([e.meta for e in batch])


def test_local_tasks(tmp_path):
    p = tmp_path / "tools.jsonl"
    rows = [
        {"prompt": "What is 6 times 7?", "tools": ["calculator"], "expected_tool": "calculator", "expected_result": 42},
        {
            "prompt": "Look up order 7.",
            "tools": [
                {
                    "name": "lookup",
                    "description": "Find an order.",
                    "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
                }
            ],
            "expected_arguments": {"id": 7},
        },
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    t = build_task("tools", 0, {"path": str(p), "eval_size": 0})
    exs = t.sample(10, random.Random(0))
    fns = build_rewards([{"name": "tool_call"}])
    comps = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
        if e.meta.get("expected_tool") == "calculator"
        else '<tool_call>{"name": "lookup", "arguments": {"id": 7}}</tool_call>'
        for e in exs
    ]
    assert score_completions(fns, comps, exs).total == [1.0] * 10


@pytest.mark.parametrize(
    "row,match",
    [
        ({"prompt": "x", "tools": ["shell"], "expected_arguments": {}}, "unknown built-in tool"),
        (
            {"prompt": "x", "tools": [{"name": "t", "parameters": {"type": "nonsense"}}], "expected_arguments": {}},
            "invalid JSON schema",
        ),
        ({"prompt": "x", "tools": ["calculator"]}, "expected_result or expected_arguments"),
        ({"prompt": "x", "tools": [{"name": "t"}], "expected_tool": "t", "expected_result": 1}, "built-in"),
        ({"tools": ["calculator"]}, "prompt"),
    ],
)
def test_local_task_errors(tmp_path, row, match):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(row))
    with pytest.raises(ConfigError, match=match):
        build_task("tools", 0, {"path": str(p)})
