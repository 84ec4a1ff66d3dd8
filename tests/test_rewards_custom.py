"""Reward functions of your own: by import path or file, TRL's form or grpolab's, and every bad return
value an error that names the function (never a number, never a crash)."""

from __future__ import annotations

import logging
import math
import textwrap
import threading

import pytest

from grpolab.batch import Example
from grpolab.rewards import REWARDS, RewardFn, as_factory, build_rewards, score_completions
from grpolab.util.fields import ConfigError

EX_A = Example(prompt="What is 2+2?", answer="4", meta={"level": 1, "source": "a"}, id="a")
EX_B = Example(prompt="What is 3+3?", answer="6", meta={"level": 2, "source": "b"}, id="b")
CHAT = Example(
    prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    answer="4",
    meta={"solution": "4"},
    id="c",
)

TRL_FILE = '''
calls = []

def exact(completions, prompts=None, answer=None, level=None, **kwargs):
    """A TRL-style reward: 1.0 when the completion ends with the answer."""
    calls.append({"completions": list(completions), "prompts": list(prompts), "answer": list(answer),
                  "level": list(level), "extra": sorted(kwargs)})
    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answer)]

def chatty(completions, solution, **kwargs):
    """TRL's conversational form: each completion is [{"role": "assistant", "content": ...}]."""
    return [float(c[0]["content"] == s) for c, s in zip(completions, solution)]

def scaled(completions, scale=1.0, **kwargs):
    return [scale * len(c) for c in completions]

def per_sample(completion, example):
    return float(example.answer in completion)

def only_named(completions, answer):
    return [float(a in c) for c, a in zip(completions, answer)]

def bad_values(completions, **kwargs):
    table = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "none": None, "str": "1.0",
             "list": [1.0], "ok": 0.5}
    return [table[c] for c in completions]

def short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)

def not_a_list(completions, **kwargs):
    return 1.0

def crash_on_b(completions, prompts, **kwargs):
    if "3+3" in prompts[0]:
        raise RuntimeError("my bug")
    return [1.0] * len(completions)

NOT_CALLABLE = 3
'''


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "my_rewards.py"
    path.write_text(TRL_FILE)
    return path


def one(reward_file, fn: str, **opts) -> RewardFn:
    (rf,) = build_rewards([{"name": f"{reward_file}:{fn}", **opts}])
    return rf


def test_trl_function_by_file_gets_completions_prompts_and_columns(reward_file):
    rf = one(reward_file, "exact")
    assert rf.name == "exact" and rf.batch and rf.weight == 1.0
    comps = ["so 4", "5", "it is 6", "six"]
    s = score_completions([rf], comps, [EX_A, EX_A, EX_B, EX_B])
    assert s.per_fn["exact"] == [1.0, 0.0, 1.0, 0.0]
    assert s.metrics["reward/exact/mean"] == 0.5 and s.metrics["reward/errors"] == 0
    import sys

    calls = next(
        m for n, m in sys.modules.items() if n.startswith("grpolab_user_rewards_") and hasattr(m, "exact")
    ).calls
    # one call per group of completions sharing a prompt, with TRL's keyword arguments
    assert sorted(c["prompts"][0] for c in calls[-2:]) == [EX_A.prompt, EX_B.prompt]
    call_a = next(c for c in calls[-2:] if c["prompts"][0] == EX_A.prompt)
    assert call_a == {
        "completions": ["so 4", "5"],
        "prompts": [EX_A.prompt] * 2,
        "answer": ["4", "4"],
        "level": [1, 1],
        "extra": ["log_extra", "log_metric", "source"],
    }


def test_chat_prompts_give_chat_completions(reward_file):
    rf = one(reward_file, "chatty")
    s = score_completions([rf], ["4", "5"], [CHAT, CHAT])
    assert s.per_fn["chatty"] == [1.0, 0.0]


