"""Bounds on reward functions of the user's, whatever they do.

- `async def` rewards: the calling thread waits at most the timeout, whatever the coroutine does (awaits a
  thread that never ends, blocks the loop with synchronous work, swallows its cancellation): each is a
  counted timeout at the timeout, never a score.
- reward_process: a reward that is one long C operation holding the GIL on the model's text (a backtracking
  regex, `10 ** int(digits)`) runs in a child process killed at its timeout; its score, its errors and what
  it logged (TRL's log_extra / log_metric) come back; an allocation past its memory limit fails the call.
- One huge finite reward (-1e300) is clipped to -1e6 and counted (reward/clipped), so the float32 update
  stays finite.

Times are checked against the timeout plus SLACK_S, far wider than a loaded machine's scheduling noise: the
point is the bound (before: 12 to 20 s for a 2 s timeout, or never).
"""

from __future__ import annotations

import asyncio
import mmap
import re
import threading
import time

import pytest
import torch

from grpolab.algo.advantages import adv_group_mean, adv_group_zscore
from grpolab.batch import Example
from grpolab.rewards import build_rewards
from grpolab.rewards.custom import adapt
from grpolab.rewards.scoring import RewardFn, score_completions
from grpolab.rewards.values import MAX_SCORE

TIMEOUT_S = 2.0
SLACK_S = 3.0
EX = Example(prompt="q", answer="1")


@pytest.fixture()
def release():
    """An event the test's hanging work waits on; set at the end so that abandoned threads end."""
    ev = threading.Event()
    yield ev
    ev.set()


