"""End to end: the real `grpolab train` / `grpolab eval` entry point (grpolab.app.cli.main, in-process) on the
tiny random model, checking what a run leaves on disk and that it really trains.

A tiny random model never answers a math question, so every group has zero reward variance and GRPO
has nothing to learn from. The tests therefore register extra reward functions in
grpolab.rewards.REWARDS (factories, as the registry allows) and select them with
`rewards=[{name: ...}]`:

    test_varied      (sum of character codes mod 5) / 4: deterministic, varies within groups
    test_faulty      by call count: raises, hangs past reward_timeout_s, or returns 1
    test_code_oracle answers with the task's reference solution or a wrong one (by the completion's
                     parity) and scores it with the real `code` reward, i.e. in the sandbox

Runs are shared through module fixtures (each tiny run takes a few seconds on 2 cores).
"""

from __future__ import annotations

import json
import math
import shutil
import threading
from pathlib import Path

import pytest
import torch
import yaml
from e2e_helpers import changed, read_jsonl, varied_score, weights

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main

SMALL = ["batch_size=8", "G=4", "max_new_tokens=8", "micro_batch=4", "eval_size=4", "progress=false"]
VARIED = "rewards=[{name: test_varied}]"
REQUIRED_METRICS = [
    "step",
    "reward/mean",
    "reward/std",
    "completion/length_mean",
    "kl",
    "clip/frac",
    "groups/zero_std_frac",
    "entropy",
    "time/step_s",
    "time/generate_s",
    "time/score_s",
    "time/update_s",
]
NONDETERMINISTIC = ("time/", "memory/")  # wall-clock and process-wide numbers


def make_varied():
    return varied_score


def make_faulty():
    """Call i (counted across the run, under a lock, so the counts do not depend on thread timing):
    i % 3 == 0 raises, i % 3 == 1 blocks past any timeout, else returns 1."""
    lock = threading.Lock()
    calls = [0]

    def faulty(completion: str, example) -> float:
        with lock:
            i = calls[0]
            calls[0] += 1
        if i % 3 == 0:
            raise RuntimeError("verifier crashed")
        if i % 3 == 1:
            STOP.wait(60)  # released at teardown, so no thread outlives the module for long
            return 1.0
        return 1.0

    return faulty


STOP = threading.Event()


def make_code_oracle():
    from grpolab.rewards.code import make_code

    real = make_code()

    def code_oracle(completion: str, example) -> float:
        good = sum(map(ord, completion)) % 2 == 0
        code = example.answer if good else "def nothing():\n    return None\n"
        return real(f"```python\n{code}\n```", example)

    code_oracle.max_concurrency = real.max_concurrency
    return code_oracle


@pytest.fixture(scope="module", autouse=True)
def test_rewards():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", make_varied)
        mp.setitem(rewards_mod.REWARDS, "test_faulty", make_faulty)
        mp.setitem(rewards_mod.REWARDS, "test_code_oracle", make_code_oracle)
        yield
    STOP.set()


def train(model: Path, out: Path, *args: str) -> Path:
    rc = main(["train", f"model={model}", f"out={out}", *SMALL, *args])
    assert rc == 0, f"grpolab train exited with {rc}"
    return out


