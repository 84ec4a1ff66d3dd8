"""TRL's best-model, NEFTune, vLLM and FSDP fields mean in grpolab what they mean in TRL 1.16 / transformers 5:
the best evaluation chosen as transformers' Trainer chooses it (its own _determine_best_metric run on the same
rows), the best model loaded at the end of train(), neftune_noise_alpha reaching the update, the vLLM options
reaching vLLM (refused by the native engine), and fsdp / fsdp_config read as transformers reads them (a real
trl.GRPOConfig's processed values), mapped to grpolab's FSDP2 under torchrun and refused by name where grpolab
cannot honour them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from e2e_helpers import read_jsonl

from grpolab import GRPOConfig
from grpolab.app.trl_compat import trl_recipe
from grpolab.training.evaluation import higher_is_better, improves
from grpolab.training.trl_names import grpolab_name
from grpolab.util.fields import ConfigError

pytest.importorskip("trl")


ROWS = [  # four evaluations, in TRL's names
    {"eval_loss": 0.30, "eval_reward": 0.50, "eval_completions/mean_length": 6.0, "eval_rewards/len/mean": 0.2},
    {"eval_loss": 0.10, "eval_reward": 0.40, "eval_completions/mean_length": 4.0, "eval_rewards/len/mean": 0.2},
    {"eval_loss": 0.20, "eval_reward": 0.90, "eval_completions/mean_length": 4.0, "eval_rewards/len/mean": 0.7},
    {"eval_loss": 0.10, "eval_reward": 0.90, "eval_completions/mean_length": 8.0, "eval_rewards/len/mean": 0.1},
]


def trl_config(tmp_path, **kw):
    import trl

    return trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kw)


def transformers_best(args) -> int:
    """The evaluation transformers' Trainer._determine_best_metric keeps (the index of its last new best)."""
    from transformers import Trainer, TrainerState

    fake = SimpleNamespace(args=args, state=TrainerState())
    best = -1
    for i, row in enumerate(ROWS):
        fake.state.global_step = i + 1
        if Trainer._determine_best_metric(fake, dict(row), trial=None):
            best = i
    return best


def grpolab_best(recipe: dict) -> int:
    """The evaluation grpolab's Evaluator keeps with the recipe's save_best and save_best_higher."""
    metric, higher = recipe["save_best"], higher_is_better(recipe["save_best"], recipe.get("save_best_higher"))
    best, value = -1, None
    for i, row in enumerate(ROWS):
        v = {grpolab_name(k): x for k, x in row.items()}[metric]
        if value is None or improves(v, value, higher):
            best, value = i, v
    return best


@pytest.mark.parametrize(
    "fields",
    [
        {"load_best_model_at_end": True},  # transformers: metric "loss", lower is better
        {"load_best_model_at_end": True, "metric_for_best_model": "reward"},
        {"load_best_model_at_end": True, "metric_for_best_model": "eval_reward", "greater_is_better": False},
        {"save_strategy": "best", "metric_for_best_model": "completions/mean_length"},
        {"save_strategy": "best", "metric_for_best_model": "completions/mean_length", "greater_is_better": False},
        {"load_best_model_at_end": True, "metric_for_best_model": "rewards/len/mean"},
    ],
)
def test_the_best_evaluation_is_the_one_transformers_keeps(fields, tmp_path):
    """A real trl.GRPOConfig settles metric_for_best_model and greater_is_better (its __post_init__); the
    recipe grpolab makes of it picks, over the same four evaluations, the evaluation transformers'
    _determine_best_metric keeps (ties keep the earlier one on both sides)."""
    steps = {"eval_strategy": "steps", "eval_steps": 4, "save_steps": 4}
    args = trl_config(tmp_path, **steps, **fields)
    recipe = trl_recipe(args)[0]
    assert recipe["save_best"] == grpolab_name(
        args.metric_for_best_model
        if args.metric_for_best_model.startswith("eval_")
        else f"eval_{args.metric_for_best_model}"
    )
    assert grpolab_best(recipe) == transformers_best(args)
    ours = trl_recipe(GRPOConfig(**steps, **fields))[0]  # grpolab's GRPOConfig: the same settings
    assert (ours["save_best"], ours["save_best_higher"]) == (recipe["save_best"], recipe["save_best_higher"])


def test_best_model_refusals_name_the_metrics_and_the_fix():
    with pytest.raises(ConfigError, match="eval_bleu.*eval_reward.*eval_accuracy"):
        trl_recipe(GRPOConfig(load_best_model_at_end=True, metric_for_best_model="bleu"))
    with pytest.raises(ConfigError, match="eval_entropy; grpolab's evaluation has no number"):
        trl_recipe(GRPOConfig(load_best_model_at_end=True, metric_for_best_model="entropy"))
    with pytest.raises(ConfigError, match="save_strategy='best'.*metric_for_best_model"):
        trl_recipe(GRPOConfig(save_strategy="best"))  # transformers' Trainer raises there too
    with pytest.raises(ConfigError, match="eval_loss.*default.*beta=0.0.*metric_for_best_model='reward'"):
        trl_recipe(GRPOConfig(load_best_model_at_end=True, beta=0.04))
    assert "save_best" not in trl_recipe(GRPOConfig(metric_for_best_model="reward"))[0]  # alone: state only


