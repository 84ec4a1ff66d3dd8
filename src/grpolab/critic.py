"""PPO's critic: a value model, GAE advantages and the (clipped) value loss.

PPO (Schulman et al. 2017) for language models (Ziegler et al. 2019; Ouyang et al. 2022) learns
V_phi(s_t), the expected final reward from the state s_t = (prompt, y_<t), and turns the single
verifiable reward at the end of a completion into per-token advantages with GAE (Schulman et al. 2016).
The price is a second network as large as the policy's backbone, with its own gradients and optimiser
state -- the memory that GRPO saves by using the group mean as the baseline instead
(docs/algorithms.md, "Memory").

How the trainer calls it (one step, PPO):

    critic = ValueModel(policy)                                   # once; deep copy + value head
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=algo.critic_lr or lr)
    ...rollout: input_ids (b, P+T) = left-padded prompt of width P + right-padded completion,
               attention_mask (b, P+T), completion mask (b, T), rewards r (b,), old_logp (b, T)
    with torch.no_grad():
        old_values = completion_values(critic(input_ids, attention_mask), P, T)          # (b, T)
        pen = kl_token_penalty(old_logp, ref_logp, mask, beta, algo.kl_estimator)        # if in_reward
    adv, returns = ppo_advantages(r, old_values, mask, algo, token_penalty=pen)          # (b, T) each
    for each of algo.mu epochs, for each micro-batch:
        values = completion_values(critic(ids, am), P, T)                                 # (b, T) grad
        vloss, vinfo = value_loss(values, old_values, returns, mask, algo.value_clip, n_tok=n_tok)
        (algo.vf_coef * vloss).backward()          # critic grads only
        ploss, pinfo = policy_loss(logp, old_logp, adv, mask, algo, n_seq=.., n_tok=.., max_len=..)
        ploss.backward()                           # policy grads only
    critic_opt.step(); policy_opt.step()
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from grpolab.algos import AlgoConfig


def _backbone(policy: nn.Module) -> nn.Module:
    """The transformer under the LM head: model.model for Llama/Qwen/SmolLM, model.transformer for GPT-2."""
    if hasattr(policy, "get_base_model"):  # a PEFT wrapper
        policy = policy.get_base_model()
    prefix = getattr(policy, "base_model_prefix", "model")
    backbone = getattr(policy, prefix, None) or getattr(policy, "model", None)
    if backbone is None:
        raise ValueError(f"cannot find the transformer backbone of {type(policy).__name__} (looked for .{prefix})")
    return backbone


def _hidden_size(policy: nn.Module) -> int:
    cfg = policy.config
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    for key in ("hidden_size", "n_embd", "d_model"):
        if hasattr(cfg, key):
            return int(getattr(cfg, key))
    raise ValueError(f"cannot find the hidden size in {type(policy.config).__name__}")


class ValueModel(nn.Module):
    """V_phi: a deep copy of the policy's transformer backbone plus a scalar head nn.Linear(hidden, 1).

    Initialised from the policy's weights (as in Ouyang et al. 2022, where the value function starts
    from the reward model; here there is no reward model, so from the policy). The head is fp32 and
    zero-initialised: V starts at 0, so the first advantages are the returns themselves.
    The copy shares nothing with the policy; all of its parameters are trainable.

    forward(input_ids (B, L), attention_mask (B, L)) -> values (B, L) float32, where values[:, j] is the
    value of the prefix input_ids[:, :j+1] -- the same alignment as logits, so the value of the state
    before completion token t (at position P + t) is values[:, P + t - 1]: see completion_values.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.backbone = copy.deepcopy(_backbone(policy))
        self.backbone.requires_grad_(True)
        self.value_head = nn.Linear(_hidden_size(policy), 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        try:
            device = next(self.backbone.parameters()).device
            self.value_head.to(device)
        except StopIteration:  # pragma: no cover - a backbone without parameters
            pass

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # (B, L, H)
        return self.value_head(hidden.float()).squeeze(-1)  # (B, L)


def completion_values(values: Tensor, prompt_len: int, T: int) -> Tensor:
    """Values of the states before each completion token: values[:, P-1 : P-1+T] -> (B, T).

    Assumes every prompt is left-padded to the common width P = prompt_len and completions start at P.
    """
    return values[:, prompt_len - 1 : prompt_len - 1 + T]  # (B, T)


def terminal_rewards(r: Tensor, mask: Tensor) -> Tensor:
    """Verifiable reward r_i on the last valid token of completion i, 0 elsewhere: (b,) -> (b, T).

    Assumes right padding (valid tokens contiguous from t = 0). An empty completion gets no reward
    token (it has no token to credit).
    """
    mask = mask.float()
    length = mask.sum(dim=1).long()  # (b,)
    out = torch.zeros_like(mask)  # (b, T)
    rows = torch.nonzero(length > 0).squeeze(1)  # (b',)
    out[rows, length[rows] - 1] = r.to(out.dtype)[rows]
    return out  # (b, T)


@torch.no_grad()
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eqs. 11-16), over completion tokens:

        delta_t = r_t + gamma * V_{t+1} - V_t              (V after the last valid token = 0: terminal)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                                (the value target: TD(lambda) return)

    lam = 1: A_t = sum_{k>=t} gamma^(k-t) r_k - V_t (Monte-Carlo); lam = 0: A_t = delta_t (one-step TD).
    With a terminal reward and gamma = lam = 1, A_t = r_final - V_t.
    token_rewards, values, mask: (b, T), right-padded. Returns (adv, returns), (b, T) each, 0 on padding.
    """
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
def ppo_advantages(
    r: Tensor, values: Tensor, mask: Tensor, algo: AlgoConfig, *, token_penalty: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """PPO advantages for the whole batch (not per micro-batch: whitening is a batch statistic):

        token rewards = terminal r_i on the last token  - token_penalty (beta * k_t, KL in the reward)
        adv, returns  = gae(token rewards, values, mask, algo.gamma, algo.lam)
        adv           = whiten(adv) if algo.adv_scale == "batch_std"

    r (b,), values (b, T) from the critic before the update (old values), mask (b, T).
    Returns (adv, returns), (b, T) each; returns are the value targets (computed before whitening).
    """
    token_rewards = terminal_rewards(r, mask)  # (b, T)
    if token_penalty is not None:
        token_rewards = token_rewards - token_penalty.float()  # (b, T)
    adv, returns = gae(token_rewards, values, mask, algo.gamma, algo.lam)  # (b, T) each
    if algo.adv_scale == "batch_std":
        adv = whiten(adv, mask)  # (b, T)
    elif algo.adv_scale != "none":
        raise ValueError(f"adv_scale {algo.adv_scale!r} does not apply to per-token GAE advantages")
    return adv, returns


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None,
    *,
    n_tok: int | None = None,
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
    count = max(int(valid.sum().item()), 1)
    n_tok = count if n_tok is None else max(int(n_tok), 1)
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
    with torch.no_grad():

        def mean(x: Tensor) -> float:
            return float(torch.where(valid, x.float(), torch.zeros_like(mask)).sum().item() / count)

        metrics = {
            "value/loss": mean(loss_tok.detach()),
            "value/clip_frac": mean(clipped),
            "value/mean": mean(values.detach()),
            "value/error": mean((values.detach() - returns).abs()),
        }
    return loss, metrics


__all__ = [
    "ValueModel",
    "completion_values",
    "gae",
    "ppo_advantages",
    "terminal_rewards",
    "value_loss",
    "whiten",
]
