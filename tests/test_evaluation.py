"""Evaluation during a run and `grpolab eval`, end to end on the tiny random model: eval/ rows at
steps 0, N, 2N and the last step with intervals that hold their estimates, the paired before/after
change in summary.json, the best model kept by an eval metric, the stop at a threshold, the report's
curves, and the command line on one model or two paired; the answer extraction report of the math and
countdown verifiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl, varied_score

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.batch import Example
from grpolab.rewards import build_rewards

SMALL = ["batch_size=8", "G=4", "max_new_tokens=8", "micro_batch=4", "eval_size=4", "progress=false", "eval_batch=8"]
VARIED = "rewards=[{name: test_varied}]"


def make_found():
    """test_varied's score, with an answer found in every completion (none is "no parsable answer")."""

    def found(completion, example):
        return varied_score(completion, example)

    found.answer_found = lambda completion, example: True
    return found


def make_never():
    """Scores 0 and never finds an answer: every completion is "no parsable answer"."""

    def never(completion, example):
        return 0.0

    never.answer_found = lambda completion, example: False
    return never


@pytest.fixture(scope="module", autouse=True)
def test_rewards():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        mp.setitem(rewards_mod.REWARDS, "test_found", make_found)
        mp.setitem(rewards_mod.REWARDS, "test_never", make_never)
        yield


def train(model: Path, out: Path, *args: str) -> Path:
    assert main(["train", f"model={model}", f"out={out}", *SMALL, *args]) == 0
    return out


@pytest.fixture(scope="module")
def eval_run(tiny_model_dir, tmp_path_factory) -> Path:
    """5 steps evaluated every 2 (and at 0 and 5), 4 samples per prompt, the best pass@2 kept."""
    return train(
        tiny_model_dir,
        tmp_path_factory.mktemp("evaluation") / "run",
        "steps=5",
        "eval_steps=2",
        "eval_num_generations=4",
        "save_best=eval/pass@2",
        "save_every=0",
        "rewards=[{name: test_found}, {name: test_never, weight: 0.5}]",
    )


def test_eval_rows_at_0_n_2n_and_the_end(eval_run):
    rows = read_jsonl(eval_run / "metrics.jsonl")
    assert [m["step"] for m in rows] == [0, 1, 2, 3, 4, 5]
    evaluated = [m["step"] for m in rows if "eval/accuracy" in m]
    assert evaluated == [0, 2, 4, 5]
    assert set(rows[0]) - {"step"} == {k for k in rows[0] if k.startswith("eval/")}  # step 0: the evaluation only
    for m in rows:
        if "eval/accuracy" not in m:
            continue
        assert m["eval/prompts"] == 4 and m["eval/samples_per_prompt"] == 4
        for key in ("eval/accuracy", "eval/pass@1", "eval/pass@2", "eval/pass@4"):
            assert m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"], (m["step"], key)
        # pass@k rises with k; pass@1 with 4 samples is the mean of 16 0/1 outcomes
        assert m["eval/pass@1"] <= m["eval/pass@2"] <= m["eval/pass@4"]
        assert (m["eval/pass@1"] * 16).is_integer()
        # extraction: test_found always finds an answer, so its failures are all "wrong"; right = pass@1
        assert m["eval/extract/test_found/no_answer"] == 0
        assert m["eval/extract/test_found/right"] == pytest.approx(m["eval/pass@1"])
        assert m["eval/extract/test_found/wrong"] == pytest.approx(1 - m["eval/pass@1"])
        assert m["eval/extract/test_never/no_answer"] == 1


