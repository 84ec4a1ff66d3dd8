"""Advantage estimators: worked arithmetic, G = 1, the group baseline component."""

import pytest
import torch

from grpolab.algo.advantages import ADVANTAGES, compute_advantages, group_std
from grpolab.algo.presets import AlgoConfig, resolve_algo

# Two groups of G = 4: one mixed (two right, two wrong), one unanimous (all right).
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
G = 4


def algo(advantage: str, adv_scale: str = "none", adv_eps: float = 1e-4) -> AlgoConfig:
    return AlgoConfig(advantage=advantage, adv_scale=adv_scale, adv_eps=adv_eps)


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


def test_none_is_the_reward():
    # REINFORCE: A = r, untouched.
    assert close(compute_advantages(R, G, algo("none")), R)


def test_batch_mean():
    # mean over all 8 rewards = 6/8 = 0.75 -> A = r - 0.75 = 0.25 (right) or -0.75 (wrong).
    expected = [0.25, -0.75, -0.75, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert close(compute_advantages(R, G, algo("batch_mean")), expected)


def test_rloo():
    # group 0 sums to 2. Sample 0 (r=1): others are {0, 0, 1}, mean 1/3 -> A = 1 - 1/3 = 2/3.
    # Sample 1 (r=0): others are {1, 0, 1}, mean 2/3 -> A = -2/3. Group 1: others all 1 -> A = 0.
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0]
    assert close(compute_advantages(R, G, algo("rloo")), expected)


def test_rloo_is_group_mean_times_G_over_G_minus_1():
    # r_i - (S - r_i)/(G-1) = (G r_i - S)/(G-1) = G/(G-1) (r_i - S/G).
    r = torch.randn(24)
    for g in (2, 3, 4, 6):
        group_mean = compute_advantages(r, g, algo("group_mean"))
        assert close(compute_advantages(r, g, algo("rloo")), g / (g - 1) * group_mean, 1e-5)


def test_group_mean():
    # Dr. GRPO: group 0 mean 0.5 -> A = +-0.5; group 1 mean 1 -> A = 0.
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]
    assert close(compute_advantages(R, G, algo("group_mean")), expected)


def test_group_zscore():
    # GRPO: group 0 population std of {1,0,0,1} = 0.5 -> A = +-0.5 / (0.5 + 1e-4) = +-0.99980004.
    # Group 1: std 0 -> A = 0 / (0 + 1e-4) = 0 (no NaN).
    a = 0.5 / (0.5 + 1e-4)
    expected = [a, -a, -a, a, 0, 0, 0, 0]
    assert close(compute_advantages(R, G, algo("group_zscore")), expected)


def test_group_mean_with_group_std_scale_is_group_zscore():
    r = torch.randn(32)
    zscore = compute_advantages(r, 8, algo("group_zscore"))
    assert close(compute_advantages(r, 8, algo("group_mean", "group_std")), zscore)


def test_batch_std_scale():
    # Batch std of R: mean 0.75, variance 0.75 * 0.25 = 0.1875, std = 0.4330127.
    # group_mean / (batch std + eps): 0.5 / 0.4331127 = 1.1544389.
    a = 0.5 / (0.1875**0.5 + 1e-4)
    expected = [a, -a, -a, a, 0, 0, 0, 0]
    assert close(compute_advantages(R, G, algo("group_mean", "batch_std")), expected)


def test_dr_grpo_equals_grpo_times_group_std():
    # (r - mean) = (std + eps) * (r - mean) / (std + eps), group by group.
    r = torch.rand(40)
    grpo = compute_advantages(r, 5, resolve_algo("grpo", {}))
    dr = compute_advantages(r, 5, resolve_algo("dr_grpo", {}))
    assert close(dr, grpo * (group_std(r, 5) + 1e-4), 1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_g1_gives_zero_group_advantage_and_no_nan(name):
    r = torch.tensor([1.0, 0.0, 0.5, 1.0])
    adv = compute_advantages(r, 1, algo(name))
    assert torch.isfinite(adv).all()
    if name in ("group_mean", "group_zscore", "rloo"):
        # G = 1: the sample is its own group mean (and has no "others"): no signal.
        assert torch.equal(adv, torch.zeros(4))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_integer_rewards_and_no_grad(name):
    adv = compute_advantages(torch.tensor([1, 0, 1, 1]), 2, algo(name))
    assert adv.dtype == torch.float32 and not adv.requires_grad


def test_bad_group_size_and_gae():
    with pytest.raises(ValueError, match="groups of G=3"):
        compute_advantages(torch.zeros(8), 3, algo("group_zscore"))
    with pytest.raises(ValueError, match="critic"):
        compute_advantages(torch.zeros(8), 4, resolve_algo("ppo", {}))
