"""TRL-style scripts, run side by side under real TRL 1.16 and under grpolab with only the import changed,
read the same data the same way; TRL's own trl/scripts/grpo.py and `grpolab train --trl` with `trl grpo`'s
script arguments reach training on local paths; a stream is read only as far as the run goes; a reward
failing on every completion stops a TRL-configured run at its first step.

The scripts here are our own, written as TRL's documentation writes them; TRL's grpo.py is read from the
installed package at test time (never kept in this repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from datasets import Dataset
IMPORT

seen = []


def reward_len(completions, prompts, topic, **kwargs):
    seen.append({"prompts": list(prompts), "topic": list(topic), "n": len(completions)})
    return [float(len(c)) for c in completions]


rows = [{"prompt": f"Tell me about {t}.", "topic": t} for t in ("cats", "dogs", "owls", "bees")]
args = GRPOConfig(
    output_dir=sys.argv[2], max_steps=2, per_device_train_batch_size=4, num_generations=4,
    max_completion_length=6, shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none",
    save_strategy="no", logging_steps=1,
)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=args, train_dataset=Dataset.from_list(rows))
out = trainer.train()
json.dump({"seen": seen, "global_step": out.global_step}, open(sys.argv[3], "w"))
"""


def _run(code: str, *args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def test_a_trl_script_reads_the_same_data_under_trl_and_grpolab(tiny_model_dir, tmp_path):
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    pytest.importorskip("datasets")
    results = {}
    for side, line in (
        ("trl", "from trl import GRPOConfig, GRPOTrainer"),
        ("grpolab", "from grpolab import GRPOConfig, GRPOTrainer"),
    ):
        out = tmp_path / side
        proc = _run(SCRIPT.replace("IMPORT", line), str(tiny_model_dir), str(out), str(tmp_path / f"{side}.json"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[side] = json.loads((tmp_path / f"{side}.json").read_text())
    trl, ours = results["trl"], results["grpolab"]
    assert ours["global_step"] == trl["global_step"] == 2
    # one call per step, the group's 4 completions, the prompts as raw text in the data's order (no chat
    # template, shuffle_dataset=False), every column as a keyword argument
    assert ours["seen"] == trl["seen"]
    assert trl["seen"][0] == {"prompts": ["Tell me about cats."] * 4, "topic": ["cats"] * 4, "n": 4}


def _zen_like(tmp_path: Path) -> Path:
    """A local dataset folder laid out as on the hub: two configs, train and test splits (parquet)."""
    import datasets

    root = tmp_path / "zen"
    card = ["---", "configs:"]
    for name, make in (
        ("standard", lambda i: f"Line {i} is"),
        ("chat", lambda i: [{"role": "user", "content": f"{i}?"}]),
    ):
        card += [f"- config_name: {name}", "  data_files:"]
        for split, ids in (("train", range(6)), ("test", range(6, 8))):
            path = root / name / f"{split}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_list([{"prompt": make(i)} for i in ids]).to_parquet(str(path))
            card += [f"  - split: {split}", f"    path: {name}/{split}.parquet"]
    (root / "README.md").write_text("\n".join([*card, "---", ""]))
    return root


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = "import sys; from grpolab.app.cli import main; sys.exit(main(sys.argv[1:]))"
    return _run(code, "train", *args, cwd=cwd)


def test_trl_grpo_script_arguments_on_the_command_line(tiny_model_dir, tmp_path):
    pytest.importorskip("datasets")
    data = _zen_like(tmp_path)
    (tmp_path / "my_rewards.py").write_text(
        "def length(completions, **kw):\n    return [len(c) / 10 for c in completions]\n"
    )
    out = tmp_path / "run"
    common = [f"model_name_or_path={tiny_model_dir}", f"dataset_name={data}", "dataset_config=standard"]
    proc = _cli(
        "--trl",
        *common,
        "reward_funcs=my_rewards.length",  # TRL's dotted import path, imported from the working directory
        "max_steps=2",
        "per_device_train_batch_size=4",
        "num_generations=4",
        "max_completion_length=6",
        "save_strategy=no",  # TRL's string "no", not YAML's False
        "model_revision=main",
        "attn_implementation=sdpa",
        "dtype=float32",
        f"output_dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "model_init_kwargs.revision='main': accepted" in proc.stdout
    import yaml

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["model"] == str(tiny_model_dir) and cfg["save_every"] == 0 and cfg["max_reward_error_steps"] == 1
    assert cfg["task_args"]["string_prompts"] == "raw" and cfg["task_args"]["answer_column"] is None
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
    assert len({s["step"] for s in steps}) == 2
    # a hub id is refused by name, exit 2, before anything loads
    proc = _cli("--trl", f"model_name_or_path={tiny_model_dir}", "dataset_name=trl-lib/tldr", cwd=tmp_path)
    assert proc.returncode == 2 and "dataset_name='trl-lib/tldr': no such local path" in proc.stderr
    proc = _cli("--trl", *common, "dataset_train_split=validation", cwd=tmp_path)
    assert proc.returncode == 2 and "dataset_train_split='validation'" in proc.stderr


def test_save_strategy_no_is_a_string_without_trl_too():
    from grpolab.app.cli import _trl_names

    args, _ = _trl_names(["save_strategy=no", "steps=3"])
    assert "save_every=0" in args  # was: save_strategy=False, refused


def test_a_stream_is_read_only_as_far_as_the_run_goes(tiny_model_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    import grpolab

    taken = []

    def rows():
        for i in range(100_000):  # far more than the run reads
            taken.append(i)
            yield {"prompt": f"Count {i}:"}

    stream = datasets.IterableDataset.from_generator(rows)
    seen = []

    def reward(completions, prompts, **kw):
        seen.extend(prompts)
        return [float(len(c)) for c in completions]

    grpolab.train(
        model=str(tiny_model_dir),
        train_dataset=stream,
        reward_funcs=[reward],
        max_steps=3,
        G=4,
        batch_size=8,
        max_new_tokens=4,
        out=str(tmp_path / "run"),
        save_every=0,
    )
    assert sorted(set(seen)) == [f"Count {i}:" for i in range(6)]  # 3 steps x 2 prompts
    kept = (tmp_path / "run" / "dataset.jsonl").read_text().splitlines()
    assert [json.loads(x)["prompt"] for x in kept] == [f"Count {i}:" for i in range(6)]  # the stream's order
    assert len(taken) < 1000  # the generator was not drained into memory


def test_a_stream_needs_max_steps():
    from grpolab.app.trl_compat.data import rows_of
    from grpolab.util.fields import ConfigError

    with pytest.raises(ConfigError, match="needs max_steps"):
        rows_of(iter([{"prompt": "x"}]), "train_dataset")


def test_a_reward_failing_everywhere_stops_a_trl_run_at_its_first_step(tiny_model_dir, tmp_path):
    pytest.importorskip("datasets")
    data = _zen_like(tmp_path)
    (tmp_path / "broken.py").write_text("def reward(completions, **kw):\n    raise KeyError('answer')\n")
    out = tmp_path / "run"
    proc = _cli(
        "--trl",
        f"model_name_or_path={tiny_model_dir}",
        f"dataset_name={data}",
        "dataset_config=standard",
        "reward_funcs=broken.reward",
        "max_steps=4",
        "per_device_train_batch_size=4",
        "num_generations=4",
        "max_completion_length=4",
        f"output_dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "KeyError" in proc.stdout + proc.stderr
    steps = {json.loads(x).get("step") for x in (out / "metrics.jsonl").read_text().splitlines()}
    assert max(s for s in steps if s is not None) == 1  # TRL raises at once; grpolab stops after step 1


def test_trls_own_grpo_script_with_the_import_changed(tiny_model_dir, tmp_path):
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    pytest.importorskip("datasets")
    source = (Path(trl.__file__).parent / "scripts" / "grpo.py").read_text()
    changed = source.replace(
        "from trl import GRPOTrainer, get_dataset", "from grpolab import GRPOTrainer\n    from trl import get_dataset"
    ).replace(
        "from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser",
        "from trl import DatasetMixtureConfig, ModelConfig, TrlParser\n    from grpolab import GRPOConfig",
    )
    assert changed.count("from grpolab import") == 2, "trl/scripts/grpo.py's imports changed; update the test"
    (tmp_path / "grpo.py").write_text(changed)
    (tmp_path / "my_rewards.py").write_text(
        "def length(completions, **kw):\n    return [len(c) / 10 for c in completions]\n"
    )
    data = _zen_like(tmp_path)
    out = tmp_path / "out"
    argv = [
        f"--model_name_or_path={tiny_model_dir}",
        f"--dataset_name={data}",
        "--dataset_config=standard",
        "--reward_funcs=my_rewards.length",
        "--max_steps=2",
        "--per_device_train_batch_size=4",
        "--num_generations=4",
        "--max_completion_length=6",
        f"--output_dir={out}",
        "--report_to=none",
    ]
    code = "import runpy, sys; sys.argv = ['grpo.py', *sys.argv[1:]]; runpy.run_path('grpo.py', run_name='__main__')"
    proc = _run(code, *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Training completed" in proc.stdout
    assert (out / "config.json").exists()  # trainer.save_model(output_dir): a Hugging Face model directory


def test_the_suite_harness_counts_and_leaves_out_only_what_it_names(tmp_path):
    from e2e_helpers import benchmark_script

    suite = benchmark_script("trl_suite")
    assert suite.private_reason("TestGetHighEntropyMask::test_compute_entropy_mask_0")
    assert suite.private_reason("TestGRPOTrainer::test_get_off_policy_mask_padding")
    assert suite.private_reason("TestGRPOTrainer::test_train_with_mask_truncated_completions")
    assert suite.private_reason("TestGRPOTrainer::test_train_with_mask_truncated_completions_all_masked") is None
    assert suite.private_reason("TestGRPOTrainer::test_train[trl-internal-testing/tiny-Qwen2ForCausalLM-2.5]") is None
    records = tmp_path / "records"
    records.mkdir()
    rows = {
        "trl": [("A::test_x", "passed"), ("TestGetHighEntropyMask::test_y", "passed"), ("A::test_z", "failed")],
        "grpolab": [("A::test_x", "failed"), ("A::test_x", "passed"), ("TestGetHighEntropyMask::test_y", "failed")],
    }
    for side, outcomes in rows.items():
        (records / f"{side}.jsonl").write_text(
            "".join(
                json.dumps({"test": t, "outcome": o, "error": "E: boom" if o != "passed" else ""}) + "\n"
                for t, o in outcomes
            )
        )
    totals = suite.table(tmp_path)["totals"]  # a rerun's record replaces the earlier one (A::test_x passes)
    assert totals == {
        "tests": 3,
        "trl_passed": 2,
        "grpolab_passed": 1,
        "private_left_out": 1,
        "public_trl_passed": 1,
        "public_grpolab_passed": 1,
        "grpolab_passed_where_trl_did_not": 0,
    }


def test_the_zen_stand_in_has_trls_configs_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    from e2e_helpers import benchmark_script

    standins = benchmark_script("trl_standins")
    standins.write_zen(tmp_path / "zen")
    for config in ("standard_prompt_only", "conversational_prompt_only"):
        data = datasets.load_dataset(str(tmp_path / "zen"), config)
        assert (len(data["train"]), len(data["test"])) == (17, 2)
    assert standins.zen()[0] == "Beautiful is better than ugly."


def test_evaluation_sets_as_trl_takes_them():
    datasets = pytest.importorskip("datasets")
    from grpolab.app.trl_compat.data import eval_sets, rows_of
    from grpolab.util.fields import ConfigError

    rows = [{"prompt": "a"}, {"prompt": "b"}]
    stream = datasets.Dataset.from_list(rows).to_iterable_dataset()
    assert rows_of(stream, "eval_dataset") == rows  # an evaluation stream is read once, to its end
    assert eval_sets({"one": datasets.Dataset.from_list(rows), "two": stream}) == {"one": rows, "two": rows}
    with pytest.raises(ConfigError, match=r"a dict of datasets \(test\); give one split"):
        rows_of(datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}), "train_dataset")
