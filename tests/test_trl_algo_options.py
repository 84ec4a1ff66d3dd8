"""TRL 1.16's algorithm options beyond the loss types: GDPO's per-reward normalisation, the top-entropy token
mask, DeepSeek-V3.2's off-policy sequence mask, Skywork-OR1's adaptive entropy control, the sampler
correction's lower bound, cispo with a cap below 1. Worked arithmetic on small tensors, and the same tensors
through TRL's own GRPOTrainer._compute_loss on a stand-in trainer (tests/test_trl_losses.py): the same loss
and gradient. tests/test_trl_parity.py runs each option end to end against TRL's trainer."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpolab.algo.advantages import normalize_then_sum, sum_then_normalize
from grpolab.algo.entropy import AdaptiveEntropy
from grpolab.algo.masks import high_entropy_mask, off_policy_mask
from grpolab.algo.presets import AlgoConfig, resolve_algo
from grpolab.algo.sampler import correction_weights
from grpolab.util.fields import ConfigError

pytest.importorskip("trl", reason="TRL (the test extra) is not installed")

from test_trl_losses import ADV, LOGP, MASK, OLD, grpolab_loss, trl_compute, trl_stand_in  # noqa: E402

ENT = torch.tensor([[2.0, 0.5, 3.0], [0.1, 0.4, 1.5], [1.0, 2.5, 9.0]])  # the 9 is padding


# --- GDPO ----------------------------------------------------------------------------------------------------


def test_normalize_then_sum_worked_arithmetic():
    # one group of G = 2, two rewards: r_1 = (1, 3), r_2 = (10, 30); weights 1 and 0.5
    # group z-scores with the Bessel std: r_1 mean 2, std sqrt 2 -> -+1 / (sqrt 2 + 1e-4) = -+0.707057;
    # r_2 mean 20, std 10 sqrt 2 -> -+10 / (10 sqrt 2 + 1e-4) = -+0.707102; sum 0.707057 + 0.5 x 0.707102
    r = torch.tensor([[1.0, 10.0], [3.0, 30.0]])
    w = torch.tensor([1.0, 0.5])
    z = 1.0 / (math.sqrt(2.0) + 1e-4) + 0.5 * 10.0 / (10.0 * math.sqrt(2.0) + 1e-4)
    assert z == pytest.approx(1.060608, abs=1e-6)
    assert normalize_then_sum(r, w, 2, 1e-4).tolist() == pytest.approx([-z, z], abs=1e-6)
    # summed first, the second reward's scale decides: 1 + 5 = 6 and 3 + 15 = 18
    assert sum_then_normalize(r, w, 2, 1e-4).tolist() == [6.0, 18.0]


def test_normalize_then_sum_leaves_nan_out():
    """A NaN reward (a failed call with on_error=exclude) is out of its group's statistics and of the sum;
    a row whose every reward is NaN stays NaN."""
    r = torch.tensor([[1.0, float("nan")], [3.0, 2.0], [5.0, 4.0], [float("nan"), float("nan")]])
    out = normalize_then_sum(r, torch.tensor([1.0, 1.0]), 4, 1e-4)
    # reward 1 over (1, 3, 5): mean 3, std 2 -> -1, 0, +1; reward 2 over (2, 4): mean 3, std sqrt 2
    z2 = 1.0 / (math.sqrt(2.0) + 1e-4)
    assert out[:3].tolist() == pytest.approx([-2 / 2.0001, 0 - z2, 2 / 2.0001 + z2], abs=1e-5)
    assert math.isnan(out[3])


def test_gdpo_is_a_config_choice():
    algo = resolve_algo("grpo", {"reward_aggregation": "normalize_then_sum"})
    assert algo.reward_aggregation == "normalize_then_sum"
    with pytest.raises(ConfigError, match="algo.reward_aggregation"):
        from grpolab.training.config import algo_choices

        resolve_algo("grpo", {"reward_aggregation": "mean"}, choices=algo_choices())


# --- top-entropy tokens --------------------------------------------------------------------------------------


def test_high_entropy_mask_worked_arithmetic():
    # valid entropies: 2, .5, 3, .1, .4, 1.5, 1, 2.5 (8 tokens; the padded 9 is left out)
    # rho = 0.5: tau = the 0.5 quantile = (1 + 1.5) / 2 = 1.25 -> keeps 2, 3, 1.5, 2.5
    keep = high_entropy_mask(ENT, MASK, 0.5)
    assert keep.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    assert high_entropy_mask(ENT, MASK, 1.0).tolist() == MASK.tolist()  # rho = 1: every valid token
    assert high_entropy_mask(ENT, MASK, 0.0).sum() == 1  # rho = 0: the highest only (3.0)


@pytest.mark.parametrize("rho,coef", [(0.5, 0.0), (0.2, 0.0), (0.5, 0.05)])
@pytest.mark.parametrize("loss_type,preset", [("dapo", "dapo"), ("grpo", "grpo")])
def test_top_entropy_equals_trl(rho, coef, loss_type, preset):
    algo = dataclasses.replace(
        resolve_algo(preset), beta=0.0, eps_high=0.2, top_entropy_quantile=rho, entropy_coef=coef
    )
    ours, (g_ours, e_ours), info = grpolab_loss(LOGP, OLD, ADV, MASK, algo, entropy=ENT)
    me = trl_stand_in(loss_type, 3, coef, top_entropy_quantile=rho)
    theirs, g_theirs, e_theirs = trl_compute(me, LOGP, OLD, ADV, MASK, entropies=ENT)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)
    if coef:
        assert torch.allclose(e_ours * MASK, e_theirs * MASK, atol=1e-7)
    assert info["mask/entropy_dropped_frac"] > 0.4  # the mask dropped tokens: the comparison means something


# --- DeepSeek-V3.2's off-policy sequence mask ----------------------------------------------------------------


def test_off_policy_mask_worked_arithmetic():
    # the sampler's log-probs: the policy's plus 0.3 (seq 0), 0.05 (seq 1), 0.5 (seq 2): mean KL 0.3, 0.05, 0.5
    shift = torch.tensor([[0.3], [0.05], [0.5]])
    adv = torch.tensor([-1.0, -1.0, 2.0])[:, None].expand(3, 3)
    keep = off_policy_mask(adv, LOGP, LOGP + shift, MASK, 0.1)
    # seq 0: A < 0 and KL 0.3 > 0.1 -> dropped; seq 1: KL 0.05 <= 0.1 -> kept; seq 2: A > 0 -> kept whatever its KL
    assert keep[:, 0].tolist() == [0.0, 1.0, 1.0]


def test_off_policy_mask_equals_trl():
    shift = torch.tensor([[0.3, 0.1, 0.2], [0.05, -0.1, 0.0], [0.5, 0.4, 0.0]])
    adv = torch.tensor([1.5, -0.5, -0.7])
    algo = dataclasses.replace(resolve_algo("dapo"), eps_high=0.2, off_policy_mask=0.1)
    ours, (g_ours,), info = grpolab_loss(LOGP, OLD, adv, MASK, algo, sampler_logp=OLD + shift)
    me = trl_stand_in("dapo", 3, off_policy_mask_threshold=0.1)
    theirs, g_theirs, _ = trl_compute(me, LOGP, OLD, adv, MASK, sampler_logp=OLD + shift)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)
    assert torch.all(g_ours[2] == 0) and info["mask/off_policy_dropped_frac"] == pytest.approx(2 / 8)


# --- adaptive entropy ----------------------------------------------------------------------------------------


def test_adaptive_entropy_worked_arithmetic():
    control = AdaptiveEntropy(coef=0.01, coef_min=0.0, coef_max=0.02, delta=0.005, target=0.5)
    assert control.applied == 0.0  # no entropy measured yet (+inf > target)
    assert control.update(0.4) == 0.015 and control.applied == 0.015  # below the target: up, applied
    assert control.update(0.3) == 0.02  # capped at coef_max
    assert control.update(0.9) == 0.015 and control.applied == 0.0  # above: down, not applied
    state = control.state_dict()
    again = AdaptiveEntropy(0.0, 0.0, 1.0, 0.005, 0.5)
    again.load_state_dict(state)
    assert (again.coef, again.applied) == (0.015, 0.0)


def test_adaptive_entropy_equals_trl_over_three_updates():
    """Three optimizer updates (one micro-batch each) of TRL's controller and grpolab's on the same tensors:
    the same loss and entropy gradient each time, the same coefficient after each. The mean entropy over the
    8 valid tokens is 11.4 / 8 = 1.425: with target 1.5 the bonus switches on from the second update."""
    me = trl_stand_in("dapo", 3, 0.05, use_adaptive_entropy=True, entropy_target=1.5, entropy_coef_delta=0.01)
    algo = dataclasses.replace(resolve_algo("dapo"), eps_high=0.2, entropy_coef=0.05, adaptive_entropy=True,
                               entropy_target=1.5, entropy_coef_delta=0.01)  # fmt: skip
    control = AdaptiveEntropy.from_algo(algo)
    applied = []
    for _ in range(3):
        applied.append(control.applied)
        ours, (_, e_ours), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo, entropy=ENT, entropy_coef=control.applied)
        theirs, _, e_theirs = trl_compute(me, LOGP, OLD, ADV, MASK, entropies=ENT)
        assert ours == pytest.approx(theirs, abs=1e-6)
        e_ours = torch.zeros_like(ENT) if e_ours is None else e_ours  # coefficient 0: no entropy term at all
        assert torch.allclose(e_ours * MASK, e_theirs * MASK, atol=1e-7)
        control.update(float((ENT * MASK).sum() / MASK.sum()))
        assert control.coef == pytest.approx(me.entropy_coef, abs=1e-12)
    assert applied == pytest.approx([0.0, 0.06, 0.07])


# --- the sampler correction's lower bound, cispo's cap below 1 -----------------------------------------------


def test_correction_lower_bound_worked_arithmetic():
    # log r = 0.5, -0.5, -1.5 -> r = 1.6487, 0.6065, 0.2231; C = 1.5, C_min = 0.5
    trainer = torch.tensor([[0.5, -0.5, -1.5]])
    zero, mask = torch.zeros(1, 3), torch.ones(1, 3)
    w, clipped = correction_weights(trainer, zero, mask, "token_truncate", 1.5, 0.5)
    assert w[0].tolist() == pytest.approx([1.5, math.exp(-0.5), 0.5], abs=1e-6)
    assert clipped.tolist() == [[True, False, True]]
    w, _ = correction_weights(trainer, zero, mask, "token_mask", 1.5, 0.5)
    assert w[0].tolist() == pytest.approx([0.0, math.exp(-0.5), 0.0], abs=1e-6)
    w, _ = correction_weights(trainer, zero, mask, "token_truncate", 1.5)  # no lower bound: as before
    assert w[0].tolist() == pytest.approx([1.5, math.exp(-0.5), math.exp(-1.5)], abs=1e-6)


def test_cispo_cap_below_one_equals_trl():
    """TRL's cispo at its default epsilon_high (None -> epsilon 0.2) caps every weight at 0.2; the mapping
    gives eps_high = 0.2 - 1 = -0.8 (a cap 1 + eps_high), which the config accepts for cispo only."""
    algo = resolve_algo("cispo", {"eps_low": 1.0, "eps_high": -0.8})
    _, (g_ours,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    _, g_theirs, _ = trl_compute(trl_stand_in("cispo", 3), LOGP, OLD, ADV, MASK)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)
    assert torch.allclose(g_ours, -0.2 * ADV[:, None] * MASK / 8, atol=1e-7)  # w = 0.2 on every token
    with pytest.raises(ConfigError, match="algo.eps_high"):
        resolve_algo("grpo", {"eps_high": -0.8})


def test_new_options_validated():
    for key, bad in [("top_entropy_quantile", 1.5), ("off_policy_mask", -0.1), ("entropy_coef_delta", -1.0)]:
        with pytest.raises(ConfigError, match=f"algo.{key}"):
            resolve_algo("grpo", {key: bad})
    with pytest.raises(ConfigError, match="algo.entropy_coef_min"):
        resolve_algo("grpo", {"entropy_coef_min": 2.0, "entropy_coef_max": 1.0})
    assert AlgoConfig().top_entropy_quantile == 1.0 and AlgoConfig().off_policy_mask is None
