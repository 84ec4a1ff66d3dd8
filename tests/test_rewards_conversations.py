"""TRL-form reward functions in multi-turn runs and TRL's None: the whole conversation as messages
reaches the function, None means "does not apply" (left out, counted), and NaN, inf and wrong lengths
stay errors. Follows TRL 1.16's GRPOTrainer._calculate_rewards (None -> NaN, nansum over functions,
nanmean per function)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import Example, Rollout
from grpolab.rewards import REWARDS, RewardFn, as_factory, build_rewards, score_completions
from grpolab.training import step

MATH = Example(prompt="What is 2+2?", answer="4", meta={"task": "math"}, id="m")
CODE = Example(prompt="Write add(a, b).", answer="", meta={"task": "code"}, id="c")


def trl_rewards(monkeypatch, *specs) -> list[RewardFn]:
    """build_rewards for (function, weight) pairs, each registered as a TRL-form function."""
    out = []
    for fn, weight in specs:
        monkeypatch.setitem(REWARDS, fn.__name__, as_factory(fn))
        out.append({"name": fn.__name__, "weight": weight})
    return build_rewards(out)


# --- None: "this function does not apply to this sample" --------------------------------------------


def math_only(completions, task, answer, **kwargs):
    """A multi-task reward as TRL users write it: None for the samples of the other task."""
    return [None if t != "math" else float(c.strip().endswith(a)) for c, t, a in zip(completions, task, answer)]


def code_only(completions, task, **kwargs):
    return [None if t != "code" else float("def add" in c) for c, t in zip(completions, task)]


def test_none_for_half_the_samples_is_left_out_of_total_and_mean(monkeypatch):
    """4 completions: 2 math, 2 code. math_only (weight 2) applies to the math half, code_only
    (weight 0.5) to the code half, a per-sample length reward (weight 0.1) to every one.

        completion            math_only  code_only  short   total
        "so 4"   (math)       1.0        None       1.0     2*1.0 + 0.1*1.0   = 2.1
        "so 5"   (math)       0.0        None       1.0     2*0.0 + 0.1*1.0   = 0.1
        "def add" (code)      None       1.0        0.0     0.5*1.0 + 0.1*0.0 = 0.5
        "print"  (code)       None       0.0        1.0     0.5*0.0 + 0.1*1.0 = 0.1

    Means over the samples a function applies to: math_only (1 + 0) / 2 = 0.5 (not 1/4),
    code_only (1 + 0) / 2 = 0.5, short 3/4.
    """
    fns = trl_rewards(monkeypatch, (math_only, 2.0), (code_only, 0.5))
    fns.append(RewardFn("short", 0.1, lambda c, ex: float(len(c) < 6)))
    s = score_completions(fns, ["so 4", "so 5", "def add", "print"], [MATH, MATH, CODE, CODE])
    assert s.total == pytest.approx([2.1, 0.1, 0.5, 0.1])
    assert s.metrics["reward/math_only/mean"] == 0.5 and s.metrics["reward/code_only/mean"] == 0.5
    assert s.metrics["reward/short/mean"] == 0.75
    assert s.metrics["reward/math_only/none"] == 2 and s.metrics["reward/code_only/none"] == 2
    assert "reward/short/none" not in s.metrics  # grpolab's per-sample form has no None to count
    assert s.metrics["reward/none"] == 4
    assert s.metrics["reward/errors"] == 0 and not s.messages  # never an error, never a warning
    assert s.none == {"math_only": [2, 3], "code_only": [0, 1]}
    assert s.per_fn["math_only"] == [1.0, 0.0, 0.0, 0.0]  # a finite slot for whatever reads the scores


def test_none_is_not_an_error_under_exclude_either(monkeypatch):
    (rf,) = trl_rewards(monkeypatch, (math_only, 1.0))
    s = score_completions([rf], ["so 4", "x"], [MATH, CODE], on_error="exclude")
    assert s.total == [1.0, 0.0]  # not NaN: nothing was dropped
    assert s.metrics["reward/math_only/mean"] == 1.0 and s.metrics["reward/none"] == 1


def test_a_sample_no_function_applies_to_scores_zero(monkeypatch):
    """TRL marks such a row unscorable (NaN reward, zero advantage); grpolab scores it 0 (docs/rewards.md)."""
    fns = trl_rewards(monkeypatch, (math_only, 1.0), (code_only, 1.0))
    other = Example(prompt="Hi", answer="", meta={"task": "chat"}, id="o")
    s = score_completions(fns, ["so 4", "hello"], [MATH, other])
    assert s.total == [1.0, 0.0] and s.metrics["reward/none"] == 3
    assert s.metrics["reward/code_only/mean"] == 0.0  # applied to no sample: 0, counted in .../none


def test_all_none_and_a_none_that_is_not_a_list(monkeypatch):
    def never(completions, **kwargs):
        return [None] * len(completions)

    def forgot_return(completions, **kwargs):
        pass  # returns None, not a list of None: an error for the whole call

    fns = trl_rewards(monkeypatch, (never, 1.0), (forgot_return, 1.0))
    s = score_completions(fns, ["a", "b"], [MATH, MATH])
    assert s.per_fn["never"] == [0.0, 0.0] and s.metrics["reward/never/none"] == 2
    assert s.metrics["reward/forgot_return/none"] == 0 and s.metrics["reward/errors"] == 2
    assert "reward 'forgot_return' returned a NoneType, not a list of 2 scores" in s.messages[0]


# --- multi-turn: the conversation reaches TRL-form functions ----------------------------------------

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
CONVERSATIONS = [
    [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "name": "add", "content": "4"},
        {"role": "assistant", "content": "The answer is 4."},
    ],
    [
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "That is not right. Try again."},
        {"role": "assistant", "content": "The answer is 4."},
    ],
    [{"role": "assistant", "content": "The answer is 3."}],
]


def hand_rollout(conversations, G: int) -> Rollout:
    """A Rollout built by hand: N rows of 2 prompt and 4 completion tokens; texts = the last model turns."""
    N = len(conversations)
    return Rollout(
        prompt_ids=torch.ones(N, 2, dtype=torch.long),
        prompt_mask=torch.ones(N, 2, dtype=torch.long),
        completion_ids=torch.ones(N, 4, dtype=torch.long),
        completion_mask=torch.ones(N, 4),
        sample_logp=torch.zeros(N, 4),
        truncated=torch.zeros(N, dtype=torch.bool),
        texts=[c[-1]["content"] for c in conversations],
        G=G,
        env_mask=torch.zeros(N, 4),
        conversations=conversations,
    )


def run_like(fns: list[RewardFn]):
    """What step.score reads of a Run."""
    return SimpleNamespace(
        reward_fns=fns,
        trainer_state=None,
        cfg=SimpleNamespace(
            reward_timeout_s=10.0, reward_workers=2, reward_thread="workers", reward_process=False, reward_memory_mb=0
        ),
    )


def test_a_multi_turn_conversation_reaches_trl_form_functions(monkeypatch):
    seen = {}

    def used_tool(completions, prompts, answer, **kwargs):
        """TRL's tool-run form: each completion is its conversation as a list of messages."""
        seen["completions"], seen["prompts"], seen["answer"] = completions, prompts, answer
        return [float(any(m["role"] == "tool" for m in c)) for c in completions]

    def final_answer(completions, answer, **kwargs):
        return [float(c[-1]["content"].endswith(f"{a}.")) for c, a in zip(completions, answer)]

    def turns(completions, **kwargs):
        return [None if len(c) == 1 else 1.0 / sum(m["role"] == "assistant" for m in c) for c in completions]

    texts_seen = []

    def last_turn(completion, example):
        texts_seen.append(completion)
        return 0.0

    fns = trl_rewards(monkeypatch, (used_tool, 1.0), (final_answer, 1.0), (turns, 0.5))
    fns.append(RewardFn("last_turn", 1.0, last_turn))
    rollout = hand_rollout([list(map(dict, c)) for c in CONVERSATIONS], G=3)
    s = step.score(run_like(fns), rollout, [MATH])

    assert seen["completions"] == CONVERSATIONS  # tool and user messages included, in order
    assert seen["prompts"] == [[{"role": "user", "content": MATH.prompt}]] * 3  # conversational, as in TRL
    assert seen["answer"] == ["4"] * 3
    assert sorted(texts_seen) == ["The answer is 3.", "The answer is 4.", "The answer is 4."]  # per-sample: text
    #            used_tool  final_answer  turns (w 0.5)        total
    # row 0      1          1             1/2                 2.25
    # row 1      0          1             1/2                 1.25
    # row 2      0          0             None (one turn)     0.0
    assert s.per_fn["used_tool"] == [1.0, 0.0, 0.0] and s.per_fn["final_answer"] == [1.0, 1.0, 0.0]
    assert s.total == [2.25, 1.25, 0.0]
    assert s.metrics["reward/turns/mean"] == 0.5 and s.metrics["reward/turns/none"] == 1
    assert s.metrics["reward/used_tool/mean"] == pytest.approx(1 / 3)
    assert s.metrics["reward/errors"] == 0


