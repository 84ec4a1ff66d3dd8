"""PPO's critic: a value model, GAE advantages, the (clipped) value loss, and the component that
trains them beside the policy.

PPO (Schulman et al. 2017) for language models (Ziegler et al. 2019; Ouyang et al. 2022) learns
V_phi(s_t), the expected final reward from the state s_t = (prompt, y_<t), and turns the single
verifiable reward at the end of a completion into per-token advantages with GAE (Schulman et al. 2016).
The price is a second network as large as the policy's backbone, with its own gradients and optimiser
state -- the memory that GRPO saves by using the group mean as the baseline instead
(docs/algorithms.md, "Memory").

What the training step does with a `Critic` (grpolab.step), per step:

    r_tok      = shaping.shape_rewards(...).token_reward       # (N, C) terminal reward - beta * k_t
    adv        = critic.targets(run, batch)                    # no grad: V_old (N, C) once, then
                                                               #   GAE(r_tok, V_old) and whitening
    for each of algo.mu epochs, for each micro-batch of whole groups:
        loss, info = critic.add_loss(policy_loss, run, part, batch)   # + vf_coef * value_loss(V, V_old, R)
        loss.backward()                                                # policy and critic grads
    critic.step(max_grad_norm)                                         # clip, AdamW step, zero grads

Methods without a critic use grpolab.advantages.GroupBaseline, which has the same four methods.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from grpolab.losses import masked_mean
from grpolab.microbatch import all_groups, micro_batches, slice_groups
from grpolab.optim import adamw, load_state
from grpolab.rollout import positions

if TYPE_CHECKING:  # the settings type only; grpolab.algos imports no registry, nor this module
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
    Position ids skip left padding (rollout.positions), exactly as in the policy's passes, so a
    left-padded prompt is seen at the positions it would have alone.
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
        pos = positions(attention_mask) if attention_mask is not None else None  # (B, L)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # (B, L, H)
        return self.value_head(hidden.float()).squeeze(-1)  # (B, L)


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
def ppo_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, algo: "AlgoConfig") -> tuple[Tensor, Tensor]:
    """PPO advantages for the whole batch (not per micro-batch: whitening is a batch statistic):

        adv, returns = gae(token rewards, values, mask, algo.gamma, algo.lam)
        adv          = whiten(adv) if algo.adv_scale == "batch_std"

    token_rewards (b, T): the shaped per-token rewards (grpolab.shaping: terminal reward on the last
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


class Critic:
    """The value model as a component of a run: its own AdamW, its targets, its loss, its state.

    The step calls the same four methods on it as on grpolab.advantages.GroupBaseline; the checkpoint
    saves `state_dict()` (weights and optimiser) inside the same atomic checkpoint directory as the
    policy, as critic.pt, so a resumed run always gets the critic of the step it resumes from.
    """

    computes_every_group = True
    """The value loss needs every sequence, whatever its policy advantage."""

    def __init__(self, policy: nn.Module, algo: "AlgoConfig", *, lr: float, betas: tuple[float, float],
                 weight_decay: float, device: torch.device):
        self.algo = algo
        self.model = ValueModel(policy).to(device)
        self.optimizer = adamw(self.model.parameters(), lr=algo.critic_lr or lr, betas=betas,
                               weight_decay=weight_decay)

    def values(self, run, part) -> Tensor:
        """V(s_t) before each completion token of a GroupSlice, (b, C'), fp32."""
        with run.autocast():
            v = self.model(*part.full_sequences())  # (b, P' + C')
        return completion_values(v.float(), part.prompt_ids.shape[1], part.width)  # (b, C')

    @torch.no_grad()
    def targets(self, run, batch) -> Tensor:
        """Per-token advantages (N, C) by GAE from the old values; keeps the old values and the
        returns on the batch (batch.old_values, batch.returns) for the value loss."""
        rollout = batch.rollout
        old_values = torch.zeros(rollout.completion_ids.shape)  # (N, C)
        for rows in micro_batches(rollout, all_groups(rollout), run.cfg.micro_batch):
            part = slice_groups(rollout, rows, run.device)
            old_values[rows, :part.width] = self.values(run, part).cpu()
        adv, returns = ppo_advantages(batch.token_reward, old_values, rollout.completion_mask, self.algo)
        batch.old_values, batch.returns = old_values, returns
        return adv  # (N, C)

    def add_loss(self, loss: Tensor, run, part, batch) -> tuple[Tensor, dict]:
        """loss + vf_coef * value_loss on the slice (normalised by the batch's valid tokens)."""
        rows, width = part.rows, part.width
        vl, info = value_loss(self.values(run, part), batch.old_values[rows, :width].to(run.device),
                              batch.returns[rows, :width].to(run.device), part.completion_mask,
                              self.algo.value_clip, n_tok=batch.n_tokens)
        return loss + self.algo.vf_coef * vl, info

    def step(self, max_grad_norm: float) -> None:
        """Clip the critic's gradients (when max_grad_norm > 0), step its optimiser, zero its grads.
        A non-finite gradient norm skips the critic's update (its weights stay as they were)."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              max_grad_norm if max_grad_norm > 0 else float("inf"))
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def discard(self) -> None:
        """The policy's update was skipped: drop the critic's gradients too."""
        self.optimizer.zero_grad(set_to_none=True)

    def trained_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def state_dict(self) -> dict:
        return {"critic": self.model.state_dict(), "opt": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["critic"])
        load_state(self.optimizer, state["opt"])


__all__ = [
    "Critic",
    "ValueModel",
    "completion_values",
    "gae",
    "ppo_advantages",
    "value_loss",
    "whiten",
]
