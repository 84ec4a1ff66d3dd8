"""grpolab computes TRL 1.16's GRPO loss: for each of TRL's loss types (and TRL's default config), TRL's
GRPOTrainer and grpolab, given the same GRPOConfig (through grpolab's mapping table), the same tiny model,
the same forced completions and the same rewards, give the same loss and gradient norm on one step.

Tolerance: relative 1e-4 on the loss and on the gradient norm. Both sides run the same fp32 weights on the
CPU; what differs is the order of floating-point sums (grpolab's chunked log-softmax, micro-batching),
which moves fp32 results by about 1e-6 relative. A wrong normaliser or std moves them by 10% or more
(sqrt(4/3) for the Bessel std with G = 4; 2x for sequences vs tokens here).

cispo's loss value differs by design: TRL's is -w A log pi (the log-prob itself), grpolab's -w A pi/sg(pi)
(value -w A, the same gradient, grpolab.algo.losses.obj_cispo): only its gradient norm is compared.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl", reason="TRL (the test extra) is not installed")

from trl_parity import grpolab_step, trl_config, trl_step  # noqa: E402

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
}


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
    trl_loss, trl_norm = trl_step(lively_model_dir, args)
    ours_loss, ours_norm = grpolab_step(lively_model_dir, args, tmp_path / "grpolab", monkeypatch)
    assert trl_norm > 1e-6, "the step must carry a gradient for the comparison to mean something"
    assert math.isclose(ours_norm, trl_norm, rel_tol=REL), (case, ours_norm, trl_norm)
    if case != "cispo":
        assert math.isclose(ours_loss, trl_loss, rel_tol=REL, abs_tol=1e-7), (case, ours_loss, trl_loss)
