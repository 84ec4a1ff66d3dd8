"""An exact-gradient softmax bandit for measuring policy-gradient estimators.

Policy pi_theta = softmax(theta) over K arms; arm a pays a Bernoulli reward with success probability
p_a (a verifiable 0/1 reward, optionally shifted by a constant offset). J(theta) = sum_a pi(a) E[R | a]
is known in closed form, so its gradient is exact (autograd through the sum, no sampling).

Each Monte-Carlo estimate is what the trainer computes: rewards -> compute_advantages -> policy_loss
(objective pg, aggregation seq_sum, on-policy) -> minus the gradient. M independent batches of G samples
(one prompt, so the batch is the group) are evaluated at once by giving every batch its own copy of
theta: one backward pass yields M estimates.
"""

from __future__ import annotations

import math

import torch

from grpolab.algo.advantages import compute_advantages
from grpolab.algo.losses import policy_loss
from grpolab.algo.presets import resolve_algo

DT = torch.float64
THETA = torch.tensor([0.4, -0.3, 0.1, 0.6, -0.5, 0.0], dtype=DT)  # 6 arms, fixed logits
P_SUCCESS = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.2, 0.9], dtype=DT)  # Bernoulli reward per arm


def mean_rewards(offset: float = 0.0) -> torch.Tensor:
    return P_SUCCESS + offset


def exact_grad(theta: torch.Tensor = THETA, mean_r: torch.Tensor | None = None) -> torch.Tensor:
    """grad_theta of J = sum_a softmax(theta)_a * E[R|a], exactly (K,)."""
    mean_r = mean_rewards() if mean_r is None else mean_r
    th = theta.clone().requires_grad_(True)
    J = (torch.softmax(th, 0) * mean_r).sum()
    (g,) = torch.autograd.grad(J, th)
    return g


def sample(M: int, G: int, gen: torch.Generator, theta: torch.Tensor = THETA, offset: float = 0.0):
    """M batches of G arms. Returns per-batch params (M, K) leaf, token logp (M*G, 1), rewards (M*G,)."""
    th = theta.expand(M, -1).clone().requires_grad_(True)  # (M, K) one copy per batch
    logp_all = torch.log_softmax(th, -1)  # (M, K)
    a = torch.multinomial(logp_all.detach().exp(), G, replacement=True, generator=gen)  # (M, G)
    logp = logp_all.gather(1, a).reshape(M * G, 1)  # (M*G, T=1)
    u = torch.rand(M, G, generator=gen, dtype=DT)
    r = (u < P_SUCCESS[a]).to(DT) + offset  # (M, G)
    return th, logp, r.reshape(M * G)


def gradient_estimates(
    theta: torch.Tensor, logp: torch.Tensor, r: torch.Tensor, advantage: str, G: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's estimator on M batches of G samples: rewards -> compute_advantages -> policy_loss
    (objective pg, aggregation seq_sum, on-policy) -> minus the gradient.

    theta: the leaf whose first dimension is the batch (M, ...); logp (M*G, T) token log-probs built
    from it; r (M*G,). Returns ((M, P) estimates, one per batch, and the advantages (M*G,)).
    """
    algo = resolve_algo(
        "grpo", {"advantage": advantage, "adv_scale": "none", "objective": "pg", "aggregation": "seq_sum", "beta": 0.0}
    )
    M = theta.shape[0]
    if advantage == "batch_mean":  # the batch is one group of G: compute batch by batch
        adv = torch.cat([compute_advantages(r_m, G, algo) for r_m in r.view(M, G)])
    else:  # group-level estimators: the M groups of G are independent in one call
        adv = compute_advantages(r, G, algo)  # (M*G,)
    mask = torch.ones_like(logp)
    # n_seq = G: each batch's loss is its own mean; the sum over the M batches is one backward pass.
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, algo, n_seq=G, n_tok=G * logp.shape[1], max_len=logp.shape[1])
    (g,) = torch.autograd.grad(loss, theta)
    return -g.reshape(M, -1).to(DT), adv.to(DT)  # loss = -J estimate


def estimates(advantage: str, M: int, G: int, seed: int = 0, offset: float = 0.0):
    """(M, K) policy-gradient estimates on the bandit, one per batch, and the advantages (M*G,)."""
    gen = torch.Generator().manual_seed(seed)
    th, logp, r = sample(M, G, gen, offset=offset)
    return gradient_estimates(th, logp, r, advantage, G)


def z_scores(est: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per coordinate (mean of the estimates - expected) / standard error of the mean."""
    se = est.std(0) / math.sqrt(est.shape[0])
    return (est.mean(0) - expected) / se.clamp(min=1e-12)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a @ b) / (a.norm() * b.norm()).clamp(min=1e-30))
