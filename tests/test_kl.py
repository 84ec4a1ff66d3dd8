"""KL estimators k1/k2/k3: arithmetic, sign, overflow, unbiasedness against an exact categorical KL,
what their gradients estimate, the reward placement, and the adaptive beta controller."""

import math

import pytest
import torch

from grpolab.algo.kl import KL_ESTIMATORS, AdaptiveKL, kl_per_token
from grpolab.algo.presets import resolve_algo

# A small categorical pair: pi_theta and pi_ref over 5 outcomes.
PI = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08], dtype=torch.float64)
REF = torch.tensor([0.10, 0.20, 0.30, 0.25, 0.15], dtype=torch.float64)
KL_EXACT = float((PI * (PI / REF).log()).sum())  # KL(pi || ref) = sum pi log(pi / ref) = 0.3276...


def test_worked_arithmetic():
    # pi_theta(y) = 0.5, pi_ref(y) = 0.25: lr = log(0.25 / 0.5) = -log 2 = -0.693147
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    l2 = math.log(2)
    assert KL_ESTIMATORS["k1"](logp, ref).item() == pytest.approx(l2)  # k1 = -lr = 0.693147
    assert KL_ESTIMATORS["k2"](logp, ref).item() == pytest.approx(l2**2 / 2)  # lr^2/2 = 0.240227
    assert KL_ESTIMATORS["k3"](logp, ref).item() == pytest.approx(0.5 + l2 - 1)  # e^lr - lr - 1 = 0.193147
    # the other way round, lr = +log 2: k1 = -0.693 (negative!), k3 = 2 - 0.693 - 1 = 0.306853
    assert KL_ESTIMATORS["k1"](ref, logp).item() == pytest.approx(-l2)
    assert KL_ESTIMATORS["k3"](ref, logp).item() == pytest.approx(2 - l2 - 1)


def test_k3_non_negative_and_clamped():
    lr = torch.cat([torch.linspace(-50, 50, 2001), torch.tensor([-1e4, 1e4, 0.0])])
    logp = torch.zeros_like(lr)
    k3 = KL_ESTIMATORS["k3"](logp, lr)  # ref_logp = lr
    assert (k3 >= 0).all() and torch.isfinite(k3).all()
    assert k3[-1] == 0.0  # identical policies: exactly 0
    # lr = 1e4 is clamped to 20 before exp: e^20 - 20 - 1, finite in fp32
    assert k3[-2].item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert (KL_ESTIMATORS["k2"](logp, lr) >= 0).all()


def sample_lr(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.multinomial(PI, n, replacement=True, generator=g)  # samples from pi_theta
    return PI.log()[a], REF.log()[a]  # logp, ref_logp per sample


@pytest.mark.parametrize("name", ["k1", "k3"])
def test_unbiased_estimate_of_exact_kl(name):
    # Monte-Carlo mean over n = 200k samples from pi_theta vs the exact KL(pi_theta || pi_ref).
    # Tolerance: 5 standard errors, SE = sample std / sqrt(n), computed from the samples themselves
    # (a correct estimator fails this with probability ~6e-7).
    logp, ref = sample_lr(200_000)
    k = KL_ESTIMATORS[name](logp, ref)
    mean, se = k.mean().item(), (k.std() / math.sqrt(k.numel())).item()
    assert abs(mean - KL_EXACT) < 5 * se, (mean, KL_EXACT, se)
    # and exactly, by enumeration: E_pi[k] = sum_a pi(a) k(a)
    k_all = KL_ESTIMATORS[name](PI.log(), REF.log())
    assert (PI * k_all).sum().item() == pytest.approx(KL_EXACT, abs=1e-12)


def test_k2_is_biased_and_the_test_can_tell():
    # k2 = lr^2/2 matches KL only to second order: its exact mean differs, and the 5-SE test detects it.
    logp, ref = sample_lr(200_000)
    k = KL_ESTIMATORS["k2"](logp, ref)
    mean, se = k.mean().item(), (k.std() / math.sqrt(k.numel())).item()
    assert abs(mean - KL_EXACT) > 5 * se
    exact_mean = (PI * KL_ESTIMATORS["k2"](PI.log(), REF.log())).sum().item()
    assert exact_mean != pytest.approx(KL_EXACT, abs=1e-3)


def test_k3_variance_below_k1():
    logp, ref = sample_lr(50_000)
    assert KL_ESTIMATORS["k3"](logp, ref).var() < KL_ESTIMATORS["k1"](logp, ref).var()


def test_what_the_gradients_estimate():
    # As loss terms on tokens sampled from pi_theta (gradient only through log pi_theta(a), not through
    # the sampling), by exact enumeration E_a[grad k(a)] = sum_a pi(a) grad k(a):
    #   k1 -> 0 (the score has mean zero), k2 -> grad KL(pi || ref), k3 -> grad KL(ref || pi).
    theta = PI.log().clone().requires_grad_(True)

    def expected_grad(name):
        logp = torch.log_softmax(theta, 0)
        k = KL_ESTIMATORS[name](logp, REF.log())
        (g,) = torch.autograd.grad((logp.exp().detach() * k).sum(), theta)
        return g

    def grad_of(f):
        (g,) = torch.autograd.grad(f(torch.log_softmax(theta, 0)), theta)
        return g

    forward = grad_of(lambda lp: (lp.exp() * (lp - REF.log())).sum())  # grad KL(pi || ref)
    reverse = grad_of(lambda lp: (REF * (REF.log() - lp)).sum())  # grad KL(ref || pi)
    assert torch.allclose(expected_grad("k1"), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(expected_grad("k2"), forward, atol=1e-12)
    assert torch.allclose(expected_grad("k3"), reverse, atol=1e-12)


def test_padding_never_leaks_and_unknown_estimator():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.001]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    nan_pad = torch.tensor([[math.log(0.5), math.log(0.5), float("nan")]])
    assert torch.isfinite(kl_per_token(nan_pad, ref, mask, "k3")).all()
    with pytest.raises(ValueError, match="known: k1, k2, k3"):
        kl_per_token(logp, ref, mask, "k4")


def test_adaptive_kl_controller():
    # Ziegler et al.: e = clip(kl/target - 1, -0.2, 0.2); beta *= 1 + e * n / H.
    ctl = AdaptiveKL(0.1, target=0.01, horizon=100)
    # kl = 0.02 -> e = clip(1, -0.2, 0.2) = 0.2 -> beta = 0.1 * (1 + 0.2 * 10 / 100) = 0.102
    assert ctl.update(0.02, 10) == pytest.approx(0.102)
    # kl = 0.009 -> e = -0.1 -> beta = 0.102 * (1 - 0.1 * 10 / 100) = 0.10098
    assert ctl.update(0.009, 10) == pytest.approx(0.10098)
    state = ctl.state_dict()
    other = AdaptiveKL(1.0)
    other.load_state_dict(state)
    assert other.value == pytest.approx(0.10098) and other.adaptive
    fixed = AdaptiveKL(0.04)
    assert fixed.update(5.0, 100) == 0.04 and not fixed.adaptive
    ppo = AdaptiveKL.from_algo(resolve_algo("ppo", {"adaptive_kl": True, "kl_target": 0.5}))
    assert ppo.adaptive and ppo.value == 0.05 and ppo.target == 0.5
