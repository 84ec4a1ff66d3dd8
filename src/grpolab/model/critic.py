"""PPO's critic: a value model, GAE advantages, the (clipped) value loss, and the component that
trains them beside the policy.

PPO (Schulman et al. 2017) for language models (Ziegler et al. 2019; Ouyang et al. 2022) learns
V_phi(s_t), the expected final reward from the state s_t = (prompt, y_<t), and turns the single
verifiable reward at the end of a completion into per-token advantages with GAE (Schulman et al. 2016).
The price is a second network as large as the policy's backbone, with its own gradients and optimiser
state -- the memory that GRPO saves by using the group mean as the baseline instead
(docs/algorithms.md, "Memory").

What the training step does with a `Critic` (grpolab.training.step), per step:

    spec       = run.pass_spec                                 # device, autocast, temperature, micro-batch
    r_tok      = shaping.shape_rewards(...).token_reward       # (N, C) terminal reward - beta * k_t
    adv        = critic.targets(spec, batch)                   # no grad: V_old (N, C) once, then
                                                               #   GAE(r_tok, V_old) and whitening
    for each of algo.mu epochs, for each micro-batch of whole groups:
        loss, info = critic.add_loss(policy_loss, spec, part, batch)  # + vf_coef * value_loss(V, V_old, R)
        loss.backward()                                                # policy and critic grads
    critic.step(max_grad_norm)                                         # clip, AdamW step, zero grads
    (an update skipped for a non-finite loss: critic.discard() instead)

Its passes are grpolab.model.passes' (slice_values, values_without_grad). Methods without a critic use
grpolab.training.components.GroupBaseline; both satisfy grpolab.training.components.AdvantageComponent
(targets, add_loss, step, discard, computes_every_group, trained_params, state_dict/load_state_dict).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from grpolab.algo.gae import ppo_advantages, value_loss
from grpolab.model.cache import positions
from grpolab.model.logprobs import backbone
from grpolab.model.optim import adamw, load_state
from grpolab.model.passes import slice_values, values_without_grad

if TYPE_CHECKING:  # the settings type only; grpolab.algo.presets imports no registry, nor this module
    from grpolab.algo.presets import AlgoConfig
    from grpolab.batch import Batch, GroupSlice
    from grpolab.model.passes import PassSpec


def _backbone(policy: nn.Module) -> nn.Module:
    """grpolab.model.logprobs.backbone (the transformer under the LM head, through a PEFT wrapper), or a
    ValueError that names the model when it has none."""
    try:
        return backbone(policy)
    except AttributeError as e:
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        prefix = getattr(base, "base_model_prefix", None)
        raise ValueError(
            f"cannot find the transformer backbone of {type(base).__name__} "
            f"(looked for .{prefix or 'base_model_prefix'})"
        ) from e


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
    Position ids skip left padding (grpolab.model.cache.positions), exactly as in the policy's passes, so a
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


class Critic:
    """The value model as a component of a run: its own AdamW, its targets, its loss, its state.

    The step uses it exactly as grpolab.training.components.GroupBaseline (the AdvantageComponent protocol); the checkpoint
    saves `state_dict()` (weights and optimiser) inside the same atomic checkpoint directory as the
    policy, as critic.pt, so a resumed run always gets the critic of the step it resumes from.
    """

    computes_every_group = True
    """The value loss needs every sequence, whatever its policy advantage."""

    def __init__(
        self,
        policy: nn.Module,
        algo: AlgoConfig,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        device: torch.device,
    ):
        self.algo = algo
        self.model = ValueModel(policy).to(device)
        self.optimizer = adamw(self.model.parameters(), lr=algo.critic_lr or lr, betas=betas, weight_decay=weight_decay)

    def values(self, spec: PassSpec, part: GroupSlice) -> Tensor:
        """V(s_t) before each completion token of a GroupSlice, (b, C'), fp32."""
        return slice_values(spec, self.model, part)  # (b, C')

    @torch.no_grad()
    def targets(self, spec: PassSpec, batch: Batch) -> Tensor:
        """Per-token advantages (N, C) by GAE from the old values; keeps the old values and the
        returns on the batch (batch.old_values, batch.returns) for the value loss."""
        rollout = batch.rollout
        old_values = values_without_grad(spec, self.model, rollout)  # (N, C)
        adv, returns = ppo_advantages(batch.token_reward, old_values, rollout.completion_mask, self.algo)
        batch.old_values, batch.returns = old_values, returns
        return adv  # (N, C)

    def add_loss(self, loss: Tensor, spec: PassSpec, part: GroupSlice, batch: Batch) -> tuple[Tensor, dict]:
        """loss + vf_coef * value_loss on the slice (normalised by the batch's valid tokens)."""
        rows, width = part.rows, part.width
        vl, info = value_loss(
            self.values(spec, part),
            batch.old_values[rows, :width].to(spec.device),
            batch.returns[rows, :width].to(spec.device),
            part.completion_mask,
            self.algo.value_clip,
            n_tok=batch.n_tokens,
        )
        return loss + self.algo.vf_coef * vl, info

    def step(self, max_grad_norm: float) -> None:
        """Clip the critic's gradients (when max_grad_norm > 0), step its optimiser, zero its grads.
        A non-finite gradient norm skips the critic's update (its weights stay as they were)."""
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf")
        )
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
