"""TRL's reward contract: the keywords TRL 1.16's GRPOTrainer passes (completion_ids, trainer_state, log_extra,
log_metric, the columns), async functions awaited together, sync functions in the calling thread (signal.alarm
works there, as math-verify needs), keywords nothing provides refused before training, and the six reward
examples of TRL's GRPO documentation scoring what they score when TRL calls them."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import pytest

from grpolab.batch import Example
from grpolab.rewards import RewardFn, check_rewards, custom, score_completions
from grpolab.rewards.contract import is_async_callable, trainer_state
from grpolab.util.fields import ConfigError


def reward(fn, name=None, **options) -> RewardFn:
    wrapped, batch = custom.adapt(fn, options, "t")
    return RewardFn(name or fn.__name__, 1.0, wrapped, batch)


def trl_kwargs(prompts, completions, completion_ids, columns, state=None):
    """The keywords TRL's GRPOTrainer._calculate_rewards passes (trl/trainer/grpo_trainer.py, 1.16)."""
    return dict(
        prompts=prompts,
        completions=completions,
        completion_ids=completion_ids,
        **columns,
        trainer_state=state,
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    )


# ----------------------------------------------------------------------------------- TRL's documented examples


def example_1(completion_ids, **kwargs):
    """Example 1: longer completions, in tokens."""
    return [float(len(ids)) for ids in completion_ids]


def example_1_1(completions, **kwargs):
    """Example 1.1: longer completions, in characters."""
    return [float(len(completion)) for completion in completions]


def example_2(completions, **kwargs):
    """Example 2: the <think>...</think><answer>...</answer> format (conversational)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    return [1.0 if re.match(pattern, c[0]["content"]) else 0.0 for c in completions]


def example_3(completions, ground_truth, **kwargs):
    """Example 3: the \\boxed{} answer against the ground_truth column."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [m.group(1) if m else "" for m in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def example_4_math(prompts, completions, task, **kwargs):
    """Example 4: a math reward that returns None for the other task's rows."""
    return [
        (1.0 if completion.strip() == "4" else -1.0) if t == "math" else None
        for completion, t in zip(completions, task)
    ]


async def example_5(prompts, completions, **kwargs):
    """Example 5: an async reward (slow I/O simulated)."""
    await asyncio.sleep(0.01)
    return [1.0 if completion else 0.0 for completion in completions]


def test_trl_documented_examples_score_as_trl_calls_them():
    """Each example scored by grpolab (one call per group of completions sharing a prompt) gives what the
    function returns when called with TRL's keywords over the same completions."""
    sky = Example(prompt="The sky is", answer="", meta={"ground_truth": "2", "task": "math"}, id="a")
    sun = Example(prompt="The sun is", answer="", meta={"ground_truth": "5", "task": "code"}, id="b")
    comps = [r" The solution is \boxed{2}.", "4", r" The solution is \boxed{6}.", ""]
    ids = [[6303, 13], [19], [304, 279, 12884, 13], []]
    examples = [sky, sky, sun, sun]
    cols = {"answer": ["", "", "", ""], "ground_truth": ["2", "2", "5", "5"], "task": ["math", "math", "code", "code"]}
    fns = [reward(f) for f in (example_1, example_1_1, example_3, example_4_math, example_5)]
    s = score_completions(fns, comps, examples, context={"completion_ids": ids}, thread="auto")
    direct = {
        f.__name__: f(**trl_kwargs([e.prompt for e in examples], comps, ids, cols))
        for f in (example_1, example_1_1, example_3, example_4_math)
    }
    direct["example_5"] = asyncio.run(example_5(**trl_kwargs([e.prompt for e in examples], comps, ids, cols)))
    assert direct["example_1"] == [2.0, 1.0, 4.0, 0.0] and direct["example_3"] == [1.0, 0.0, 0.0, 0.0]
    assert direct["example_1_1"] == [27.0, 1.0, 27.0, 0.0] and direct["example_5"] == [1.0, 1.0, 1.0, 0.0]
    for name, values in direct.items():
        got = [None if j in s.none.get(name, ()) else v for j, v in enumerate(s.per_fn[name])]
        assert got == values, name
    assert direct["example_4_math"] == [-1.0, 1.0, None, None] and s.metrics["reward/example_4_math/mean"] == 0.0
    assert s.metrics["reward/errors"] == 0

    # Example 2 is conversational: the prompt is a message list, each completion one assistant message
    chat = Example(prompt=[{"role": "user", "content": "What is the result of (1 + 2) * 4?"}], answer="", id="c")
    texts = [
        "<think>The sum of 1 and 2 is 3, times 4 is 12.</think><answer>(1 + 2) * 4 = 12</answer>",
        "The sum of 3 and 1 is 4, times 2 is 8.",
    ]
    s2 = score_completions([reward(example_2)], texts, [chat, chat], thread="auto")
    assert s2.per_fn["example_2"] == example_2([[{"role": "assistant", "content": t}] for t in texts]) == [1.0, 0.0]