def test_a_function_that_edits_its_messages_changes_nothing_else(monkeypatch):
    def vandal(completions, **kwargs):
        for c in completions:
            c.clear()
        return [0.0] * len(completions)

    def counts(completions, **kwargs):
        return [float(len(c)) for c in completions]

    fns = trl_rewards(monkeypatch, (vandal, 1.0), (counts, 1.0))
    conversations = [list(map(dict, c)) for c in CONVERSATIONS]
    s = step.score(run_like(fns), hand_rollout(conversations, G=3), [MATH])
    assert s.per_fn["counts"] == [3.0, 3.0, 1.0]
    assert conversations == CONVERSATIONS  # the rollout's conversations are left as they were


def test_single_turn_rollouts_still_give_texts(monkeypatch):
    seen = []

    def texts(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    fns = trl_rewards(monkeypatch, (texts, 1.0))
    rollout = hand_rollout(CONVERSATIONS, G=3)
    rollout.conversations = None
    assert step.score(run_like(fns), rollout, [MATH]).total == [1.0] * 3
    assert seen == ["The answer is 4.", "The answer is 4.", "The answer is 3."]


def test_conversations_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="2 conversations but 3 completions"):
        score_completions([], ["a", "b", "c"], [MATH] * 3, conversations=CONVERSATIONS[:2])