def test_options_are_keyword_arguments_and_label_and_weight(reward_file):
    rf = one(reward_file, "scaled", scale=2.0, weight=0.5, label="twice")
    s = score_completions([rf], ["abc"], [EX_A])
    assert s.per_fn["twice"] == [6.0] and s.total == [3.0]
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.scale: .*only_named\(\) has no parameter 'scale'"):
        one(reward_file, "only_named", scale=2.0)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.completions: reserved"):
        one(reward_file, "scaled", completions=1)


def test_function_without_kwargs_gets_only_what_it_names(reward_file):
    s = score_completions([one(reward_file, "only_named")], ["4", "x"], [EX_A, EX_A])
    assert s.per_fn["only_named"] == [1.0, 0.0] and s.metrics["reward/errors"] == 0


def test_per_sample_form_by_file(reward_file):
    rf = one(reward_file, "per_sample")
    assert not rf.batch
    assert score_completions([rf], ["4", "x"], [EX_A, EX_A]).per_fn["per_sample"] == [1.0, 0.0]


def test_import_path(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text(
        textwrap.dedent("""
        def my_fn(completions, **kwargs):
            return [float(len(c) > 2) for c in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (rf,) = build_rewards([{"name": "mypkg.rewards:my_fn", "weight": 2.0}])
    s = score_completions([rf], ["abc", "a"], [EX_A, EX_A])
    assert rf.name == "my_fn" and s.per_fn["my_fn"] == [1.0, 0.0] and s.total == [2.0, 0.0]


@pytest.mark.parametrize(
    "name,message",
    [
        ("nosuchpkg_xyz.rewards:fn", "cannot import module 'nosuchpkg_xyz.rewards'"),
        ("grpolab.rewards.format:no_such", r"has no 'no_such'; its functions: .*make_format"),
        ("/nonexistent/rewards.py:fn", "reward file not found: /nonexistent/rewards.py"),
        ("json:", "expected 'package.module:function'"),
    ],
)
def test_bad_references_are_config_errors(name, message):
    with pytest.raises(ConfigError, match=r"rewards\[0\].*" + message):
        build_rewards([{"name": name}])


def test_not_callable_and_broken_file(reward_file, tmp_path):
    with pytest.raises(ConfigError, match="'NOT_CALLABLE' is a int, not a function|is a int, not a function"):
        one(reward_file, "NOT_CALLABLE")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ConfigError, match=r"importing .*broken.py failed: RuntimeError: boom at import"):
        build_rewards([{"name": f"{broken}:fn"}])
    odd = tmp_path / "odd.py"
    odd.write_text("def f(x):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="cannot tell how to call 'f'"):
        build_rewards([{"name": f"{odd}:f"}])


@pytest.mark.parametrize("on_error,fail", [("zero", 0.0), ("exclude", math.nan)])
def test_non_finite_and_non_numbers_are_errors_and_none_is_left_out(reward_file, on_error, fail, caplog):
    rf = one(reward_file, "bad_values")
    kinds = ["nan", "inf", "-inf", "none", "str", "list", "ok"]
    with caplog.at_level(logging.WARNING, logger="grpolab.rewards.scoring"):
        s = score_completions([rf], kinds, [EX_A] * len(kinds), on_error=on_error)
    got = s.per_fn["bad_values"]
    assert got[-1] == 0.5
    assert got[3] == 0.0 and s.none == {"bad_values": [3]}  # TRL form: None does not apply, not an error
    for x in got[:3] + got[4:-1]:
        assert math.isnan(x) if math.isnan(fail) else x == fail
    assert s.metrics["reward/errors"] == 5 and s.metrics["reward/timeouts"] == 0
    assert s.metrics["reward/none"] == 1 and s.metrics["reward/bad_values/none"] == 1
    assert all(math.isfinite(t) for t in s.total) == (on_error == "zero")
    assert s.total[3] == 0.0  # a None adds nothing, under either on_error
    assert s.metrics["reward/bad_values/mean"] == (0.5 / 6 if on_error == "zero" else 0.5)  # None left out
    joined = "\n".join(s.messages)
    for words in ("returned NaN", "returned inf", "returned -inf", "returned a str", "returned a list"):
        assert f"reward 'bad_values' {words}" in joined
    assert "returned None" not in joined and "reward 'bad_values' returned None" not in caplog.text  # not an error
    assert "All reward functions returned None for the following kwargs" in caplog.text  # TRL's warning
    assert "reward 'bad_values' returned NaN" in caplog.text  # logged, naming the function


def test_per_sample_nan_inf_and_none_are_errors():
    fns = [
        RewardFn("nan_fn", 1.0, lambda c, ex: float("nan")),
        RewardFn("inf_fn", 1.0, lambda c, ex: math.inf),
        RewardFn("none_fn", 1.0, lambda c, ex: None),
        RewardFn("fine", 1.0, lambda c, ex: 1.0),
    ]
    s = score_completions(fns, ["a", "b"], [EX_A, EX_A])
    assert s.per_fn == {"nan_fn": [0.0, 0.0], "inf_fn": [0.0, 0.0], "none_fn": [0.0, 0.0], "fine": [1.0, 1.0]}
    assert s.total == [1.0, 1.0] and s.metrics["reward/errors"] == 6
    assert s.metrics["reward/none"] == 0 and s.none == {}  # grpolab's form: None is a forgotten return
    assert any("'nan_fn' returned NaN" in m for m in s.messages)
    assert any("'inf_fn' returned inf" in m for m in s.messages)
    assert any("'none_fn' returned None" in m for m in s.messages)


@pytest.mark.parametrize(
    "fn,message",
    [("short", "returned 1 scores for 2 completions"), ("not_a_list", "returned a float, not a list of 2 scores")],
)
def test_wrong_length_is_an_error_for_the_whole_call(reward_file, fn, message):
    s = score_completions([one(reward_file, fn)], ["a", "b", "c", "d"], [EX_A, EX_A, EX_B, EX_B])
    assert s.per_fn[fn] == [0.0] * 4 and s.metrics["reward/errors"] == 4
    assert f"reward {fn!r} {message}" in s.messages[0]


def test_a_raise_fails_only_its_own_group(reward_file):
    s = score_completions([one(reward_file, "crash_on_b")], ["a", "b", "c", "d"], [EX_A, EX_A, EX_B, EX_B])
    assert s.per_fn["crash_on_b"] == [1.0, 1.0, 0.0, 0.0] and s.metrics["reward/errors"] == 2
    assert "reward 'crash_on_b' raised RuntimeError: my bug" in s.messages[0]


def test_a_hanging_batch_function_times_out():
    release = threading.Event()

    def hang(completions, **kwargs):
        release.wait(5)
        return [1.0] * len(completions)

    try:
        REWARDS["hang_test"] = as_factory(hang)
        (rf,) = build_rewards([{"name": "hang_test"}])
    finally:
        del REWARDS["hang_test"]
    s = score_completions([rf], ["a", "b"], [EX_A, EX_A], timeout_s=0.2)
    release.set()
    assert s.per_fn["hang_test"] == [0.0, 0.0]
    assert s.metrics["reward/timeouts"] == 2 and s.metrics["reward/errors"] == 0
    assert "reward 'hang_test' timed out on completion 0" in s.messages[0]
    assert rf.warned == {"timeout"}  # logged once for the run


def test_registered_factory_may_return_the_trl_form():
    def factory(threshold: int = 1):
        def long_enough(completions, **kwargs):
            return [float(len(c) > threshold) for c in completions]

        return long_enough

    REWARDS["long_test"] = factory
    try:
        (rf,) = build_rewards([{"name": "long_test", "threshold": 2}])
    finally:
        del REWARDS["long_test"]
    assert rf.batch
    assert score_completions([rf], ["abc", "ab"], [EX_A, EX_A]).per_fn["long_test"] == [1.0, 0.0]


CLI_REWARD = '''
def varied(completions, prompts=None, **kwargs):
    """A TRL reward as TRL users write it: one score per completion."""
    return [(sum(map(ord, c)) % 5) / 4 for c in completions]

def broken(completions, **kwargs):
    return [float("nan")] * len(completions)
'''


def test_cli_trains_two_steps_with_a_reward_named_by_file(tiny_model_dir, tmp_path, capsys, caplog):
    """End to end, as a user would: a TRL-style function in a .py file, named by path on the command line."""
    from grpolab.app.cli import main
    from grpolab.util.fileio import read_jsonl

    path = tmp_path / "rewards.py"
    path.write_text(CLI_REWARD)
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            "steps=2",
            "batch_size=8",
            "G=4",
            "max_new_tokens=8",
            "micro_batch=4",
            "eval_size=2",
            "progress=false",
            "tensorboard=false",
            "save_every=0",
            f'rewards=[{{name: "{path}:varied"}}, {{name: "{path}:broken", weight: 0.5}}]',
        ]
    )
    assert rc == 0, capsys.readouterr().err
    metrics = read_jsonl(out / "metrics.jsonl", strict=True)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0 <= m["reward/varied/mean"] <= 1
        assert m["reward/broken/mean"] == 0.0 and m["reward/errors"] == 8  # NaN: an error, never a number
        assert m["reward/mean"] == pytest.approx(m["reward/varied/mean"])
    assert any(m["reward/std"] > 0 for m in metrics)  # the file's reward drove real advantages
    samples = read_jsonl(out / "samples.jsonl", strict=True)
    assert samples and all(set(s["rewards"]) == {"varied", "broken"} for s in samples)
    warnings = [r.getMessage() for r in caplog.records if r.name == "grpolab.rewards.scoring"]
    assert len([w for w in warnings if "reward 'broken' returned NaN" in w]) == 1  # once per run, named


def doc_blocks(lang: str = "python") -> list[str]:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_docs_sandboxed_code_reward_runs_as_written(tmp_path):
    (block,) = [b for b in doc_blocks() if b.startswith("# code_rewards.py")]
    path = tmp_path / "code_rewards.py"
    path.write_text(block)
    (rf,) = build_rewards([{"name": f"{path}:tests_passed"}])
    assert not rf.batch and rf.fn.max_concurrency >= 1
    ex = Example(
        prompt="Write add(a, b).",
        answer="",
        id="m1",
        meta={"entry_point": "add", "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]},
    )
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    half = "```python\ndef add(a, b):\n    return 3\n```"
    s = score_completions([rf], [good, half, "no code"], [ex] * 3, timeout_s=30)
    assert s.per_fn["tests_passed"] == [1.0, 0.5, 0.0] and s.metrics["reward/errors"] == 0


def test_docs_trl_examples_and_factory_run_as_written():
    blocks = doc_blocks()
    ns: dict = {}
    exec(blocks[0], ns)  # TRL form
    assert ns["exact_answer"](["so 4", "5"], answer=["4", "4"], prompts=["p", "p"]) == [1.0, 0.0]
    ns2: dict = {}
    exec(blocks[1], ns2)  # per-sample form
    assert ns2["exact_answer"]("so 4", EX_A) == 1.0
    (factory_block,) = [b for b in blocks if 'REWARDS["brevity"]' in b]
    before = dict(REWARDS)
    try:
        exec(factory_block, {})
        (rf,) = build_rewards([{"name": "brevity", "max_words": 2}])
        assert rf.batch
        assert score_completions([rf], ["one two", "one two three"], [EX_A, EX_A]).per_fn["brevity"] == [1.0, 0.0]
    finally:
        REWARDS.clear()
        REWARDS.update(before)


def test_every_column_reaches_kwargs_even_with_odd_names():
    def fn(completions, **kwargs):
        return [float(v) for v in kwargs["my col"]]

    REWARDS["odd_cols_test"] = as_factory(fn)
    try:
        (rf,) = build_rewards([{"name": "odd_cols_test"}])
    finally:
        del REWARDS["odd_cols_test"]
    ex = Example(prompt="p", answer="a", meta={"my col": 2, "completions": "shadow"}, id="x")
    assert score_completions([rf], ["c"], [ex]).per_fn["odd_cols_test"] == [2.0]
