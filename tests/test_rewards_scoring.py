"""build_rewards and score_completions: config errors, weights, failures become numbers."""

from __future__ import annotations

import math
import threading
import time

import pytest

from grpolab import rewards
from grpolab.batch import Example
from grpolab.rewards import REWARDS, RewardFn, build_rewards, score_completions
from grpolab.util.fields import ConfigError

EX = Example(prompt="p", answer="4", id="e")


def test_registry_names():
    assert {"format", "math", "countdown", "code", "tool_call"} <= set(REWARDS)


def test_unknown_name_lists_known():
    with pytest.raises(ConfigError, match="known rewards: code, countdown, format, math, reward_model, tool_call"):
        build_rewards([{"name": "maths"}])


def test_bad_kwarg_names_key():
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.extrakt"):
        build_rewards([{"name": "math", "extrakt": "boxed"}])
    with pytest.raises(ConfigError, match="weight"):
        build_rewards([{"name": "math", "weight": "heavy"}])
    with pytest.raises(ConfigError, match="name"):
        build_rewards([{"weight": 1.0}])
    with pytest.raises(ConfigError, match="twice"):
        build_rewards([{"name": "format"}, {"name": "format"}])
    fns = build_rewards([{"name": "format"}, {"name": "format", "label": "format2", "partial": 0.5}])
    assert [f.name for f in fns] == ["format", "format2"]


def test_weighted_total_and_metrics():
    fns = build_rewards([{"name": "format", "weight": 0.5}, {"name": "math", "weight": 2.0}])
    comps = ["<think>a</think><answer>4</answer>", "<answer>4</answer>", "<answer>5</answer>"]
    s = score_completions(fns, comps, [EX] * 3)
    assert s.per_fn["format"] == [1.0, 0.0, 0.0]
    assert s.per_fn["math"] == [1.0, 1.0, 0.0]
    assert s.total == [2.5, 2.0, 0.0]
    assert s.metrics["reward/format/mean"] == pytest.approx(1 / 3)
    assert s.metrics["reward/math/mean"] == pytest.approx(2 / 3)
    assert s.metrics["reward/errors"] == 0 and s.metrics["reward/timeouts"] == 0
    assert s.metrics["reward/none"] == 0 and s.none == {}
    assert not [k for k in s.metrics if k.endswith("/none") and k != "reward/none"]  # per-sample form: no None


def test_batch_none_adds_nothing_and_per_sample_none_is_an_error():
    """RewardFn.batch (TRL form): None leaves the completion out; per-sample form: None is an error.

    completion   batch (w 2)   per-sample (w 1)   total
    0            0.5           1.0                2*0.5 + 1 = 2.0
    1            None          None -> error, 0   0.0
    """
    fns = [
        RewardFn("b", 2.0, lambda cs, exs: [0.5, None], batch=True),
        RewardFn("p", 1.0, lambda c, ex: 1.0 if c == "x" else None),
    ]
    s = score_completions(fns, ["x", "y"], [EX, EX])
    assert s.total == [2.0, 0.0] and s.per_fn == {"b": [0.5, 0.0], "p": [1.0, 0.0]}
    assert s.metrics["reward/b/mean"] == 0.5 and s.metrics["reward/p/mean"] == 0.5
    assert s.metrics["reward/b/none"] == 1 and s.metrics["reward/none"] == 1 and s.none == {"b": [1]}
    assert s.metrics["reward/errors"] == 1 and "reward 'p' returned None" in s.messages[0]


def _boom(c, ex):
    raise RuntimeError("verifier bug")


def _slow(c, ex):
    time.sleep(0.5 if c == "slow" else 0)
    return 1.0


def _nan(c, ex):
    return float("nan")


def test_errors_and_timeouts_are_zero_and_counted():
    fns = [RewardFn("boom", 1.0, _boom), RewardFn("slow", 1.0, _slow), RewardFn("nan", 1.0, _nan)]
    t = time.monotonic()
    s = score_completions(fns, ["slow", "fast"], [EX, EX], timeout_s=0.2, workers=2)
    assert time.monotonic() - t < 0.5
    assert s.per_fn["boom"] == [0.0, 0.0]
    assert s.per_fn["slow"] == [0.0, 1.0]
    assert s.per_fn["nan"] == [0.0, 0.0]
    assert s.metrics["reward/errors"] == 4
    assert s.metrics["reward/timeouts"] == 1
    assert s.total == [0.0, 1.0]


def test_exclude_gives_nan():
    fns = [RewardFn("boom", 1.0, _boom), RewardFn("one", 1.0, lambda c, e: 1)]
    s = score_completions(fns, ["a"], [EX], on_error="exclude")
    assert math.isnan(s.per_fn["boom"][0]) and math.isnan(s.total[0])
    assert s.metrics["reward/boom/mean"] == 0.0 and s.metrics["reward/one/mean"] == 1.0


