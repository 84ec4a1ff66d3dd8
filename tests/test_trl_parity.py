"""grpolab computes TRL 1.16's GRPO loss: for each of TRL's loss types (and TRL's default config), TRL's
GRPOTrainer and grpolab, given the same GRPOConfig (through grpolab's mapping table), the same tiny model,
the same forced completions and the same rewards, give the same loss and gradient norm on one step.

Tolerance: relative 1e-4 on the loss and on the gradient norm. Both sides run the same fp32 weights on the
CPU; what differs is the order of floating-point sums (grpolab's chunked log-softmax, micro-batching),
which moves fp32 results by about 1e-6 relative. A wrong normaliser or std moves them by 10% or more
(sqrt(4/3) for the Bessel std with G = 4; 2x for sequences vs tokens here).

cispo's and vespo's loss values differ by design: TRL's are -w A log pi (the log-prob itself, w detached),
grpolab's -w A pi/sg(pi) (value -w A, the same gradient; grpolab.algo.losses.obj_cispo, obj_vespo), so that
the logged loss does not move with the log-probs' size: only their gradient norms are compared.

The learning rate: TRL's default schedule is linear decay to 0 over max_steps optimizer steps (transformers'
get_scheduler), which the mapping gives grpolab too (lr_scheduler=linear): the lr of the step's update and
the lr after it match TRL's scheduler, built as Trainer.train builds it, stepped once.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl", reason="TRL (the test extra) is not installed")

from trl_parity import grpolab_step, reward, reward_length, trl_config, trl_step  # noqa: E402

REL = 1e-4

CASES = {
    "default": {},  # TRL's defaults: loss_type dapo, scale_rewards group, beta 0
    "grpo": {"loss_type": "grpo"},
    "dapo": {"loss_type": "dapo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "luspo": {"loss_type": "luspo"},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "grpo_beta": {"loss_type": "grpo", "beta": 0.04},  # KL in the loss, times the ratio (use_bias_correction_kl)
    "dapo_batch_std": {"scale_rewards": "batch"},
    "dr_grpo_no_std": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "sapo": {"loss_type": "sapo"},
    "sapo_temperatures": {"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0},
    "vespo": {"loss_type": "vespo"},
    "vespo_beta": {"loss_type": "vespo", "beta": 0.04, "vespo_k_neg": 1.5, "vespo_lambda_neg": 4.0},
    # TRL's default schedule (linear decay) over 4 steps, with and without warm-up: lr of step 1 and after
    "default_linear_4_steps": {"max_steps": 4},
    "default_linear_warmup": {"max_steps": 4, "warmup_steps": 2},
    # TRL's cispo at its default epsilon_high (= epsilon = 0.2): every weight is capped at 0.2
    "cispo_default_epsilon": {"loss_type": "cispo"},
    # two rewards on different scales: their weighted sum (TRL's default), and GDPO's sum of group z-scores
    "two_rewards": {"reward_weights": [1.0, 0.5]},
    "gdpo": {"multi_objective_aggregation": "normalize_then_sum", "reward_weights": [1.0, 0.5]},
    "gdpo_grpo": {"multi_objective_aggregation": "normalize_then_sum", "loss_type": "grpo", "scale_rewards": "none"},
    # the policy term on the top-20% entropy tokens; with an entropy bonus over the same tokens
    "top_entropy": {"top_entropy_quantile": 0.2},
    "top_entropy_bonus": {"top_entropy_quantile": 0.5, "entropy_coef": 0.05, "loss_type": "grpo"},
    # adaptive entropy: the first update applies no bonus (no entropy measured yet); test_trl_losses goes on
    "adaptive_entropy": {"use_adaptive_entropy": True, "entropy_coef": 0.05, "entropy_target": 100.0},
    "lm_head_fp32": {"cast_lm_head_to_fp32": True},
    # another engine's log-probs (tests/trl_parity.py, sampler_logps): the off-policy sequence mask alone,
    "off_policy_mask": {"off_policy_mask_threshold": 0.1, "vllm_importance_sampling_correction": False},
    # the importance correction as TRL's vLLM path computes it (its default; with a lower bound C_min)
    "vllm_correction": {},
    "vllm_token_truncate_min": {
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_min": 0.8,
        "vllm_importance_sampling_clip_max": 1.5,
    },
    "vllm_sequence_mask_min": {
        "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_clip_min": 0.3,
        "vllm_importance_sampling_clip_max": 10.0,
    },
    "vllm_off_policy_mask": {"off_policy_mask_threshold": 0.1, "loss_type": "grpo"},
}
VALUE_DIFFERS = {"cispo", "vespo", "vespo_beta", "cispo_default_epsilon"}  # the loss value's convention (docstring)
TWO_REWARDS = {"two_rewards", "gdpo", "gdpo_grpo"}
SAMPLER = {"off_policy_mask"}  # another engine's log-probs, TRL without vLLM's correction
VLLM = {"vllm_correction", "vllm_token_truncate_min", "vllm_sequence_mask_min", "vllm_off_policy_mask"}


@pytest.fixture(scope="module")
def lively_model_dir(tmp_path_factory, tiny_model_dir):
    """The tiny model with re-randomised blocks (conftest.liven), so that log-probs and gradients differ
    from token to token, saved as a Hugging Face directory both trainers load."""
    import shutil

    import torch
    from conftest import liven
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("lively")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    liven(model, sharpen=5.0)
    model.save_pretrained(str(out))
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_matches_trl(case, lively_model_dir, tmp_path, monkeypatch):
    args = trl_config(tmp_path / "trl", **CASES[case])
    rewards = (reward, reward_length) if case in TWO_REWARDS else (reward,)
    sampler = case in SAMPLER | VLLM
    trl_loss, trl_norm, trl_lr = trl_step(lively_model_dir, args, rewards=rewards, sampler=sampler, vllm=case in VLLM)
    ours_loss, ours_norm, ours_lr = grpolab_step(
        lively_model_dir, args, tmp_path / "grpolab", monkeypatch, rewards=rewards, sampler=sampler
    )
    assert trl_norm > 1e-6, "the step must carry a gradient for the comparison to mean something"
    assert math.isclose(ours_norm, trl_norm, rel_tol=REL), (case, ours_norm, trl_norm)
    if case not in VALUE_DIFFERS:
        assert math.isclose(ours_loss, trl_loss, rel_tol=REL, abs_tol=1e-7), (case, ours_loss, trl_loss)
    assert ours_lr == pytest.approx(trl_lr, rel=1e-9, abs=1e-15), (case, ours_lr, trl_lr)
    steps, warmup = args.max_steps, args.warmup_steps  # transformers' linear schedule, worked out
    expected = [1e-6 * (i / warmup if i < warmup else (steps - i) / (steps - warmup)) for i in (0, 1)]
    assert trl_lr == pytest.approx(expected, abs=1e-15), (case, trl_lr)
