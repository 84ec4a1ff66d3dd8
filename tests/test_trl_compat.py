"""`from grpolab import GRPOConfig, GRPOTrainer` means what TRL 1.16 means: TRL's field names and defaults,
one mapping table for every field (docs/migrating-from-trl.md generated from it), refusals by name, the same
names on the command line with no false-friend hints, `--help` printing the values a run uses, and TRL's
data semantics (epochs over every row, raw string prompts, no answer column, map-style datasets by length,
evaluation from eval_dataset only)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from grpolab import GRPOConfig
from grpolab.app.trl_compat import trl_overrides, trl_recipe
from grpolab.app.trl_compat.docs import render
from grpolab.app.trl_compat.entries import config_has
from grpolab.app.trl_compat.fields import TABLE
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_grpoconfig_has_trls_fields_order_and_defaults():
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    theirs = [f for f in dataclasses.fields(trl.GRPOConfig) if f.init]
    ours = dataclasses.fields(GRPOConfig)
    assert [f.name for f in ours] == [f.name for f in theirs]
    for f in theirs:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(GRPOConfig(), f.name) == getattr(default, "value", default), f.name


def test_trl_defaults_reach_the_grpolab_config():
    cfg = build_config(trl_recipe(GRPOConfig(output_dir="runs/x"))[0])
    assert (cfg.lr, cfg.algo.beta, cfg.algo.aggregation, cfg.adam_betas, cfg.max_new_tokens, cfg.seed, cfg.G) == (
        1e-6,
        0.0,
        "token_mean",
        [0.9, 0.999],
        512,
        42,
        8,
    )
    assert (cfg.batch_size, cfg.micro_batch, cfg.steps, cfg.num_train_epochs, cfg.warmup_steps) == (8, 8, -1, 3.0, 0)
    assert (cfg.algo.advantage, cfg.algo.objective, cfg.algo.eps_low, cfg.algo.eps_high) == (
        "group_zscore_unbiased",
        "clipped",
        0.2,
        0.2,
    )
    assert cfg.out == "runs/x" and cfg.grad_checkpointing and cfg.report_to == [] and cfg.rollout.engine == "native"
    assert (cfg.lr_scheduler, cfg.warmup_ratio, cfg.algo.steps_per_generation) == ("linear", 0.0, 1)
    assert (cfg.eval_num_generations, cfg.eval_temperature, cfg.project, cfg.run_name) == (8, 1.0, "huggingface", "")
    assert (cfg.top_k, cfg.min_p, cfg.repetition_penalty, cfg.generation_kwargs) == (0, 0.0, 1.0, {})
    assert (cfg.algo.entropy_coef, cfg.algo.sync_ref_model, cfg.algo.mask_truncated_completions) == (0.0, False, False)


def test_a_real_trl_config_maps_like_grpolabs():
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    kw = dict(
        output_dir="runs/y",
        bf16=False,
        use_cpu=True,
        loss_type="grpo",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        learning_rate=3e-6,
        save_steps=7,
    )
    theirs, ours = trl_recipe(trl.GRPOConfig(**kw)), trl_recipe(GRPOConfig(**kw))
    assert theirs == ours
    assert (ours[0]["batch_size"], ours[0]["micro_batch"], ours[0]["save_every"]) == (8, 4, 7)


def test_every_field_has_one_entry_and_a_reason_where_it_is_not_mapped():
    assert len(TABLE) == 189
    for e in TABLE.values():
        assert e.kind in ("map", "refuse", "ignore"), e.name
        if e.kind != "map":
            assert len(e.reason) > 15, e.name
        else:
            assert e.convert is not None and e.target, e.name


def test_every_mapped_path_is_a_grpolab_setting():
    values = {name: e.default for name, e in TABLE.items()}
    values.update(
        eval_strategy="steps",
        save_strategy="best",
        metric_for_best_model="reward",
        warmup_steps=0.1,
        steps_per_generation=2,
        report_to=["tensorboard"],
    )
    paths = set()
    for e in TABLE.values():
        if e.kind == "map":
            try:
                paths |= set(e.convert(values[e.name], values))
            except ConfigError:
                pass
    assert {
        "lr_scheduler",
        "warmup_ratio",
        "eval_steps",
        "save_best",
        "algo.steps_per_generation",
        "eval_num_generations",
        "algo.vespo_k_neg",
        "algo.sync_ref_model_steps",
    } <= paths
    assert {p for p in paths if not config_has(p)} == set()


def test_docs_are_generated_from_the_table():
    assert (ROOT / "docs" / "migrating-from-trl.md").read_text() == render(), (
        "regenerate: python -m grpolab.app.trl_compat.docs > docs/migrating-from-trl.md"
    )


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("push_to_hub", True, "Hub"),
        ("hub_model_id", "me/model", "Hub"),
        ("deepspeed", "ds.json", "fsdp"),
        ("optim", "adafactor", "AdamW"),
        ("loss_type", "nope", "dapo"),
        ("vllm_mode", "server", "colocate"),
        ("max_completion_length", None, "limit"),
    ],
)
def test_refused_fields_are_named_with_the_reason(field, value, words):
    with pytest.raises(ConfigError, match=field) as e:
        trl_recipe(GRPOConfig(**{field: value}))
    assert words in str(e.value)


def test_fp16_trains_in_fp32_on_a_cpu_as_trl_does_and_loss_scaled_on_a_cuda_gpu(monkeypatch):
    """fp16=True on a CPU: accelerate (TRL's trainer) makes no fp16 autocast there and no grad scaler, so TRL
    trains fp32; grpolab maps it to precision=fp32 and says so. On a CUDA GPU, where TRL scales an fp16 loss,
    precision=fp16 (autocast, GradScaler: grpolab.model.loss_scale); on MPS refused, naming bf16. Both with
    bf16=True: transformers' error."""
    import torch

    accelerate = pytest.importorskip("accelerate")
    acc = accelerate.Accelerator(mixed_precision="fp16", cpu=True)
    with acc.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.float32 and acc.scaler is None  # what TRL gets on a CPU
    recipe, notes, _ = trl_recipe(GRPOConfig(fp16=True, use_cpu=True))
    assert recipe["precision"] == "fp32" and any("fp16=True on a CPU" in n for n in notes)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    recipe, notes, _ = trl_recipe(GRPOConfig(fp16=True))
    assert recipe["precision"] == "fp16" and any("GradScaler" in n for n in notes)
    assert trl_recipe(GRPOConfig(fp16=True, use_cpu=True))[0]["precision"] == "fp32"  # TRL trains on the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="fp16") as e:
        trl_recipe(GRPOConfig(fp16=True))
    assert "bf16=True" in str(e.value)
    with pytest.raises(ConfigError, match="At most one of fp16 and bf16"):
        trl_recipe(GRPOConfig(fp16=True, bf16=True, use_cpu=True))


def test_optimizer_steps_become_generations():
    """TRL counts optimizer steps; a grpolab step is one generation making num_iterations x
    steps_per_generation / gradient_accumulation_steps of them (here 2 x 4 / 2 = 4)."""
    args = GRPOConfig(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_iterations=2,
        num_generations=4,
        max_steps=40,
        warmup_steps=8,
        save_steps=12,
        eval_strategy="steps",
        eval_steps=20,
        lr_scheduler_type="cosine",
    )
    cfg = build_config(trl_recipe(args)[0])
    assert (cfg.batch_size, cfg.micro_batch, cfg.algo.steps_per_generation, cfg.algo.mu) == (16, 4, 2, 2)
    assert (cfg.steps, cfg.warmup_steps, cfg.save_every, cfg.eval_steps) == (10, 2, 3, 5)
    assert cfg.lr_scheduler == "cosine"
    assert trl_recipe(GRPOConfig(per_device_train_batch_size=4, generation_batch_size=8))[0]["batch_size"] == 8


def test_batch_sizes_count_every_process_as_trl_does(monkeypatch):
    """Under torchrun TRL's generation batch is per_device_train_batch_size x processes x steps_per_generation
    (GRPOConfig.__post_init__ with world_size = WORLD_SIZE); grpolab's batch_size is that global count and
    micro_batch stays each process's slice."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    recipe = trl_recipe(GRPOConfig(per_device_train_batch_size=4, num_generations=4))[0]
    assert (recipe["batch_size"], recipe["micro_batch"]) == (4 * 2 * 1, 4)
    recipe = trl_recipe(GRPOConfig(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2))[0]
    assert recipe["batch_size"] == 4 * 2 * 2
    assert trl_recipe(GRPOConfig(per_device_train_batch_size=4, generation_batch_size=16))[0]["batch_size"] == 16
    with pytest.raises(ConfigError, match="multiple of the global batch.*= 8"):
        trl_recipe(GRPOConfig(per_device_train_batch_size=4, generation_batch_size=12))
    with pytest.raises(ConfigError, match="max_steps=41.*multiple of 4"):
        trl_recipe(
            GRPOConfig(
                **{
                    **dict(
                        per_device_train_batch_size=4,
                        gradient_accumulation_steps=2,
                        steps_per_generation=4,
                        num_iterations=2,
                    ),
                    "max_steps": 41,
                }
            )
        )
    with pytest.raises(ConfigError, match="steps_per_generation=3.*gradient_accumulation_steps=2"):
        trl_recipe(GRPOConfig(gradient_accumulation_steps=2, steps_per_generation=3))


def test_sampling_evaluation_and_tracker_fields_convert():
    recipe = trl_recipe(
        GRPOConfig(
            num_generations_eval=2,
            temperature=0.7,
            min_p=0.05,
            top_k=20,
            generation_kwargs='{"top_p": 0.9}',
            chat_template_kwargs={"enable_thinking": False},
            report_to=["wandb", "tensorboard"],
            run_name="r1",
            load_best_model_at_end=True,
            metric_for_best_model="reward",
            loss_type="sapo",
            sapo_temperature_neg=2.0,
            entropy_coef=0.01,
        )
    )[0]
    assert (recipe["eval_num_generations"], recipe["eval_temperature"], recipe["min_p"], recipe["top_k"]) == (
        2,
        0.7,
        0.05,
        20,
    )
    assert recipe["generation_kwargs"] == {"top_p": 0.9} and recipe["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    assert (recipe["report_to"], recipe["run_name"], recipe["save_best"]) == (
        ["wandb", "tensorboard"],
        "r1",
        "eval/reward",
    )
    assert (recipe["algo"]["objective"], recipe["algo"]["sapo_temperature_neg"], recipe["algo"]["entropy_coef"]) == (
        "sapo",
        2.0,
        0.01,
    )
    with pytest.raises(ConfigError, match="lr_scheduler_type='greedy'.*training loss"):
        trl_recipe(GRPOConfig(lr_scheduler_type="greedy"))
    with pytest.raises(ConfigError, match="generation_kwargs.*JSON"):
        trl_recipe(GRPOConfig(generation_kwargs="{top_p"))


def test_reward_model_ids_are_refused():
    from grpolab import GRPOTrainer

    with pytest.raises(ConfigError, match=r"reward_funcs\[0\].*hub id"):
        GRPOTrainer(
            model="smollm2-135m",
            reward_funcs="OpenAssistant/reward-model-deberta",
            args=GRPOConfig(output_dir="x"),
            train_dataset=[{"prompt": "hi"}],
        )


def test_trl_names_among_settings_convert_without_false_friends():
    out, _ = trl_overrides(
        {
            "scale_rewards": "batch",
            "max_steps": 10,
            "learning_rate": 1e-6,
            "seed": 3,
            "per_device_train_batch_size": 4,
            "algo": "dapo",
        }
    )
    assert out["steps"] == 10 and out["lr"] == 1e-6 and out["seed"] == 3
    assert (out["batch_size"], out["micro_batch"]) == (4, 4)
    assert out["algo"] == {"name": "dapo", "advantage": "group_mean", "adv_scale": "batch_std_unbiased"}
    assert trl_overrides({"report_to": "wandb", "run_name": "x"})[0] == {
        "report_to": "wandb",
        "run_name": "x",
    }  # grpolab's too


def test_grpolab_train_takes_a_grpoconfig_as_args(tmp_path):
    import grpolab

    with pytest.raises(ConfigError, match="push_to_hub=True: refused") as e:
        grpolab.train(args=GRPOConfig(output_dir=str(tmp_path / "r"), push_to_hub=True), dataset=[{"prompt": "x"}])
    assert "task_args" not in str(e.value)


def _cli(*argv, capsys):
    from grpolab.app.cli import main

    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def test_cli_help_prints_the_values_a_run_uses(capsys):
    code, text = _cli("train", "--help", capsys=capsys)
    assert code == 0 and "  algo.beta=0.04\n" in text  # the default preset's, which runs use
    code, text = _cli("train", "dapo", "--help", capsys=capsys)
    assert "  algo.eps_high=0.28\n" in text and "  algo.beta=0.0\n" in text
    code, text = _cli("train", "max_steps=3", "learning_rate=2e-6", "--help", capsys=capsys)
    assert code == 0 and "  steps=3\n" in text and "  lr=2e-06\n" in text and "  algo.beta=0.04\n" in text
    code, text = _cli("train", "--trl", "max_steps=7", "--help", capsys=capsys)
    assert "  steps=7\n" in text and "  lr=1e-06\n" in text and "  max_new_tokens=512\n" in text
    assert "  algo.aggregation='token_mean'\n" in text and "  adam_betas=[0.9, 0.999]\n" in text


def test_cli_refuses_a_trl_field_by_name(capsys):
    code, text = _cli("train", "push_to_hub=true", capsys=capsys)
    assert code == 2 and "push_to_hub=True: refused" in text and "Did you mean" not in text


def test_epoch_order_visits_every_row_once_per_epoch_seeded():
    from grpolab.tasks._args import epoch_order

    order = epoch_order(7, 0, 21, seed=5)
    assert [sorted(order[i : i + 7]) for i in (0, 7, 14)] == [list(range(7))] * 3
    assert order[:7] != order[7:14]  # a new order each epoch (seeded: fixed for this seed)
    assert epoch_order(7, 3, 10, seed=5) == order[3:13]  # any window: what a resumed run takes
    assert epoch_order(7, 0, 7, seed=6) != order[:7]
    assert epoch_order(4, 2, 5, seed=5, shuffle=False) == [2, 3, 0, 1, 2]


def test_steps_minus_one_runs_the_epochs():
    from grpolab.training.run import check_epochs

    class Rows:
        def __len__(self):
            return 10

        def epoch_rows(self, *a):
            return []

    cfg = build_config({"steps": -1, "num_train_epochs": 1.5, "batch_size": 8, "G": 4})
    check_epochs(cfg, Rows(), lambda *_: None)
    assert cfg.steps == 8  # ceil(1.5 x 10 / 2 prompts per step)
    cfg = build_config({"steps": -1, "num_train_epochs": 1.0, "task": "arithmetic"})
    with pytest.raises(ConfigError, match="num_train_epochs"):
        from grpolab.tasks import build_task

        check_epochs(cfg, build_task("arithmetic", 0, {}), lambda *_: None)
    with pytest.raises(ConfigError, match="steps"):
        build_config({"steps": -1})


def test_string_prompts_raw_are_not_templated_and_messages_are(tiny_tokenizer):
    from grpolab.model.template import chat_prompts

    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw, conv = chat_prompts(tiny_tokenizer, [text, [{"role": "user", "content": "hi"}]], None, raw_strings=True)
    assert raw == tiny_tokenizer(text)["input_ids"]
    msgs = [{"role": "user", "content": "hi"}]
    assert conv == chat_prompts(tiny_tokenizer, [msgs], None)[0]  # messages: the chat template, as before
    templated = chat_prompts(tiny_tokenizer, [text], None)[0]
    assert len(templated) > len(raw)  # the chat form wraps it again


def test_prompt_only_data_and_the_null_hint(tmp_path):
    from grpolab.tasks.dataset import DatasetTask

    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"p{i}", "length": i}) + "\n" for i in range(5)))
    with pytest.raises(ConfigError, match="null"):
        DatasetTask(0, path=str(p))
    t = DatasetTask(0, path=str(p), answer_column=None, eval_size=0, string_prompts="raw")
    assert len(t) == 5 and t.eval_set() == [] and t.raw_string_prompts
    assert t.epoch_rows(0, 5, 0)[0].meta["length"] in range(5)


def test_map_style_dataset_is_read_by_its_length():
    from grpolab.app.trl_compat.data import rows_of

    class Endless:  # __getitem__ never raises IndexError: list(ds) would never end
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"prompt": f"p{i}"}

    assert rows_of(Endless(), "train_dataset") == [{"prompt": "p0"}, {"prompt": "p1"}, {"prompt": "p2"}]
    with pytest.raises(ConfigError, match="no length.*needs max_steps"):
        rows_of(iter([{"prompt": "x"}]), "train_dataset")


def test_cli_runs_with_max_steps(tiny_model_dir, tmp_path, capsys):
    import yaml

    out = tmp_path / "run"
    code, text = _cli(
        "train",
        f"model={tiny_model_dir}",
        "max_steps=1",
        "learning_rate=3e-6",
        "batch_size=4",
        "G=2",
        "max_new_tokens=4",
        "eval_size=0",
        f"out={out}",
        "report=false",
        "progress=false",
        capsys=capsys,
    )
    assert code == 0, text
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (cfg["steps"], cfg["lr"]) == (1, 3e-6)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