def test_async_rewards_are_timeouts_at_the_timeout_whatever_they_do(release):
    async def awaits_a_thread(completion, example):
        await asyncio.to_thread(release.wait, 60)  # the thread outlives the call
        return 1.0

    async def blocks_the_loop(completion, example):
        release.wait(60)  # synchronous work inside async def: the loop cannot run wait_for's timer
        return 1.0

    async def swallows_cancel(completion, example):
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass  # refuses to be cancelled
        return 1.0

    async def quick(completion, example):
        await asyncio.sleep(0)
        return 0.5

    fns = [RewardFn(f.__name__, 1.0, f) for f in (awaits_a_thread, blocks_the_loop, swallows_cancel, quick)]
    t0 = time.monotonic()
    s = score_completions(fns, ["a", "b"], [EX, EX], timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT_S + SLACK_S, f"took {elapsed:.1f}s"
    # none scored; a coroutine that blocks the loop stops the loop's other calls too (`quick`, started after it)
    assert s.metrics["reward/timeouts"] == 8
    for name in ("awaits_a_thread", "blocks_the_loop", "swallows_cancel", "quick"):
        assert s.per_fn[name] == [0.0, 0.0] and s.errors[name] == [0, 1]
    s = score_completions([fns[0], fns[3]], ["a", "b"], [EX, EX], timeout_s=TIMEOUT_S)
    assert s.per_fn["quick"] == [0.5, 0.5] and s.errors == {"awaits_a_thread": [0, 1]}  # without a blocker


def backtracking(completion, example):
    """A per-sample reward whose regex backtracks exponentially on 'a' * 40 + 'b'."""
    return 1.0 if re.match(r"(a+)+$", completion) else 0.0


def power_of_ten(completions, **kwargs):
    """TRL form: 10 ** int(the digits the model wrote), a C operation holding the GIL for a huge exponent."""
    out = []
    for c in completions:
        digits = "".join(ch for ch in c if ch.isdigit())
        out.append(float(len(str(10 ** int(digits)))) if digits else 0.0)
    return out


def test_gil_holding_rewards_are_cut_at_their_timeout_in_child_processes():
    """The regex and the power run in child processes (RewardFn.user, process=True): each hostile call is a
    timeout within TIMEOUT_S + SLACK_S while the calling thread keeps ticking; the other calls score."""
    trl_fn, batch = adapt(power_of_ten, {}, "rewards[1]")
    fns = [RewardFn("regex", 1.0, backtracking, user=True), RewardFn("power", 1.0, trl_fn, batch=batch, user=True)]
    other = Example(prompt="other", answer="1")
    completions = ["a" * 40 + "b", "aaaa", "x 99999999999", "x 12"]
    examples = [EX, EX, other, other]  # two TRL calls: the power's hostile group and a plain one
    results, ticks = [], 0
    t0 = time.monotonic()
    worker = threading.Thread(
        target=lambda: results.append(
            score_completions(fns, completions, examples, timeout_s=TIMEOUT_S, process=True, workers=2)
        )
    )
    worker.start()
    while worker.is_alive():
        ticks += 1
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    (s,) = results
    assert elapsed < TIMEOUT_S + SLACK_S, f"took {elapsed:.1f}s"
    assert ticks >= 20  # this thread was never frozen by the GIL
    assert s.per_fn["regex"] == [0.0, 1.0, 0.0, 0.0]
    assert s.errors["regex"] == [0]  # the backtracking call timed out; "aaaa" matched
    assert s.per_fn["power"] == [0.0, 0.0, 0.0, 0.0] and s.errors["power"] == [2, 3]  # no digits: 0, no error
    assert s.metrics["reward/timeouts"] == 1 + 2  # the regex call; the power's hostile group (2 completions)
    assert "its process was killed" in s.messages[0]


def test_a_child_process_brings_back_scores_errors_and_logs_and_has_a_memory_limit():
    def logs(completions, log_extra, log_metric, **kwargs):
        log_extra("length", [len(c) for c in completions])
        log_metric("calls", 1.0)
        return [len(c) / 10 for c in completions]

    def raises(completion, example):
        raise ValueError(f"no answer in {completion!r}")

    def hoards(completion, example):
        # A new mapping of 512 MiB, past the 128 MiB the child may add: refused (ENOMEM). (An allocation that
        # fits in free space of the heap the child inherited from this process needs no new mapping, so
        # a bytearray's outcome would depend on what earlier tests left free; docs/security.md says so.)
        with mmap.mmap(-1, 512 * 1024 * 1024) as m:
            return float(len(m))

    fn, batch = adapt(logs, {}, "rewards[0]")
    fns = [
        RewardFn("logs", 1.0, fn, batch=batch, user=True),
        RewardFn("raises", 1.0, raises, user=True),
        RewardFn("hoards", 1.0, hoards, user=True),
    ]
    s = score_completions(fns, ["ab", "abcd"], [EX, EX], timeout_s=30, process=True, memory_mb=128)
    assert s.per_fn["logs"] == [0.2, 0.4]
    assert s.extra == {"length": [2, 4]} and s.metrics["calls"] == 1.0
    assert s.per_fn["raises"] == [0.0, 0.0] and "raised ValueError: no answer in 'ab'" in s.first_errors["raises"]
    assert s.per_fn["hoards"] == [0.0, 0.0] and "Cannot allocate memory" in s.first_errors["hoards"]
    assert s.metrics["reward/errors"] == 4 and s.metrics["reward/timeouts"] == 0


def test_reward_process_runs_only_the_users_functions_in_children(tmp_path):
    """build_rewards marks a user's function (RewardFn.user) and not grpolab's verifiers, which bound their own
    time and stay in this process."""
    path = tmp_path / "mine.py"
    path.write_text("def mine(completion, example):\n    return 1.0\n")
    fns = build_rewards([{"name": "format"}, {"name": f"{path}:mine"}, {"name": "math"}])
    assert [f.user for f in fns] == [False, True, False]


def test_one_huge_reward_is_clipped_counted_and_leaves_the_update_finite():
    """-1e300 from a closeness reward on a 301-digit answer: in float32 it was -inf and voided the step."""

    def closeness(completion, example):
        return -abs(float(completion) - 1.0)

    s = score_completions([RewardFn("close", 1.0, closeness, user=True)], ["1e300", "1", "2", "0.5"], [EX] * 4)
    assert s.per_fn["close"] == [-MAX_SCORE, 0.0, -1.0, -0.5] and s.metrics["reward/clipped"] == 1
    raw = torch.tensor(s.total, dtype=torch.float32)
    for estimator in (adv_group_zscore, adv_group_mean):
        assert torch.isfinite(estimator(raw, 4, 1e-4)).all()
    assert torch.isinf(torch.tensor([-1e300], dtype=torch.float32)).all()  # what the step got before