def test_summary_holds_the_paired_change(eval_run):
    s = json.loads((eval_run / "summary.json").read_text())
    assert s["steps"] == 5  # the row of step 0 is not a step
    rows = {m["step"]: m for m in read_jsonl(eval_run / "metrics.jsonl")}
    before, after = s["eval_before"], s["eval_after"]
    assert before["accuracy"] == rows[0]["eval/accuracy"] and after["accuracy"] == rows[5]["eval/accuracy"]
    assert after["pass@k"]["2"]["estimate"] == rows[5]["eval/pass@2"]
    assert after["samples_per_prompt"] == 4 and after["temperature"] == 1.0
    assert before["per_prompt"]["id"] == after["per_prompt"]["id"]
    change = s["eval_change"]
    for key in ("accuracy", "pass@1", "pass@2", "pass@4"):
        c = change[key]
        assert c["change"] == pytest.approx(c["after"] - c["before"])
        assert c["ci"][0] <= c["change"] <= c["ci"][1] and c["prompts"] == 4
        assert ("beyond noise" in c["sentence"]) == c["beyond_noise"]
    assert change["pass@2"]["before"] == pytest.approx(before["pass@k"]["2"]["estimate"])


def test_the_best_model_is_kept(eval_run, capsys):
    rows = [m for m in read_jsonl(eval_run / "metrics.jsonl") if "eval/pass@2" in m]
    best = json.loads((eval_run / "checkpoints" / "best" / "best.json").read_text())
    first_max = max(rows, key=lambda m: (m["eval/pass@2"], -m["step"]))
    assert best == {"step": first_max["step"], "metric": "eval/pass@2", "value": first_max["eval/pass@2"]}
    assert json.loads((eval_run / "summary.json").read_text())["best"]["step"] == best["step"]
    assert (eval_run / "checkpoints" / "step-000005").is_dir()  # the step checkpoints are kept as before
    # the best model loads and evaluates: `grpolab eval` of it gives the value it was kept for
    capsys.readouterr()
    assert main(["eval", str(eval_run / "checkpoints" / "best")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["pass@k"]["2"]["estimate"] == pytest.approx(best["value"])


def test_report_plots_the_eval_curve(eval_run):
    html = (eval_run / "report.html").read_text()
    assert 'id="plot-eval_curve"' in html and "Held-out evaluation" in html
    assert (eval_run / "report_plots" / "eval_curve.png").is_file()
    assert "finished: 5 steps" in html
    assert "no parsable answer" in html and "change, points (paired)" in html


def test_stop_at_a_threshold(tiny_model_dir, tmp_path):
    """eval_stop_at=0: the first evaluation after a step reaches it; the run stops there with a checkpoint
    and a summary that says why."""
    out = train(
        tiny_model_dir,
        tmp_path / "run",
        "steps=4",
        "eval_steps=1",
        "eval_stop_at=0.0",
        "save_every=0",
        "report=false",
        VARIED,
    )
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1]
    s = json.loads((out / "summary.json").read_text())
    assert s["stopped_early"]["step"] == 1 and "eval_stop_at=0" in s["stopped_early"]["reason"]
    assert s["steps"] == 1 and s["eval_after"]["accuracy"] == read_jsonl(out / "metrics.jsonl")[1]["eval/accuracy"]
    assert (out / "checkpoints" / "step-000001").is_dir()


def test_eval_cli_one_model_and_two_paired(tiny_model_dir, capsys):
    args = [f"model={tiny_model_dir}", "eval_size=4", "max_new_tokens=8", VARIED]
    capsys.readouterr()
    assert main(["eval", str(tiny_model_dir), "--num-generations", "4", "--k", "1,4", *args[1:]]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert sorted(res["pass@k"]) == ["1", "4"] and res["samples_per_prompt"] == 4 and res["n"] == 4
    assert "pass@4" in out.err and "[" in out.err  # the table with intervals goes to stderr
    # the same model twice, paired on the same prompts and the same random stream: no change at all
    assert main(["eval", str(tiny_model_dir), str(tiny_model_dir), "--num-generations", "4", *args[1:]]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["a"]["pass@k"] == both["b"]["pass@k"] == res["pass@k"] | {"2": both["a"]["pass@k"]["2"]}
    for c in both["change"].values():
        assert c["change"] == 0 and c["ci"] == [0.0, 0.0] and not c["beyond_noise"]
        assert "within noise" in c["sentence"]


def test_eval_cli_usage_errors(tiny_model_dir, capsys):
    assert main(["eval", str(tiny_model_dir), "--num-generations", "4", "--k", "1,8"]) == 2
    assert "k=8" in capsys.readouterr().err
    assert main(["eval", "a", "b", "c"]) == 2
    assert main(["eval", str(tiny_model_dir), "--k", "one"]) == 2
    assert main(["eval", str(tiny_model_dir), "save_best=eval/pass@4"]) == 2
    assert "eval_num_generations" in capsys.readouterr().err


def test_math_and_countdown_say_whether_an_answer_was_found():
    ex = Example("What is 70 + 1?", "71", {"numbers": [1, 2, 3], "target": 9})
    last, tagged, countdown = build_rewards(
        [{"name": "math", "extract": "last_number"}, {"name": "math", "label": "m2"}, {"name": "countdown"}]
    )
    assert last.fn.answer_found("so it is 70", ex) and last.fn("so it is 70", ex) == 0  # wrong, not unparsed
    assert not last.fn.answer_found("no idea", ex)
    assert tagged.fn.answer_found("<answer>71</answer>", ex) and not tagged.fn.answer_found("it is 71", ex)
    assert countdown.fn.answer_found("(1 + 2) * 3", ex) and countdown.fn("(1 + 2) * 3", ex) == 1
    assert countdown.fn.answer_found("1 + 2 + 3", ex) and countdown.fn("1 + 2 + 3", ex) == 0  # wrong
    assert not countdown.fn.answer_found("I cannot do this one", ex)


def test_accuracy_is_the_per_prompt_mean_its_interval_is_about(tiny_model_dir, tmp_path):
    """A TRL-form main reward that returns None for some completions (and for every completion of one
    prompt): the accuracy is the mean of the per-prompt scores over the prompts with a scored completion,
    that prompt's score is null, and the accuracy lies inside its interval."""
    fn = tmp_path / "skipping.py"
    fn.write_text(
        "calls = []\n"
        "def skipping(completions, **kwargs):\n"  # called once per held-out prompt: its 4 completions
        "    calls.append(1)\n"
        "    if len(calls) == 1:\n"
        "        return [None] * len(completions)\n"
        "    texts = [c if isinstance(c, str) else c[-1]['content'] for c in completions]\n"
        "    return [None] + [float(len(t) % 2) for t in texts[1:]]\n"
    )
    out = train(
        tiny_model_dir,
        tmp_path / "run",
        "steps=1",
        "eval_num_generations=4",
        "eval_batch=16",
        "reward_thread=main",
        f"rewards=[{{name: '{fn}:skipping'}}]",
    )
    before = json.loads((out / "summary.json").read_text())["eval_before"]
    scores = before["per_prompt"]["score"]
    assert scores[0] is None  # the first prompt's four completions were all skipped
    scored = [s for s in scores if s is not None]
    assert len(scored) == 3
    assert before["accuracy"] == pytest.approx(sum(scored) / 3)
    lo, hi = before["accuracy_ci"]
    assert lo <= before["accuracy"] <= hi


def test_an_evaluation_with_no_scored_completion_prints_without_an_accuracy():
    """accuracy None (the main reward skipped every completion): the console summary and `grpolab eval`'s
    table say so instead of formatting a number."""
    from grpolab.app.evaluation import format_result
    from grpolab.training.progress import _pct

    res = {"accuracy": None, "accuracy_ci": None, "accuracy_ci_method": None, "n": 4, "main_reward": "r"}
    res |= {"temperature": 0.0, "samples_per_prompt": 1, "pass@k": {}, "extraction": {}}
    assert _pct(res) == "–"
    assert "the main reward scored no completion" in format_result("model", res)
