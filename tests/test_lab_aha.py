"""grpolab lab aha: the longsum task and its answer-only verifier, the character-level tokenizer, and the
quick miniature (the direction of the result: length and reward rise together; not a timing)."""

import json
import random

from grpolab.rewards import build_rewards, score_completions
from grpolab.tasks import build_task
from grpolab.tasks.longsum import solution, style_of


def _score(task, texts, ex):
    fns = build_rewards(task.default_rewards)
    return score_completions(fns, texts, [ex] * len(texts), workers=1).total


def test_longsum_verifier_rewards_only_the_final_answer():
    task = build_task("longsum", 0)
    ex = task.eval_set()[0]
    terms = ex.meta["terms"]
    rng = random.Random(0)
    right_long = solution(terms, "steps", rng)
    wrong_long = right_long + "+1=" + str(sum(terms) + 1)  # longer, well-formed, wrong final number
    assert _score(task, [ex.answer, right_long, wrong_long, "", "wait wait wait"], ex) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert style_of(ex.answer) == "direct" and style_of(right_long) == "steps"
    fixed = solution(terms, "reflect", rng)
    assert style_of(fixed) == "reflect" and _score(task, [fixed], ex) == [1.0]
    assert ex.prompt == ex.meta["question"] + "=" and ex.answer == str(sum(terms))
    train_qs = {e.meta["question"] for e in task.sample(200, random.Random(1))}
    assert not train_qs & {e.meta["question"] for e in task.eval_set()}  # held out


def test_direct_guesses_are_right_about_a_third_of_the_time():
    rng = random.Random(0)
    hits = sum(solution([3, 5, 7, 2], "direct", rng) == "17" for _ in range(3000))
    assert 0.29 < hits / 3000 < 0.38


def test_char_tokenizer_saves_as_a_normal_hf_directory(tmp_path):
    from grpolab.app.lab import tinychar
    from grpolab.model.load import load_tokenizer
    from grpolab.model.template import chat_prompts

    tok = tinychar.char_tokenizer()
    model = tinychar.tiny_llama(tok, hidden=32, layers=1)
    tinychar.save(model, tok, tmp_path / "m")
    tok2 = load_tokenizer(tmp_path / "m")
    ids = chat_prompts(tok2, ["3+5="], None)[0]  # no chat template: the prompt text as it is
    assert len(ids) == 4 and tok2.decode(ids) == "3+5="
    assert (
        tok2.decode(tok2("8+7=15 wait 16")["input_ids"] + [tok2.eos_token_id], skip_special_tokens=True)
        == "8+7=15 wait 16"
    )


def test_quick_miniature_length_and_reward_rise_together(tmp_path):
    """`lab aha --quick`: 20 RL steps on the lab's own pre-trained model, after which length, reward and the
    step-by-step share have risen. The pre-training (1500 steps, the longest part of the suite where
    $GRPOLAB_CACHE/lab does not hold the model yet; cached after) is what the claim needs: after 500 steps
    the step-by-step skill is too weak for RL to select it, and the verdict is "does not hold"."""
    from grpolab.app.cli import main
    from grpolab.app.lab import last_result
    from grpolab.util.fileio import read_jsonl

    assert main(["lab", "aha", "--quick", "--out", str(tmp_path)]) == 0
    res = last_result
    first, last = res["arms"]["grpo"]["first"], res["arms"]["grpo"]["last"]
    assert last["length"] > first["length"] + 1.0
    assert last["reward"] > first["reward"]
    assert last["steps_share"] > first["steps_share"]
    assert res["verdict"].startswith("holds here")
    saved = json.loads((tmp_path / "aha.json").read_text())
    assert saved["verdict"] == res["verdict"]
    assert (tmp_path / "aha.png").stat().st_size > 1000
    rec = read_jsonl(tmp_path / "grpo" / "metrics.jsonl")[0]  # the aha metrics of every run
    for k in (
        "aha/length_correct",
        "aha/length_incorrect",
        "aha/reflection_frac",
        "aha/length_reward_corr",
        "aha/length_reward_corr_rolling",
        "alert/count",
        "completion/truncated_frac",
    ):
        assert k in rec


def test_quick_critic_claim_on_the_miniature(tmp_path):
    from grpolab.app.lab import critic_claim

    res = critic_claim.run(["--quick", "--out", str(tmp_path)])
    assert res["grpo"]["params"] / res["ppo"]["params"] < 0.6  # the critic is a second set of weights
    assert res["ppo"]["adv_spread"] > 0  # GAE: advantages vary along a sequence
    assert res["grpo"]["adv_spread"] < 1e-9  # GRPO: one advantage for every token (float rounding only)
    assert res["verdict"].startswith("holds")


def test_quick_kl_claim_direction(tmp_path):
    from grpolab.app.lab import kl_claim

    assert "CC0" in json.loads(kl_claim.TEXT_FILE.read_text())["licence"]
    res = kl_claim.run(["--quick", "--out", str(tmp_path)])
    assert res["beta0"]["kl"] > res["beta"]["kl"]  # without the KL term the policy ends further from pi_ref
    assert res["beta0"]["text_logp_ref"] == res["beta"]["text_logp_ref"]  # the same reference
    assert res["verdict"].startswith(("holds here", "does not hold here"))


def test_bad_budgets_are_usage_errors():
    import pytest

    from grpolab.app.cli import main

    for argv in (
        ["lab", "aha", "--steps", "0"],
        ["lab", "aha", "--pretrain-steps", "0"],
        ["lab", "critic", "--steps", "0"],
        ["lab", "kl", "--steps", "-1"],
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
