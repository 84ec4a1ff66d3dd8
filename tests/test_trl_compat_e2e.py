"""A TRL user's script, with only the import changed, runs on grpolab: a map-style training set trained on
for one epoch (max_steps=-1), an eval_dataset evaluated and never trained on, extra columns reaching the
reward function, TRL's defaults in config.yaml (the linear learning-rate decay among them), a transformers
TrainerCallback called at every step, and save_model writing a Hugging Face model directory."""

from __future__ import annotations

import json

import pytest
import yaml


def test_trl_script_with_the_import_changed(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    from grpolab import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

    class Prompts(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):  # never raises IndexError: read by its length
            return {"prompt": f"Count to {i + 2}:", "n": i + 2}

    seen = []

    def counts(completions, prompts, n, **kwargs):
        seen.extend(prompts)
        return [float(str(k) in c) + len(c) / 100 for c, k in zip(completions, n)]

    class StepLog(TrainerCallback):
        steps: list = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

    out = tmp_path / "run"
    args = GRPOConfig(
        output_dir=str(out),
        num_train_epochs=1,
        max_completion_length=8,
        num_generations=4,
        per_device_train_batch_size=8,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=counts,
        args=args,
        train_dataset=Prompts(),
        eval_dataset=[{"prompt": "Count to 9:", "n": 9}],
        callbacks=[StepLog()],
    )
    result = trainer.train()
    assert result.global_step == 2  # ceil(1 epoch x 4 rows / 2 prompts per step)
    assert StepLog.steps == [1, 2]
    trained = [p for p in seen if p != "Count to 9:"]
    assert sorted(set(trained)) == [f"Count to {k}:" for k in range(2, 6)]  # every row, G times
    assert sorted(trained) == sorted(f"Count to {k}:" for k in range(2, 6) for _ in range(4))
    assert trainer.summary["eval_before"]["n"] == 1 and trainer.summary["eval_after"]["n"] == 1  # grpolab's summary
    first = ["train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"]
    assert list(result.metrics)[:4] == first and list(result.metrics)[-1] == "epoch"  # TRL's TrainOutput.metrics
    from grpolab.training.trl_names import grpolab_name

    # then, as TRL's GRPOTrainer.log merges them into that row, the means of the updates since the last logging step
    rest = [
        k
        for k in list(result.metrics)[4:-1]
        if not (grpolab_name(k) or k in ("num_tokens", "policy_loss", "entropy_coef"))
    ]
    assert not rest, rest
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (cfg["lr"], cfg["seed"], cfg["adam_betas"], cfg["warmup_steps"], cfg["algo"]["beta"]) == (
        1e-6,
        42,
        [0.9, 0.999],
        0,
        0.0,
    )
    assert (cfg["algo"]["aggregation"], cfg["algo"]["advantage"], cfg["steps"]) == (
        "token_mean",
        "group_zscore_unbiased",
        2,
    )
    assert (cfg["lr_scheduler"], cfg["eval_num_generations"]) == ("linear", 4)  # eval: num_generations samples
    lrs = [json.loads(line)["lr"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([1e-6, 0.5e-6], abs=1e-15)  # linear over 2 updates: the lr each update used
    assert cfg["task_args"]["string_prompts"] == "raw" and cfg["task_args"]["answer_column"] is None
    trainer.save_model(str(tmp_path / "final"))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    assert model.config.num_hidden_layers == 2
