"""Proof by Monte Carlo: the policy-gradient estimators built from grpolab's own advantage and loss
functions have the expectation the theory says, and a baseline lowers their variance.

Two policies whose exact gradient of J(theta) = E_{y ~ pi_theta}[R(y)] is computable in closed form by
enumeration (J = sum_y pi_theta(y) R(y), differentiated by autograd):

  * the lab's softmax bandit (grpolab.app.lab.bandit: 6 arms, Bernoulli rewards, shifted by 10 here so that
    baselines matter), and
  * a fixed-length (L = 3) autoregressive token-sequence policy over a 3-token vocabulary, each token's
    logits depending on its position and the previous token (27 sequences).

Each estimate is what the trainer computes, through the lab's own estimator
(grpolab.app.lab.bandit.gradient_estimates): rewards -> compute_advantages -> policy_loss (objective pg,
aggregation seq_sum, on-policy) -> minus the gradient. M independent batches of N samples are evaluated
at once by giving every batch its own copy of theta, so one backward pass yields M estimates.

Tolerance: per coordinate, |mean of M estimates - expected| < 5 standard errors, SE = (sample std of
the M estimates) / sqrt(M), computed from the samples themselves. Under the CLT a correct estimator
fails one coordinate with probability ~5.7e-7, all coordinates (<= 36) together < 3e-5; seeds are fixed.

Expected values:
  * none (REINFORCE, A = r) and rloo (leave-one-out baseline): exactly grad J -- unbiased.
  * batch_mean and group_mean (a mean that includes the sample itself): exactly (1 - 1/N) grad J,
    because E[(r_i - (1/N) sum_j r_j) grad log pi(y_i)] = (1 - 1/N) E[r_i grad log pi(y_i)]
    - (1/N) sum_{j != i} E[r_j] E[grad log pi(y_i)] and the last expectation is 0. With N = 4 that is a
    25% shrink, which the same 5-SE test detects (test_the_test_has_power).
  group_zscore (GRPO) divides by a std that depends on the sample too; it estimates a rescaled,
  reweighted gradient and is not claimed unbiased here.
"""

import pytest
import torch

from grpolab.app.lab import bandit

DT = torch.float64
M, N = 4000, 4  # batches, samples per batch (one prompt, so the batch is the group: G = N)
FACTOR = {"none": 1.0, "rloo": 1.0, "batch_mean": 1 - 1 / N, "group_mean": 1 - 1 / N}


# --- the two policies ----------------------------------------------------------------------------------

OFFSET = 10.0  # a large common reward offset: baselines matter


def bandit_exact_grad() -> torch.Tensor:
    return bandit.exact_grad(mean_r=bandit.mean_rewards(OFFSET))  # (K,)


def bandit_batches(gen: torch.Generator):
    """M batches of N arms: per-batch params (M, K) leaf, token logp (M*N, 1), rewards (M*N,)."""
    return bandit.sample(M, N, gen, offset=OFFSET)


L, V = 3, 3
BOS = V  # previous-token index at t = 0
SEQ_THETA = torch.linspace(-1.0, 1.0, L * (V + 1) * V, dtype=DT).reshape(L, V + 1, V).sin()  # (L, V+1, V)
TARGET = torch.tensor([2, 0, 1])


def seq_reward(y: torch.Tensor) -> torch.Tensor:
    """R(y) = 5 + number of positions matching TARGET + 2 if the whole sequence matches. y: (..., L)."""
    match = (y == TARGET).to(DT)  # (..., L)
    return 5.0 + match.sum(-1) + 2.0 * match.prod(-1)