SMALL = [
    "batch_size=8",
    "G=4",
    "micro_batch=8",
    "max_new_tokens=4",
    "eval_size=4",
    "eval_steps=1",
    "eval_num_generations=2",
    "progress=false",
    "tensorboard=false",
    "report=false",
    "save_every=0",
    "lr=1e-2",
    "algo.beta=0",
    "rewards=[{name: test_varied}]",
]


def test_save_best_by_a_loss_keeps_the_lowest_and_an_unlogged_metric_stops_the_run(
    tiny_model_dir, tmp_path, varied_reward, capsys
):
    """save_best=eval/loss: lower is better (its name ends in loss), every evaluation measures the loss (with an
    entropy bonus, so that it moves: GRPO's loss at ratio 1 is -mean A = 0 on equal lengths), the best model is
    the first with the lowest; a metric the run's evaluation does not log (eval/turns without an
    environment) stops the run at its first evaluation, naming the metrics it logs."""
    from grpolab.app.cli import main

    out = tmp_path / "loss"
    settings = ["steps=3", "save_best=eval/loss", "algo.entropy_coef=0.01", *SMALL]
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *settings]) == 0
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "eval/loss" in r]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    best = json.loads((out / "checkpoints" / "best" / "best.json").read_text())
    lowest = min(r["eval/loss"] for r in rows)
    assert (best["metric"], best["value"]) == ("eval/loss", lowest)
    assert best["step"] == next(r["step"] for r in rows if r["eval/loss"] == lowest)
    assert len({r["eval/loss"] for r in rows}) > 1  # the choice was a choice
    capsys.readouterr()
    bad = ["train", f"model={tiny_model_dir}", f"out={tmp_path / 'turns'}", "steps=1", "save_best=eval/turns"]
    assert main([*bad, *SMALL]) == 2
    err = capsys.readouterr().err
    assert "save_best: this run's evaluation logs no eval/turns" in err and "eval/reward" in err


def reward_len(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def test_load_best_model_at_end_loads_the_best_weights_into_the_model(tiny_model_dir, tmp_path):
    """metric_for_best_model='completions/mean_length' (higher is better): every evaluation ties, the tiny
    model never ending a completion early, so the first one, before training, is kept (a tie keeps the
    earlier, as transformers); the run trains, and when train() ends trainer.model holds that best model's
    weights, as load_best_model_at_end loads them in transformers."""
    from datasets import Dataset
    from e2e_helpers import changed, weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab import GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    ds = Dataset.from_dict({"prompt": [f"Count to {i}" for i in range(8)]})
    out = tmp_path / "run"
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-2,
        eval_strategy="steps",
        eval_steps=1,
        save_steps=1,
        per_device_eval_batch_size=4,
        load_best_model_at_end=True,
        metric_for_best_model="completions/mean_length",
        report_to="none",
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=reward_len,
        args=args,
        train_dataset=ds,
        eval_dataset=ds.select(range(2)),
    )
    trainer.train()
    best = json.loads((out / "checkpoints" / "best" / "best.json").read_text())
    assert (best["metric"], best["step"]) == ("eval/length", 0)
    assert changed(initial, weights(out / "checkpoints" / "step-000002")), "the run did not train"
    assert trainer.model is model and not changed(initial, model.state_dict())


def test_neftune_and_the_vllm_options_map(monkeypatch):
    recipe = trl_recipe(GRPOConfig(neftune_noise_alpha=5.0, use_vllm=True, vllm_structured_outputs_regex=r"\d+"))[0]
    assert recipe["neftune_alpha"] == 5.0
    assert recipe["rollout"]["structured_outputs_regex"] == r"\d+"
    assert trl_recipe(GRPOConfig(use_vllm=True, vllm_model_impl="transformers"))[0]["rollout"]["vllm_model_impl"] == (
        "transformers"
    )
    assert trl_recipe(GRPOConfig(use_vllm=True))[0]["rollout"]["vllm_model_impl"] == "vllm"  # TRL's default


def test_the_native_engine_refuses_a_regex_by_name(tiny_model_dir, tmp_path, capsys):
    from grpolab.app.cli import main

    args = ["train", f"model={tiny_model_dir}", f"out={tmp_path / 'r'}", "rollout.engine=native"]
    assert main([*args, r"rollout.structured_outputs_regex=a+"]) == 2
    err = capsys.readouterr().err
    assert "rollout.structured_outputs_regex: only vLLM constrains decoding" in err and "use_vllm=True" in err


