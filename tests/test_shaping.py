"""Reward shaping (grpolab.algo.shaping): the DAPO filter and overlong punishment, KL in the reward, terminal
rewards, and shape_rewards composing them -- worked arithmetic."""

import math

import pytest
import torch

from grpolab.algo.presets import resolve_algo
from grpolab.algo.shaping import informative_groups, kl_token_penalty, overlong_penalty, shape_rewards, terminal_rewards


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


def test_informative_groups():
    # Groups: mixed -> keep; all 1 -> drop; all 0 -> drop; mixed floats -> keep.
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0.6])
    assert informative_groups(r, 4).tolist() == [True, False, False, True]
    # G = 1: every group is unanimous, nothing is informative.
    assert informative_groups(torch.tensor([1.0, 0.0]), 1).tolist() == [False, False]
    # 0.1 three times: equal rewards, although their float mean is not exactly 0.1
    assert informative_groups(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), 3).tolist() == [False]
    with pytest.raises(ValueError, match="groups of G=3"):
        informative_groups(torch.zeros(4), 3)


def test_overlong_penalty():
    # L_max = 20, L_cache = 5 -> no penalty up to 15 tokens, then (15 - |y|) / 5 down to -1 at 20.
    lengths = torch.tensor([10, 15, 16, 18, 20, 25])
    # 10 -> 0; 15 -> 0; 16 -> -1/5 = -0.2; 18 -> -3/5 = -0.6; 20 -> -5/5 = -1; 25 (> L_max) -> -1.
    assert close(overlong_penalty(lengths, 20, 5, 1.0), [0, 0, -0.2, -0.6, -1.0, -1.0])
    assert close(overlong_penalty(lengths, 20, 5, 0.5), [0, 0, -0.1, -0.3, -0.5, -0.5])
    assert close(overlong_penalty(lengths, 20, 0, 1.0), torch.zeros(6))  # off
    assert (overlong_penalty(torch.arange(0, 40), 32, 6) <= 0).all()
    with pytest.raises(ValueError, match="longer than max_len"):
        overlong_penalty(lengths, 20, 21, 1.0)


def test_kl_token_penalty():
    # tokens: (0.5 vs 0.25) -> k3 = 0.25/0.5... lr = log(0.25/0.5) = -log 2, k3 = 0.5 + log 2 - 1 = 0.193147;
    # (0.5 vs 0.5) -> 0; padding (garbage) -> 0.
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.001]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    k3 = 0.5 + math.log(2) - 1
    pen, k = kl_token_penalty(logp.requires_grad_(True), ref, mask, 0.1, "k3")
    assert close(pen, [[0.1 * k3, 0.0, 0.0]]) and close(k, [[k3, 0.0, 0.0]])
    assert not pen.requires_grad


def test_terminal_rewards():
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])
    out = terminal_rewards(torch.tensor([1.0, 0.5, 2.0]), mask)
    assert out.tolist() == [[0, 0, 1.0], [0, 0.5, 0], [0, 0, 0]]  # an empty completion gets no reward token


def test_shape_rewards_composes_overlong_and_kl_in_reward():
    # Two completions of lengths 3 and 2, limit 3 with a buffer of 1: length 3 is in the buffer ->
    # penalty (2 - 3) / 1 = -1; length 2 -> 0. KL in the reward, k1 = logp - ref per token, beta 0.5.
    algo = resolve_algo("rloo", {"overlong_buffer": 1, "beta": 0.5})  # rloo: k1, in_reward
    raw = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -1.0], [-1.0, -2.0, 9.0]])
    # k1 per token: [0.5, 0, 0], [-1, 0, (pad) 0]; sums 0.5 and -1; times beta: 0.25 and -0.5
    shaped = shape_rewards(raw, mask.sum(-1), mask, algo, max_len=3, beta=0.5, policy_logp=logp, ref_logp=ref)
    assert close(shaped.reward, [1.0 - 1.0 - 0.25, 0.0 + 0.0 + 0.5])
    # per token: terminal (raw + overlong) on the last token, minus beta * k_t everywhere
    assert close(shaped.token_reward, [[-0.25, 0, 0.0], [0.5, 0.0, 0]])
    assert close(shaped.token_reward.sum(-1), shaped.reward)  # the same total, spread over tokens
    assert shaped.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.5)
    assert shaped.metrics["kl"] == pytest.approx((0.5 - 1.0) / 5)  # mean k over the 5 valid tokens
    assert raw.tolist() == [1.0, 0.0]  # the verifier's reward is never overwritten


def test_shape_rewards_without_shaping_is_the_raw_reward():
    algo = resolve_algo("grpo", {})  # KL in the loss, no overlong
    raw = torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 2)
    shaped = shape_rewards(raw, mask.sum(-1), mask, algo, max_len=4, beta=0.04, ref_logp=torch.zeros(2, 2))
    assert torch.equal(shaped.reward, raw) and shaped.metrics == {}
    with pytest.raises(ValueError, match="policy's log-probs"):
        shape_rewards(
            raw,
            mask.sum(-1),
            mask,
            resolve_algo("rloo", {"beta": 0.1}),
            max_len=4,
            beta=0.1,
            ref_logp=torch.zeros(2, 2),
        )