def seq_logp(theta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Token log-probs of sequences y (..., L) under per-(position, previous token) logits theta (L, V+1, V)."""
    prev = torch.cat([torch.full_like(y[..., :1], BOS), y[..., :-1]], -1)  # (..., L)
    logits = theta[torch.arange(L), prev]  # (..., L, V)
    return torch.log_softmax(logits, -1).gather(-1, y[..., None]).squeeze(-1)  # (..., L)


def seq_exact_grad() -> torch.Tensor:
    theta = SEQ_THETA.clone().requires_grad_(True)
    ys = torch.cartesian_prod(*[torch.arange(V)] * L)  # (27, L) every sequence
    J = (seq_logp(theta, ys).sum(-1).exp() * seq_reward(ys)).sum()  # sum_y pi(y) R(y)
    (g,) = torch.autograd.grad(J, theta)
    return g.reshape(-1)


def seq_batches(gen: torch.Generator):
    theta = SEQ_THETA.expand(M, -1, -1, -1).clone().requires_grad_(True)  # (M, L, V+1, V)
    prev = torch.full((M, N), BOS)
    ys = []
    for t in range(L):  # ancestral sampling, token by token
        logits = theta.detach()[torch.arange(M)[:, None], t, prev]  # (M, N, V)
        y_t = torch.multinomial(torch.softmax(logits, -1).reshape(M * N, V), 1, generator=gen).reshape(M, N)
        ys.append(y_t)
        prev = y_t
    y = torch.stack(ys, -1)  # (M, N, L)
    prev = torch.cat([torch.full_like(y[..., :1], BOS), y[..., :-1]], -1)  # (M, N, L)
    logits = theta[torch.arange(M)[:, None, None], torch.arange(L), prev]  # (M, N, L, V)
    logp = torch.log_softmax(logits, -1).gather(-1, y[..., None]).squeeze(-1)  # (M, N, L)
    return theta, logp.reshape(M * N, L), seq_reward(y).reshape(M * N)


POLICIES = {"bandit": (bandit_exact_grad, bandit_batches), "sequence": (seq_exact_grad, seq_batches)}


# --- the estimator under test: grpolab's own functions ---------------------------------------------------


def estimates(policy: str, advantage: str, seed: int = 0) -> torch.Tensor:
    """(M, P): one policy-gradient estimate per batch (grpolab.app.lab.bandit.gradient_estimates)."""
    gen = torch.Generator().manual_seed(seed)
    theta, logp, r = POLICIES[policy][1](gen)
    est, _ = bandit.gradient_estimates(theta, logp, r, advantage, N)
    return est


@pytest.fixture(scope="module")
def all_estimates():
    return {(p, a): estimates(p, a) for p in POLICIES for a in FACTOR}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("advantage", sorted(FACTOR))
def test_mean_matches_the_exact_gradient(all_estimates, policy, advantage):
    exact = POLICIES[policy][0]()
    est = all_estimates[(policy, advantage)]
    z = bandit.z_scores(est, FACTOR[advantage] * exact)
    assert z.abs().max() < 5, f"{advantage} on {policy}: max |z| = {z.abs().max():.2f}"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_test_has_power(all_estimates, policy):
    # The batch-mean estimator is off by the factor (1 - 1/N) = 0.75: compared with the exact gradient
    # itself, the same 5-SE criterion rejects it -- so the tolerance above is tight enough to see bias.
    exact = POLICIES[policy][0]()
    assert bandit.z_scores(all_estimates[(policy, "batch_mean")], exact).abs().max() > 5


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_baseline_lowers_variance(all_estimates, policy):
    # Total variance (trace of the covariance of the M estimates). The rewards share a large offset
    # (OFFSET = 10 for the bandit, 5 for sequences), which REINFORCE without a baseline pays for in variance.
    # With M = 4000 the relative sampling error of each variance is about sqrt(2/M) ~ 2%, so a ratio
    # below 0.5 is a measured difference, not noise.
    total_var = {a: all_estimates[(policy, a)].var(0).sum().item() for a in FACTOR}
    for baseline in ("rloo", "batch_mean", "group_mean"):
        assert total_var[baseline] < 0.5 * total_var["none"], total_var