def test_trl_doc_typo_completions_ids_is_refused_before_training_with_the_right_name():
    """TRL's doc writes `completions_ids`; the trainer passes `completion_ids`: such a function would fail on
    every completion, so it is refused (ConfigError, exit 2) naming the keyword it asks for and the right one."""

    def typo(completions_ids, **kwargs):
        return [float(len(ids)) for ids in completions_ids]

    class OneRow:
        def sample(self, n, rng):
            return [Example(prompt="p", answer="a", meta={"ground_truth": "1"}, id="x")]

    with pytest.raises(ConfigError, match=r"requires 'completions_ids'.*Did you mean 'completion_ids'\?"):
        check_rewards([reward(typo)], OneRow(), environment=False)
    with pytest.raises(ConfigError, match=r"requires 'environments'.*only in a run with an environment"):
        check_rewards([reward(lambda environments, **kw: [1.0])], OneRow(), environment=False)
    with pytest.raises(ConfigError, match=r"requires 'solution'.*Add the column"):
        check_rewards([reward(lambda completions, solution, **kw: [1.0])], OneRow(), environment=False)
    # what the columns, the contract and the spec's options provide passes
    check_rewards(
        [
            reward(lambda completions, ground_truth, trainer_state, log_metric, **kw: [1.0]),
            reward(lambda completions, scale, **kw: [scale], name="opt", scale=2.0),
        ],
        OneRow(),
        environment=False,
    )


# ------------------------------------------------------------------------------------------- the contract


def test_completion_ids_trainer_state_log_extra_and_log_metric():
    """completion_ids: each call its group's slice; trainer_state: the object given; log_extra: one value per
    completion of the call, placed at its completions (whatever order the calls run in); log_metric: averaged."""
    seen = []

    def spy(completions, completion_ids, trainer_state, log_extra, log_metric, **kwargs):
        seen.append((list(completion_ids), trainer_state.global_step, trainer_state.max_steps))
        log_extra("n_ids", [len(i) for i in completion_ids])
        log_metric("my/len_mean", sum(len(c) for c in completions) / len(completions))
        return [1.0] * len(completions)

    a, b = (Example(prompt=p, answer="", id=p) for p in ("a", "b"))
    state = trainer_state(global_step=3, max_steps=10, epoch=0.5)
    s = score_completions(
        [reward(spy)],
        ["xx", "xxxx", "x", "x"],
        [a, a, b, b],
        context={"completion_ids": [[1, 2], [3], [4, 5, 6], []]},
        shared={"trainer_state": state},
        workers=2,
    )
    assert sorted(seen) == [([[1, 2], [3]], 3, 10), ([[4, 5, 6], []], 3, 10)]
    assert s.extra == {"n_ids": [2, 1, 3, 0]}
    assert s.metrics["my/len_mean"] == pytest.approx((3.0 + 1.0) / 2)  # the mean of the two calls' values
    assert type(state).__name__ == "TrainerState" and state.epoch == 0.5


def test_log_extra_with_the_wrong_number_of_values_fails_that_call():
    def bad(completions, log_extra, **kwargs):
        log_extra("col", [1])  # one value for two completions
        return [1.0] * len(completions)

    e = Example(prompt="p", answer="", id="p")
    s = score_completions([reward(bad)], ["a", "b"], [e, e])
    assert s.metrics["reward/errors"] == 2 and "1 values for the 2 completions" in s.first_errors["bad"]