def stable(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith(NONDETERMINISTIC)}


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The reference run: 2 steps with the varied reward, a checkpoint after each step."""
    return train(
        tiny_model_dir, tmp_path_factory.mktemp("e2e") / "run", "steps=2", "save_every=1", "keep_checkpoints=0", VARIED
    )


# -- what a run leaves ----------------------------------------------------------------------------


def test_metrics_jsonl(run_dir):
    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, f"metrics.jsonl lacks {missing}"
        for k in REQUIRED_METRICS:
            assert isinstance(m[k], (int, float)) and math.isfinite(m[k]), (k, m[k])
        assert m["reward/test_varied/mean"] == pytest.approx(m["reward/mean"])
        assert m["reward/errors"] == 0 and m["reward/timeouts"] == 0
        assert 0 < m["completion/length_mean"] <= 8
        assert m["time/step_s"] >= m["time/update_s"] > 0 and m["time/generate_s"] > 0


def test_samples_jsonl(run_dir):
    recs = read_jsonl(run_dir / "samples.jsonl")
    assert len(recs) == 2 * 4 and {r["step"] for r in recs} == {1, 2}  # samples_per_step=4
    for r in recs:
        assert r["prompt"] and isinstance(r["completion"], str)
        assert set(r["rewards"]) == {"test_varied"}
        assert r["rewards"]["test_varied"] == varied_score(r["completion"], None)
        assert r["reward"] == pytest.approx(r["rewards"]["test_varied"])
        assert r["reward_shaped"] == r["reward"]  # GRPO shapes nothing (its KL is in the loss)


def test_config_yaml_is_the_resolved_config(run_dir, tiny_model_dir):
    from grpolab.training.config import build_config, to_dict

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert to_dict(build_config(saved)) == saved  # reloadable as a recipe, unchanged by the round trip
    expected = build_config(
        {},
        [f"model={tiny_model_dir}", f"out={run_dir}", *SMALL, "steps=2", "save_every=1", "keep_checkpoints=0", VARIED],
    )
    assert saved == to_dict(expected)
    assert saved["rewards"] == [{"name": "test_varied"}] and saved["algo"]["name"] == "grpo"


def test_tensorboard_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert files
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert "groups/zero_std_frac" in acc.Tags()["scalars"]


def test_checkpoint_is_a_hugging_face_model(run_dir, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    ck = run_dir / "checkpoints" / "step-000002"
    assert (ck / "config.json").is_file() and (ck / "model.safetensors").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000002"
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["step"] == 2
    assert (ck / "optimizer.pt").is_file() and (ck / "scheduler.pt").is_file()
    model = AutoModelForCausalLM.from_pretrained(ck)
    saved = weights(ck)
    for name, p in model.state_dict().items():
        if name in saved:
            assert torch.equal(p, saved[name]), name
    # the tokenizer travels with the checkpoint, so the directory is usable on its own
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(ck).chat_template


def test_summary_json(run_dir, tiny_model_dir, capsys):
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steps"] == 2
    assert s["files"]["report.html"] == str(run_dir / "report.html") and (run_dir / "report.html").is_file()
    # the evaluation before training is the untrained model's: `grpolab eval` of that model agrees
    capsys.readouterr()
    assert main(["eval", f"model={tiny_model_dir}", "eval_size=4", "max_new_tokens=8", VARIED]) == 0
    assert s["eval_before"] == json.loads(capsys.readouterr().out)
    for key in ("eval_before", "eval_after"):
        ev = s[key]
        assert ev["n"] == 4 and ev["main_reward"] == "test_varied"
        # one reward of weight 1 scoring k/4: the accuracy is a mean of 4 such scores, and the reward
        assert (ev["accuracy"] * 16).is_integer() and ev["reward"] == pytest.approx(ev["accuracy"])
        assert 1 <= ev["length"] <= 8  # greedy completions within max_new_tokens
    lines = read_jsonl(run_dir / "metrics.jsonl")  # fewer than 5 steps: first and last blocks are all steps
    assert s["reward_first"] == pytest.approx(sum(m["reward/mean"] for m in lines) / 2) == s["reward_last"]
    assert s["length_first"] == pytest.approx(sum(m["completion/length_mean"] for m in lines) / 2)


# -- it learns ------------------------------------------------------------------------------------


def test_varied_reward_updates_the_policy(run_dir, tiny_model_dir):
    lines = read_jsonl(run_dir / "metrics.jsonl")
    for m in lines:
        assert m["update/seqs_computed"] > 0 and m["update/skipped"] == 0
        assert m["groups/zero_std_frac"] < 1
        assert m["reward/std"] > 0 and m["adv/abs_mean"] > 0 and m["grad_norm"] > 0
    init = weights(tiny_model_dir)
    step1 = weights(run_dir / "checkpoints" / "step-000001")
    step2 = weights(run_dir / "checkpoints" / "step-000002")
    assert changed(init, step1), "one step left every weight unchanged"
    assert changed(step1, step2), "the second step left every weight unchanged"


def test_zero_variance_rewards_skip_the_policy_gradient(tiny_model_dir, tmp_path):
    """The default math reward on a random model: every group is all-zero, nothing to learn. Without
    a KL term (beta=0) the trainer computes no sequence at all, and the weights stay as they were."""
    out = train(tiny_model_dir, tmp_path / "run", "steps=1", "eval_size=0", "algo.beta=0")
    (m,) = read_jsonl(out / "metrics.jsonl")
    assert m["groups/zero_std_frac"] == 1 and m["reward/mean"] == 0 and "reward/math/mean" in m
    assert m["update/seqs_computed"] == 0 and m["update/skipped"] == 1
    assert not changed(weights(tiny_model_dir), weights(out / "checkpoints" / "step-000001"))


# -- resume ---------------------------------------------------------------------------------------


def test_resume_continues_exactly(run_dir, tiny_model_dir, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    assert main(["train", "--resume", str(resumed), "steps=3"]) == 0
    lines = read_jsonl(resumed / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(resumed / "samples.jsonl")] == [1] * 4 + [2] * 4 + [3] * 4
    assert yaml.safe_load((resumed / "config.yaml").read_text())["steps"] == 3
    assert json.loads((resumed / "summary.json").read_text())["steps"] == 3

    straight = train(tiny_model_dir, tmp_path / "straight", "steps=3", "save_every=1", "keep_checkpoints=0", VARIED)
    ref = read_jsonl(straight / "metrics.jsonl")
    # the same prompts and samples at step 3 (per-step RNG from (seed, step)), the same weights after it
    assert lines[2]["reward/mean"] == ref[2]["reward/mean"]
    assert stable(lines[2]) == stable(ref[2])
    assert [r for r in read_jsonl(resumed / "samples.jsonl") if r["step"] == 3] == [
        r for r in read_jsonl(straight / "samples.jsonl") if r["step"] == 3
    ]
    ck = Path("checkpoints") / "step-000003"
    diff = changed(weights(resumed / ck), weights(straight / ck))
    assert not diff, f"after step 3 the resumed run's weights differ from the uninterrupted run's: {diff[:5]}"


def test_resume_of_a_finished_run_does_nothing(run_dir, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    assert main(["train", "--resume", str(again)]) == 0
    assert [m["step"] for m in read_jsonl(again / "metrics.jsonl")] == [1, 2]


# -- eval -----------------------------------------------------------------------------------------


def test_eval_prints_json_with_accuracy(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    res = json.loads(capsys.readouterr().out)  # stdout is exactly one JSON document
    assert 0 <= res["accuracy"] <= 1 and res["n"] == 4 and res["main_reward"] == "test_varied"
    # greedy on the final checkpoint: the same numbers as the run's own evaluation after training
    after = json.loads((run_dir / "summary.json").read_text())["eval_after"]
    assert res == after
    assert not (run_dir / "eval").exists() or not any((run_dir / "eval").iterdir())


# -- verifier failures ----------------------------------------------------------------------------


def test_reward_errors_and_timeouts_are_counted(tiny_model_dir, tmp_path):
    out = train(
        tiny_model_dir,
        tmp_path / "run",
        "steps=2",
        "eval_size=0",
        "rewards=[{name: test_faulty}]",
        "reward_timeout_s=1.0",
    )
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    # 16 calls numbered 0..15: i % 3 == 0 raises (0, 3, ..., 15: 6), i % 3 == 1 hangs (1, 4, ..., 13: 5)
    assert sum(m["reward/errors"] for m in lines) == 6
    assert sum(m["reward/timeouts"] for m in lines) == 5
    assert sum(m["reward/mean"] for m in lines) * 8 == pytest.approx(16 - 6 - 5)  # failures score 0
    assert (out / "checkpoints" / "step-000002").is_dir()


# -- tasks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["countdown", "code", "tools"])
def test_task_runs_two_steps(task, tiny_model_dir, tmp_path):
    out = train(tiny_model_dir, tmp_path / task, f"task={task}", "steps=2", "batch_size=4", "G=2", "eval_size=2")
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    default = {"countdown": ["format", "countdown"], "code": ["code"], "tools": ["tool_call"]}[task]
    for m in lines:
        assert all(f"reward/{name}/mean" in m for name in default)
        assert m["reward/errors"] == 0 and m["reward/timeouts"] == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["eval_after"]["n"] == 2
    assert (out / "checkpoints" / "step-000002" / "model.safetensors").is_file()


def test_code_task_rewards_through_the_sandbox(tiny_model_dir, tmp_path):
    """Completions become the reference solution or a wrong one; the sandbox grades them inside the run."""
    out = train(
        tiny_model_dir, tmp_path / "code", "task=code", "steps=2", "eval_size=0", "rewards=[{name: test_code_oracle}]"
    )
    lines = read_jsonl(out / "metrics.jsonl")
    for m in lines:
        assert m["reward/errors"] == 0 and m["reward/timeouts"] == 0
    for r in read_jsonl(out / "samples.jsonl"):
        want = 1.0 if sum(map(ord, r["completion"])) % 2 == 0 else 0.0
        assert r["rewards"]["test_code_oracle"] == want, r
    rewards = [m["reward/mean"] for m in lines]
    assert 0 < sum(rewards) / 2 < 1
    assert min(m["groups/zero_std_frac"] for m in lines) < 1


def test_qa_task_from_a_gsm8k_style_jsonl(tiny_model_dir, tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    rows = [
        {
            "question": f"Tom has {i} apples and buys {i * 3} more. How many apples does he have?",
            "answer": f"He has {i} + {i * 3} = {4 * i} apples.\n#### {4 * i:,}",
        }
        for i in range(100, 120)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = train(
        tiny_model_dir,
        tmp_path / "qa",
        "task=qa",
        f"task_args.path={data}",
        "task_args.eval_size=2",
        "steps=2",
        "batch_size=4",
        "G=2",
        "eval_size=2",
    )
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2] and all("reward/math/mean" in m for m in lines)
    answers = {str(4 * i) for i in range(100, 120)}  # "#### 1,200" -> "1200"
    questions = {r["question"] for r in rows}
    for r in read_jsonl(out / "samples.jsonl"):
        assert r["answer"] in answers and r["prompt"] in questions
    s = json.loads((out / "summary.json").read_text())
    assert s["eval_before"]["n"] == 2 and s["eval_before"]["main_reward"] == "math"
