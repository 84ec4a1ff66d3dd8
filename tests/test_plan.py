"""`grpolab plan` (grpolab.app.plan, the grpolab.training.plan package) end to end, the settings it proposes, the
warning `grpolab train` gives before step 1, and grad_checkpointing in a real run."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import read_jsonl, varied_score, weights

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.model.reference import reference_kind
from grpolab.training.config import build_config
from grpolab.training.plan import check, devices, estimate
from grpolab.training.plan.devices import CARDS, parse_memory
from grpolab.training.plan.shapes import SHAPES

GB = 1 << 30
BIG = ["model=qwen2.5-7b", "G=8", "batch_size=64", "max_new_tokens=1024", "--prompt-tokens", "256"]


def _plan_json(capsys, *args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_sizes_and_cards():
    assert parse_memory("24GB") is CARDS["rtx4090"] and parse_memory("32 GB") is CARDS["rtx5090"]
    assert parse_memory("80GiB") is CARDS["a100-80gb"] and parse_memory("h100-80gb") is CARDS["h100-80gb"]
    odd = parse_memory("48GB")
    assert odd.memory == 48 * GB and "48 GB" in odd.name


@pytest.mark.parametrize("bad", ["--memory=lots", "--memory=0GB", "--engine-share=1.5", "--prompt-tokens=0"])
def test_bad_options_are_usage_errors(bad, capsys):
    assert main(["plan", "model=qwen2.5-0.5b", "--prompt-tokens", "64", bad]) == 2
    err = capsys.readouterr().err
    assert bad.split("=")[0] in err


def test_a_hub_name_is_refused_like_train_refuses_it(capsys):
    assert main(["plan", "model=Qwen/Qwen2.5-0.5B", "--prompt-tokens", "64", "--memory", "24GB"]) == 2
    assert "never downloads" in capsys.readouterr().err


def test_seven_b_full_fine_tuning_does_not_fit_a_5090_and_nothing_tried_does(capsys):
    out = _plan_json(capsys, *BIG, "--memory", "32GB")
    assert out["fits"] is False and out["device"] == CARDS["rtx5090"].name
    assert out["peak_phase"].startswith("update")
    parts = out["phases"]["resident"]["parts"]
    assert parts["weights"] == 4 * SHAPES["qwen2.5-7b"].params  # fp32 weights: 28.4 GB before anything else
    assert out["fitting"] == []  # even LoRA keeps the fp32 base: over 32 GB


def test_what_does_not_fit_comes_with_settings_that_do(capsys):
    out = _plan_json(
        capsys,
        "model=qwen2.5-1.5b",
        "G=8",
        "batch_size=64",
        "max_new_tokens=1024",
        "--prompt-tokens",
        "256",
        "--memory",
        "80GB",
    )
    assert out["fits"] is False and out["fitting"]
    usable = out["usable"]
    for alt in out["fitting"]:
        assert alt["peak_bytes"] <= usable
    assert any("grad_checkpointing=true" in alt["changes"] for alt in out["fitting"])
    # the changes are real settings: each rebuilds into a config the plan agrees fits
    first = out["fitting"][0]
    cfg = build_config({}, ["model=qwen2.5-1.5b", "G=8", "batch_size=64", "max_new_tokens=1024", *first["changes"]])
    assert estimate.plan(cfg, CARDS["a100-80gb"], prompt_tokens=256).fits


def test_the_text_names_the_peak_phase_and_the_time(capsys):
    assert main(["plan", *BIG, "--memory", "80GB"]) == 0
    text = capsys.readouterr().out
    for word in (
        "resident",
        "generation",
        "reference",
        "update (backward)",
        "optimizer",
        "peak:",
        "time: about",
        "KV cache",
        "AdamW state",
        "activations",
        "gradients (pending)",
    ):
        assert word in text, word


def test_checkpointing_lora_and_an_engine_share_move_the_plan(capsys):
    base = [
        "model=qwen2.5-1.5b",
        "G=8",
        "batch_size=32",
        "max_new_tokens=512",
        "--prompt-tokens",
        "128",
        "--memory",
        "80GB",
    ]
    plain = _plan_json(capsys, *base)
    ckpt = _plan_json(capsys, *base, "grad_checkpointing=true")
    lora = _plan_json(capsys, *base, "lora.r=16")
    share = _plan_json(capsys, *base, "--engine-share", "0.3")
    assert ckpt["peak_bytes"] < plain["peak_bytes"] and ckpt["seconds"]["update"] > plain["seconds"]["update"]
    assert lora["phases"]["resident"]["total"] < plain["phases"]["resident"]["total"]
    assert lora["seconds"]["update"] < plain["seconds"]["update"]  # no weight gradients
    assert share["phases"]["resident"]["parts"]["inference engine"] == int(0.3 * 80 * GB)
    assert "KV cache" not in share["phases"]["generation"]["parts"]


def test_the_bundled_model_counts_its_prompts_with_its_tokenizer(capsys):
    out = _plan_json(capsys, "recipes/demo.yaml", "--memory", "24GB")
    assert out["model"] == "smollm2-135m" and out["fits"] is True
    assert 20 < out["prompt_tokens"] < 200 and "task=arithmetic" in out["prompt_tokens_from"]


def test_step_flops_worked_out():
    s = SHAPES["smollm2-135m"]
    w = estimate.workload_of(build_config({}, ["G=2", "batch_size=2", "max_new_tokens=4"]), prompt_tokens=10)
    r = estimate.regime_of(build_config({}, ["algo.beta=0"]), s, "cuda")
    flops = estimate.step_flops(s, w, r)
    # one prompt of 10 positions + 2 completions of 4: 18 positions through the body, 8 through the head
    fwd = 2 * 30 * 3_538_944 * 18 + 4 * 30 * 576 * 18 * (10 / 2 + 4 / 2) + 2 * 49152 * 576 * 8
    assert flops["update"] == pytest.approx(3 * fwd)
    assert "reference" not in flops  # beta = 0: no reference pass


def test_the_reference_is_none_a_copy_or_the_adapter_off_and_the_plan_counts_that_one():
    """reference_kind decides for the trainer and the plan alike: none without a KL term, a frozen copy
    under full fine-tuning, the adapter switched off under LoRA; only the copy costs resident bytes."""
    assert reference_kind(0.0, False, 0) == "none" and reference_kind(0.0, False, 16) == "none"
    assert reference_kind(0.04, False, 0) == "copy" and reference_kind(0.04, True, 0) == "copy"
    assert reference_kind(0.04, False, 16) == "adapter_off" and reference_kind(0.04, True, 8) == "adapter_off"
    s = SHAPES["smollm2-135m"]
    for keys, kind in (
        (["algo.beta=0"], "none"),
        (["algo.beta=0.04"], "copy"),
        (["algo.beta=0.04", "algo.adaptive_kl=true"], "copy"),
        (["algo.beta=0.04", "lora.r=16"], "adapter_off"),
    ):
        p = estimate.plan(build_config({}, keys), CARDS["rtx4090"], prompt_tokens=32, shape=s)
        assert p.regime.reference == kind, keys
        resident = p.phases[0].parts
        assert (resident.get("reference copy", 0) > 0) == (kind == "copy"), (keys, resident)
        assert ("reference" in p.seconds) == (kind != "none"), keys


@pytest.fixture()
def varied_reward():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        yield


RUN = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=8",
    "micro_batch=4",
    "eval_size=0",
    "progress=false",
    "report=false",
    "tensorboard=false",
    "precision=fp32",
    "rewards=[{name: test_varied}]",
    "steps=2",
]


def test_train_warns_before_step_1_when_the_plan_is_over_the_device(
    tiny_model_dir, tmp_path, monkeypatch, capsys, varied_reward
):
    monkeypatch.setattr(devices, "_available_cpu_bytes", lambda: 1 << 20)  # a 1 MB machine
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'small'}", *RUN, "steps=1"]) == 0
    out = capsys.readouterr().out
    assert "warning: grpolab plan puts this run's peak at" in out and "this CPU has 0.0 GB" in out
    assert out.index("warning: grpolab plan") < out.index("step")  # before the first step's line
    monkeypatch.setattr(devices, "_available_cpu_bytes", lambda: 64 * GB)
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'big'}", *RUN, "steps=1"]) == 0
    assert "warning: grpolab plan" not in capsys.readouterr().out


def test_grad_checkpointing_trains_the_same_weights(tiny_model_dir, tmp_path, varied_reward):
    """fp32, the same seed: the replayed layers give the same gradients, so the same run to the bit."""
    for name, extra in (("plain", []), ("ckpt", ["grad_checkpointing=true"])):
        assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / name}", *RUN, *extra]) == 0
    a, b = (read_jsonl(tmp_path / n / "metrics.jsonl") for n in ("plain", "ckpt"))
    for x, y in zip(a, b):
        assert (
            x["loss/policy"] == y["loss/policy"] and x["grad_norm"] == y["grad_norm"] and x["entropy"] == y["entropy"]
        )
    wa = weights(tmp_path / "plain" / "checkpoints" / "step-000002")
    wb = weights(tmp_path / "ckpt" / "checkpoints" / "step-000002")
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_a_plan_that_fails_costs_one_line_not_the_run(tiny_model_dir, tmp_path, monkeypatch, capsys, varied_reward):
    def broken(*a, **k):
        raise RuntimeError("no prompts today")

    monkeypatch.setattr(check, "prompt_tokens_of", broken)
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", *RUN, "steps=1"]) == 0
    assert "note: grpolab plan could not plan this run (RuntimeError: no prompts today)" in capsys.readouterr().out