def test_async_functions_are_awaited_together_and_bounded_by_the_timeout():
    """Two async functions over four groups (8 calls of 0.3 s) take about 0.3 s, not 2.4 s; one that
    sleeps past reward_timeout_s is a timeout. TRL's test for async (partial and callable objects) is used."""

    async def slow_a(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    class SlowB:
        async def __call__(self, completions, **kwargs):
            await asyncio.sleep(0.3)
            return [2.0] * len(completions)

    assert is_async_callable(SlowB()) and is_async_callable(slow_a)
    exs = [Example(prompt=str(i), answer="", id=str(i)) for i in range(4)]
    rows = [e for e in exs for _ in range(2)]
    b = reward(SlowB().__call__, name="slow_b")
    t0 = time.monotonic()
    s = score_completions([reward(slow_a), b], ["x"] * 8, rows, timeout_s=5.0, thread="auto")
    took = time.monotonic() - t0
    assert s.total == [3.0] * 8 and took < 1.5, took  # concurrent: well under 8 * 0.3 s

    async def never(completions, **kwargs):
        await asyncio.sleep(30)

    s = score_completions([reward(never)], ["x"], [exs[0]], timeout_s=0.2)
    assert s.metrics["reward/timeouts"] == 1 and s.total == [0.0]


def _alarm_reward(completions, **kwargs):
    """A reward bounding its own time with signal.alarm, as math-verify does: only the main thread may."""

    def late(signum, frame):
        raise TimeoutError("too slow")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(5)
    try:
        return [float(len(c)) for c in completions]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_sync_functions_run_in_the_calling_thread_by_default_so_signal_alarm_works():
    e = Example(prompt="p", answer="", id="p")
    assert threading.current_thread() is threading.main_thread()
    s = score_completions([reward(_alarm_reward)], ["ab", "abc"], [e, e], thread="auto")
    assert s.per_fn["_alarm_reward"] == [2.0, 3.0] and s.metrics["reward/errors"] == 0
    s = score_completions([reward(_alarm_reward)], ["ab", "abc"], [e, e], thread="workers")
    assert s.metrics["reward/errors"] == 2 and "main thread" in s.first_errors["_alarm_reward"]


def test_open_r1_accuracy_reward_with_math_verify_scores_in_the_calling_thread():
    """open-r1's accuracy_reward: math_verify.parse / verify, whose timeouts use signal.alarm."""
    math_verify = pytest.importorskip("math_verify")

    def accuracy_reward(completions, solution, **kwargs):
        out = []
        for completion, sol in zip(completions, solution):
            gold = math_verify.parse(sol, extraction_mode="first_match")
            answer = math_verify.parse(completion[0]["content"], extraction_mode="first_match")
            out.append(float(math_verify.verify(gold, answer)) if gold else None)
        return out

    e = Example(
        prompt=[{"role": "user", "content": "Half of 1?"}], answer="", meta={"solution": r"$\frac{1}{2}$"}, id="h"
    )
    texts = [r"The answer is $\boxed{0.5}$", r"The answer is $\boxed{3}$"]
    s = score_completions([reward(accuracy_reward)], texts, [e, e], thread="auto")
    assert s.per_fn["accuracy_reward"] == [1.0, 0.0] and s.metrics["reward/errors"] == 0
    s = score_completions([reward(accuracy_reward)], texts, [e, e], thread="workers")
    assert s.metrics["reward/errors"] == 2  # what every completion scored when rewards ran on worker threads


def test_auto_keeps_pool_functions_on_the_workers():
    """reward_thread=auto: a function with max_concurrency (the built-in math and code rewards) and grpolab's
    per-sample fn(completion, example) run on the worker threads, with their timeout; TRL-form functions in
    the calling thread, as TRL runs them."""
    where = {}

    def pooled(completion, example):
        where["pooled"] = threading.current_thread() is threading.main_thread()
        return 1.0

    pooled.max_concurrency = 2

    def plain(completion, example):
        where["plain"] = threading.current_thread() is threading.main_thread()
        return 1.0

    def trl_form(completions, examples):
        where["trl_form"] = threading.current_thread() is threading.main_thread()
        return [1.0 for _ in completions]

    e = Example(prompt="p", answer="", id="p")
    fns = [RewardFn("pooled", 1.0, pooled), RewardFn("plain", 1.0, plain), RewardFn("trl", 1.0, trl_form, batch=True)]
    score_completions(fns, ["x"], [e], thread="auto")
    assert where == {"pooled": False, "plain": False, "trl_form": True}
