"""PPO's advantage maths over a critic's values: GAE(gamma, lambda), whitening and the clipped value loss.
Pure functions over tensors; the critic model that produces the values is grpolab.model.critic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from grpolab.algo.losses import masked_mean

if TYPE_CHECKING:  # the settings type only
    from grpolab.algo.presets import AlgoConfig


def completion_values(values: Tensor, prompt_len: int, T: int) -> Tensor:
    """Values of the states before each completion token: values[:, P-1 : P-1+T] -> (B, T).

    Assumes every prompt is left-padded to the common width P = prompt_len and completions start at P.
    """
    return values[:, prompt_len - 1 : prompt_len - 1 + T]  # (B, T)


@torch.no_grad()
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eqs. 11-16), over completion tokens:

        delta_t = r_t + gamma * V_{t+1} - V_t              (V after the last valid token = 0: terminal)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                                (the value target: TD(lambda) return)

    lam = 1: A_t = sum_{k>=t} gamma^(k-t) r_k - V_t (Monte-Carlo); lam = 0: A_t = delta_t (one-step TD).
    With a terminal reward and gamma = lam = 1, A_t = r_final - V_t.
    token_rewards, values, mask: (b, T). Returns (adv, returns), (b, T) each, 0 on padding.

    A mask with holes (a multi-turn trajectory: environment tokens between the model's turns) is
    computed over the model's tokens only, in order: t+1 is the model's next token, so the value after
    a turn is the value at the start of the next one (the environment's reply is part of the
    transition), and the final reward reaches every turn. Contiguous masks are unchanged bit for bit.
    """
    order = torch.argsort((mask <= 0).to(torch.int8), dim=1, stable=True)  # (b, T) valid positions first
    if not bool((order == torch.arange(mask.shape[1], device=mask.device)).all()):
        adv_c, ret_c = gae(token_rewards.gather(1, order), values.gather(1, order), mask.gather(1, order), gamma, lam)
        return (torch.zeros_like(adv_c).scatter(1, order, adv_c), torch.zeros_like(ret_c).scatter(1, order, ret_c))
    mask = mask.float()
    valid = mask > 0  # (b, T)
    rew = torch.where(valid, token_rewards.float(), torch.zeros_like(mask))  # (b, T)
    val = torch.where(valid, values.float(), torch.zeros_like(mask))  # (b, T)
    b, T = mask.shape
    adv = torch.zeros_like(mask)  # (b, T)
    last = torch.zeros(b, dtype=mask.dtype, device=mask.device)  # (b,) A_{t+1}
    for t in reversed(range(T)):
        next_valid = mask[:, t + 1] if t + 1 < T else torch.zeros_like(last)  # (b,)
        next_value = val[:, t + 1] if t + 1 < T else torch.zeros_like(last)  # (b,)
        delta = rew[:, t] + gamma * next_value * next_valid - val[:, t]  # (b,)
        last = (delta + gamma * lam * next_valid * last) * mask[:, t]  # (b,)
        adv[:, t] = last
    returns = torch.where(valid, adv + val, torch.zeros_like(adv))  # (b, T)
    return adv, returns


@torch.no_grad()
def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over valid tokens (population variance), 0 on padding -- PPO's advantage
    normalisation (OpenAI baselines, CleanRL norm_adv, TRL masked_whiten)."""
    mask = mask.float()
    valid = mask > 0  # (b, T)
    n = mask.sum().clamp(min=1)
    xv = torch.where(valid, x.float(), torch.zeros_like(mask))  # (b, T)
    mean = xv.sum() / n
    var = (torch.where(valid, xv - mean, torch.zeros_like(mask)) ** 2).sum() / n
    out = (xv - mean) * torch.rsqrt(var + eps)  # (b, T)
    if not shift_mean:
        out = out + mean
    return torch.where(valid, out, torch.zeros_like(out))  # (b, T)


@torch.no_grad()
def ppo_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, Tensor]:
    """PPO advantages for the whole batch (not per micro-batch: whitening is a batch statistic):

        adv, returns = gae(token rewards, values, mask, algo.gamma, algo.lam)
        adv          = whiten(adv) if algo.adv_scale == "batch_std"

    token_rewards (b, T): the shaped per-token rewards (grpolab.algo.shaping: terminal reward on the last
    token, minus beta * k_t with the KL in the reward); values (b, T) from the critic before the
    update (old values), mask (b, T). Returns (adv, returns), (b, T) each; returns are the value
    targets (computed before whitening).
    """
    adv, returns = gae(token_rewards, values, mask, algo.gamma, algo.lam)  # (b, T) each
    if algo.adv_scale == "batch_std":
        adv = whiten(adv, mask)  # (b, T)
    elif algo.adv_scale != "none":
        raise ValueError(f"adv_scale {algo.adv_scale!r} does not apply to per-token GAE advantages")
    return adv, returns


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None, *, n_tok: int | None = None
) -> tuple[Tensor, dict[str, float]]:
    """PPO value loss, optionally clipped (PPO2 / baselines; Schulman et al. 2017 code):

        L_V = 1/2 * max( (V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2 )     (c = clip; no clip: 1/2 (V - R)^2)

    summed over valid tokens / n_tok (tokens of the whole optimizer batch, so micro-batch losses add
    up; default: this micro-batch's valid tokens). values (b, T) with grad, old_values / returns
    (b, T) detached. The trainer scales it by algo.vf_coef.
    Metrics (means over this micro-batch's valid tokens): value/loss, value/clip_frac, value/mean,
    value/error (mean |V - R|).
    """
    mask = mask.float()
    valid = mask > 0  # (b, T)
    n_tok = max(int(valid.sum().item()), 1) if n_tok is None else max(int(n_tok), 1)
    values = torch.where(valid, values.float(), torch.zeros_like(mask))  # (b, T)
    old_values = torch.where(valid, old_values.detach().float(), torch.zeros_like(mask))  # (b, T)
    returns = torch.where(valid, returns.detach().float(), torch.zeros_like(mask))  # (b, T)
    loss_unclipped = (values - returns) ** 2  # (b, T)
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (b, T)
        loss_clipped = (v_clipped - returns) ** 2  # (b, T)
        clipped = loss_clipped > loss_unclipped  # (b, T) the max picked the clipped term
        loss_tok = 0.5 * torch.maximum(loss_unclipped, loss_clipped)  # (b, T)
    else:
        clipped = torch.zeros_like(valid)
        loss_tok = 0.5 * loss_unclipped  # (b, T)
    loss_tok = torch.where(valid, loss_tok, torch.zeros_like(loss_tok))  # (b, T)
    loss = loss_tok.sum() / n_tok
    metrics = {
        "value/loss": masked_mean(loss_tok.detach(), mask),
        "value/clip_frac": masked_mean(clipped, mask),
        "value/mean": masked_mean(values.detach(), mask),
        "value/error": masked_mean((values.detach() - returns).abs(), mask),
    }
    return loss, metrics