def test_the_vllm_engine_starts_with_the_tokenizer_a_regex_needs(monkeypatch, tiny_tokenizer):
    """LLM(...) gets its tokenizer (skip_tokenizer_init off) when a regex constrains decoding (vLLM compiles it
    over the vocabulary), and none otherwise, as before."""
    vllm = pytest.importorskip("vllm")
    from grpolab.engine.settings import RolloutConfig
    from grpolab.engine.vllm_engine import VllmEngine

    seen = []
    monkeypatch.setattr(vllm, "LLM", lambda **kw: seen.append(kw))
    for regex in (None, r"\d+"):
        settings = RolloutConfig(engine="vllm", structured_outputs_regex=regex)
        settings.vllm_kv_cache_gb = 1.0  # no config.json to size it from
        kw = dict(tokenizer=tiny_tokenizer, device=torch.device("cpu"), dtype=None, eos_ids={0}, max_model_len=64)
        VllmEngine(settings, model_path=Path("unused"), seed=0, kv_tokens=64, **kw)
    assert [k["skip_tokenizer_init"] for k in seen] == [True, False]


# -- fsdp, fsdp_config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"fsdp": "full_shard"},
        {"fsdp": "full_shard auto_wrap"},
        {"fsdp": True, "fsdp_config": {"fsdp_version": 2, "reshard_after_forward": True, "min_num_params": 0}},
        {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "backward_prefetch": "x"}},
    ],
)
def test_fsdp_as_transformers_reads_it_becomes_fsdp_true_under_torchrun(fields, tmp_path, monkeypatch):
    """A real trl.GRPOConfig's processed fsdp / fsdp_config (legacy words turned into fsdp_config entries, the
    fsdp_ prefixes dropped, defaults filled) and grpolab's GRPOConfig holding the same fields as given: fsdp=true
    under torchrun; in one process nothing is sharded, as accelerate shards nothing there, and a note says so."""
    args = trl_config(tmp_path, **copy.deepcopy(fields))
    assert args.fsdp is True  # transformers settles the legacy words
    monkeypatch.setenv("WORLD_SIZE", "2")
    two = copy.copy(args)  # built in one process; under torchrun TRL settles the generation batch of two
    two.generation_batch_size *= 2
    assert trl_recipe(two)[0]["fsdp"] is True
    assert trl_recipe(GRPOConfig(**copy.deepcopy(fields)))[0]["fsdp"] is True
    monkeypatch.delenv("WORLD_SIZE")
    recipe, notes, _ = trl_recipe(args)
    assert "fsdp" not in recipe and any(n.startswith("fsdp: one process") for n in notes)


def test_activation_checkpointing_is_grad_checkpointing_as_transformers_allows_it(tmp_path, monkeypatch):
    fields = {"fsdp": True, "fsdp_config": {"activation_checkpointing": True}, "gradient_checkpointing": False}
    args = trl_config(tmp_path, **fields)  # in this process: the launcher's variables would make accelerate join one
    monkeypatch.setenv("WORLD_SIZE", "2")
    args.generation_batch_size *= 2  # as TRL settles it under torchrun with two processes
    recipe = trl_recipe(args)[0]
    assert (recipe["fsdp"], recipe["grad_checkpointing"]) == (True, True)
    with pytest.raises(ConfigError, match="gradient_checkpointing=True too.*refuses both"):
        trl_recipe(GRPOConfig(fsdp=True, fsdp_config={"activation_checkpointing": True}))


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"fsdp": "shard_grad_op"}, "fsdp='shard_grad_op': keeps each layer's weights gathered"),
        ({"fsdp": "full_shard offload"}, "offloads parameters and gradients to the CPU"),
        ({"fsdp": True, "fsdp_config": {"cpu_offload": True}}, "fsdp_config.cpu_offload=True"),
        ({"fsdp": True, "fsdp_config": {"version": 1}}, "FSDP1"),
        ({"fsdp": True, "fsdp_config": {"state_dict_type": "SHARDED_STATE_DICT"}}, "whole models"),
        ({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP"}}, "TRANSFORMER_BASED_WRAP"),
        ({"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaMLP"]}}, "DecoderLayer"),
        ({"fsdp": True, "fsdp_config": {"xla": True}}, "XLA"),
        ({"fsdp": True, "fsdp_config": {"offload_params": True}}, "not a key of transformers' fsdp_config"),
        ({"fsdp": "hybrid_shard"}, "FSDP1 strategy"),
    ],
)
def test_what_grpolabs_fsdp2_cannot_honour_is_refused_by_name(fields, words, tmp_path):
    """Refused in one process too (the launch does not make a wrong configuration right); where transformers
    itself raises (hybrid_shard with FSDP2) so does a real trl.GRPOConfig."""
    with pytest.raises(ConfigError, match="fsdp") as e:
        trl_recipe(GRPOConfig(**copy.deepcopy(fields)))
    assert words in str(e.value)
    try:
        args = trl_config(tmp_path, **copy.deepcopy(fields))
    except ValueError as refused:  # transformers refuses it itself
        assert fields["fsdp"] == "hybrid_shard" and "only available with FSDP1" in str(refused)
        return
    with pytest.raises(ConfigError, match="fsdp"):  # as transformers processed it
        trl_recipe(args)
