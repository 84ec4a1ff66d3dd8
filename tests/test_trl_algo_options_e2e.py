"""A TRL script with TRL 1.16's algorithm options, only the import changed, trains on the tiny model: two
reward functions summed after GDPO's per-reward normalisation, the top-entropy token mask, the off-policy
sequence mask, Skywork-OR1's adaptive entropy control (its coefficient saved in each checkpoint), the LM
head in fp32 and cispo at TRL's default epsilon_high. tests/test_trl_parity.py compares each with TRL's
trainer; here they run together, through GRPOTrainer, for several steps. A model directory with custom
code raises transformers' error, as TRL's default trust_remote_code=False does."""

from __future__ import annotations

import json

import pytest
import torch
import yaml


def lengths(completions, **kwargs):
    return [len(c) / 10.0 for c in completions]


def vowels(completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in c) % 3) for c in completions]


def script(out, model_dir, max_steps=3, **fields):
    from grpolab import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out),
        max_steps=max_steps,
        max_completion_length=6,
        num_generations=4,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        bf16=False,
        save_steps=1,
        **fields,
    )
    prompts = [{"prompt": f"Say {w}:"} for w in ("yes", "no", "maybe", "never")]
    return GRPOTrainer(model=str(model_dir), reward_funcs=[lengths, vowels], args=args, train_dataset=prompts)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_trl_algorithm_options_train_with_the_import_changed(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    fields = dict(
        multi_objective_aggregation="normalize_then_sum",
        reward_weights=[1.0, 0.5],
        top_entropy_quantile=0.5,
        off_policy_mask_threshold=0.5,
        use_adaptive_entropy=True,
        entropy_coef=0.01,
        entropy_coef_delta=0.02,
        entropy_target=50.0,  # above any token entropy of this vocabulary: the coefficient grows each update
        cast_lm_head_to_fp32=True,
        loss_type="cispo",  # at TRL's default epsilon_high
    )
    trainer = script(out, tiny_model_dir, **fields)
    trainer.train()
    lines = metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3]
    # each update moves the coefficient by +delta (entropy below target); applied from the second on
    assert [m["entropy/coef"] for m in lines] == pytest.approx([0.03, 0.05, 0.07])
    assert [m["entropy/coef_applied"] for m in lines] == pytest.approx([0.03, 0.05, 0.07])
    for m in lines:  # top_entropy_quantile 0.5 drops about half of the valid tokens from the policy term
        assert 0.3 <= m["mask/entropy_dropped_frac"] <= 0.7
        assert m["mask/off_policy_dropped_frac"] == 0.0  # sampled by the trainer, on-policy: nothing to drop
    algo = yaml.safe_load((out / "config.yaml").read_text())["algo"]
    assert (algo["reward_aggregation"], algo["advantage"], algo["adv_scale"]) == (
        "normalize_then_sum",
        "batch_mean",
        "batch_std_unbiased",
    )
    assert (algo["objective"], algo["eps_high"], algo["top_entropy_quantile"]) == ("cispo", pytest.approx(-0.8), 0.5)
    # the controller's state is in every checkpoint (a run component: loaded with the checkpoint on resume)
    state = torch.load(out / "checkpoints" / "step-000003" / "entropy_control.pt", weights_only=True)
    assert state["coef"] == pytest.approx(0.07) and state["last_entropy"] < 50.0


def test_gdpo_advantages_in_the_run(tiny_model_dir, tmp_path, monkeypatch):
    """GDPO in a run: the advantages the update reads are the batch z-score of the weighted sum of each
    reward's group z-score (algo.advantages.normalize_then_sum), computed here from the step's own rewards."""
    from grpolab.algo.advantages import normalize_then_sum
    from grpolab.training import update as update_mod

    seen = []
    real = update_mod.update

    def recording(run, batch):
        seen.append((dict(batch.reward_by_fn), batch.adv.clone()))
        return real(run, batch)

    monkeypatch.setattr(update_mod, "update", recording)
    monkeypatch.setattr("grpolab.training.step.update", recording)
    out = tmp_path / "gdpo"
    script(out, tiny_model_dir, multi_objective_aggregation="normalize_then_sum", reward_weights=[1.0, 0.5]).train()
    by_fn, adv = seen[0]
    per_fn = torch.tensor([by_fn["lengths"], by_fn["vowels"]]).T  # (N, 2)
    r = normalize_then_sum(per_fn, torch.tensor([1.0, 0.5]), 4, 1e-4)
    want = (r - r.mean()) / (r.std() + 1e-4)
    assert torch.allclose(adv, want, atol=1e-5)
    assert adv.abs().sum() > 0


def test_custom_code_model_raises_trls_error(tiny_model_dir, tmp_path):
    """TRL loads with trust_remote_code=False: transformers refuses a directory whose config maps to its own
    code (auto_map) with a ValueError that names trust_remote_code. grpolab raises the same, and runs none of
    that code (the module below would fail the test on import)."""
    import shutil

    custom = tmp_path / "custom"
    shutil.copytree(tiny_model_dir, custom)
    config = json.loads((custom / "config.json").read_text())
    config |= {"model_type": "grpolab_custom", "auto_map": {"AutoConfig": "conf.Conf", "AutoModelForCausalLM": "m.M"}}
    (custom / "config.json").write_text(json.dumps(config))
    (custom / "conf.py").write_text("raise SystemExit('custom code ran')\n")
    (custom / "m.py").write_text("raise SystemExit('custom code ran')\n")
    with pytest.raises(ValueError, match="(?s)contains custom code.*trust_remote_code=True"):
        script(tmp_path / "run", custom).train()