# --- what stays an error ---------------------------------------------------------------------------


def bad(completions, **kwargs):
    """One value per conversation, chosen by its last message."""
    table = {"The answer is 4.": math.nan, "The answer is 3.": math.inf}
    return [table[c[-1]["content"]] for c in completions]


def short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def words(completions, **kwargs):
    return ["1.0"] * len(completions)


@pytest.mark.parametrize(
    "fn,errors,message",
    [(bad, 3, "returned NaN"), (short, 3, "returned 2 scores for 3 completions"), (words, 3, "returned a str")],
)
def test_nan_inf_wrong_length_and_non_numbers_stay_errors_with_conversations(monkeypatch, fn, errors, message):
    (rf,) = trl_rewards(monkeypatch, (fn, 1.0))
    s = step.score(run_like([rf]), hand_rollout(CONVERSATIONS, G=3), [MATH])
    assert s.per_fn[fn.__name__] == [0.0, 0.0, 0.0] and s.total == [0.0, 0.0, 0.0]
    assert s.metrics["reward/errors"] == errors and s.metrics["reward/none"] == 0
    assert any(f"reward {fn.__name__!r} {message}" in m for m in s.messages)
    if fn is bad:
        assert any("reward 'bad' returned inf" in m for m in s.messages)


# --- the contract we follow is still TRL's -----------------------------------------------------------


def test_trl_none_rule_is_still_the_one_we_follow():
    """Guard: the installed TRL still turns None into NaN and sums the functions with nansum."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("trl is not installed")
    source = (Path(next(iter(spec.submodule_search_locations))) / "trainer" / "grpo_trainer.py").read_text()
    assert (
        "output_reward_func = [reward if reward is not None else torch.nan for reward in output_reward_func]" in source
    )
    assert "(rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)" in source
    assert "mean_rewards = torch.nanmean(rewards_per_func[:, i]).item()" in source
    assert "completions[idx_with_tool].append(tool_message)" in source  # tool messages are in the completion


# --- the examples of docs/rewards.md run as written --------------------------------------------------


def doc_function(name: str):
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if f"def {name}(" in b]
    ns: dict = {}
    exec(block, ns)
    return ns[name]


def test_docs_none_and_multi_turn_examples_run_as_written(monkeypatch):
    math_reward, used_a_tool = doc_function("math_reward"), doc_function("used_a_tool")
    fns = trl_rewards(monkeypatch, (math_reward, 1.0), (used_a_tool, 0.5))
    s = score_completions(fns[:1], ["so 4", "so 5", "def add", "print"], [MATH, MATH, CODE, CODE])
    assert s.total == [1.0, 0.0, 0.0, 0.0] and s.per_fn["math_reward"] == [1.0, 0.0, 0.0, 0.0]
    assert s.metrics["reward/math_reward/mean"] == 0.5 and s.metrics["reward/math_reward/none"] == 2
    s = step.score(run_like(fns[1:]), hand_rollout(CONVERSATIONS, G=3), [MATH])
    assert s.per_fn["used_a_tool"] == [1.0, 0.0, 0.0] and s.total == [0.5, 0.0, 0.0]