def test_stuck_calls_do_not_block_the_batch():
    gate = threading.Event()

    def stuck(c, ex):
        if c == "stuck":
            gate.wait(10)
        return 1.0

    t = time.monotonic()
    s = score_completions([RewardFn("s", 1.0, stuck)], ["stuck"] * 2 + ["ok"] * 6, [EX] * 8, timeout_s=0.3, workers=2)
    gate.set()
    assert time.monotonic() - t < 1.5
    assert s.per_fn["s"] == [0.0, 0.0] + [1.0] * 6
    assert s.metrics["reward/timeouts"] == 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        score_completions([], ["a"], [])
    with pytest.raises(ValueError):
        score_completions([], ["a"], [EX], on_error="ignore")
    s = score_completions([], ["a"], [EX])
    assert s.total == [0.0]
    assert rewards.Scores is type(s)


def test_max_concurrency_queueing_does_not_count_against_the_timeout():
    active, peak = [0], [0]
    lock = threading.Lock()

    def pooled(c, ex):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.15)
        with lock:
            active[0] -= 1
        return 1.0

    pooled.max_concurrency = 1
    s = score_completions([RewardFn("p", 1.0, pooled)], ["x"] * 5, [EX] * 5, timeout_s=0.4, workers=4)
    assert s.per_fn["p"] == [1.0] * 5 and peak[0] == 1


def test_a_stuck_bounded_group_times_out_instead_of_hanging():
    gate = threading.Event()

    def stuck(c, ex):
        gate.wait(10)
        return 1.0

    stuck.max_concurrency = 1
    t = time.monotonic()
    s = score_completions([RewardFn("s", 1.0, stuck)], ["x"] * 4, [EX] * 4, timeout_s=0.3, workers=2)
    gate.set()
    assert time.monotonic() - t < 2.0
    assert s.per_fn["s"] == [0.0] * 4 and s.metrics["reward/timeouts"] == 4


class _FloatRaises:
    def __float__(self):
        raise RuntimeError("no float for you")


class _FloatLoops:
    def __float__(self):
        time.sleep(3.0)  # far past the call's timeout (then returns, so no thread is left behind)
        return 1.0


class _Endless:
    """Claims a length of 2 but never stops yielding: listing it would eat all memory."""

    def __len__(self):
        return 2

    def __iter__(self):
        while True:
            yield 1.0


class _StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("no str either")


def _raise_unprintable(c, ex):
    raise _StrRaises()


def test_values_whose_float_fails_are_counted_errors_not_crashes():
    """Each return value below made score_completions raise (or hang) and end the run; each is now
    one counted reward error scoring 0, and the other completion keeps its score."""
    cases = {
        "big_int": lambda c, ex: 10**400 if c == "bad" else 1.0,  # OverflowError in float()
        "float_raises": lambda c, ex: _FloatRaises() if c == "bad" else 1.0,  # RuntimeError from __float__
        "unprintable": lambda c, ex: _raise_unprintable(c, ex) if c == "bad" else 1.0,  # str() of the error raises
        "batch_endless": None,
        "batch_big_int": None,
    }
    fns = [RewardFn(name, 1.0, fn) for name, fn in cases.items() if fn is not None]
    fns.append(RewardFn("batch_endless", 1.0, lambda cs, exs: _Endless() if cs == ["bad"] else [1.0], batch=True))
    fns.append(RewardFn("batch_big_int", 1.0, lambda cs, exs: [10**400] if cs == ["bad"] else [1.0], batch=True))
    ex_bad, ex_ok = Example(prompt="p", answer="4", id="bad"), Example(prompt="p", answer="4", id="ok")
    t = time.monotonic()
    s = score_completions(fns, ["bad", "ok"], [ex_bad, ex_ok], timeout_s=5.0)
    assert time.monotonic() - t < 5.0
    for name in cases:
        assert s.per_fn[name] == [0.0, 1.0], name
        assert s.errors[name] == [0], name
    assert s.metrics["reward/errors"] == len(cases) and s.metrics["reward/timeouts"] == 0
    assert s.total == [0.0, float(len(cases))]
    text = "\n".join(s.messages)
    assert "too large for a float" in text and "RuntimeError: no float for you" in text
    assert "more than 1 scores for 1 completions" in text and "whose str() raised" in text


def test_a_float_that_never_returns_is_a_timeout():
    """__float__ runs in the scoring thread, under the call's timeout (it used to run after it, unbounded)."""
    fns = [RewardFn("loops", 1.0, lambda c, ex: _FloatLoops())]
    t = time.monotonic()
    s = score_completions(fns, ["a"], [EX], timeout_s=0.3)
    assert time.monotonic() - t < 2.0
    assert s.per_fn["loops"] == [0.0] and s.metrics["reward/timeouts"] == 1
