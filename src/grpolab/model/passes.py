"""Every forward pass over whole groups has its owner here: the policy's training pass, the no-grad
passes (reference, old policy), the critic's and the FSDP idle pass. Each takes a PassSpec (device,
autocast dtype, temperature, micro-batch), not the whole run.

The one forward pass that is not here is generation's: the prefill and decode steps of
grpolab.engine.native.generate and grpolab.engine.native.turns build and extend a KV cache token by token (through a
stepper: the lean decoder or the model's own forward) and sample as they go; they score nothing. Every
pass that scores completions (log-probs, entropies, values) is here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from grpolab.algo.gae import completion_values
from grpolab.batch import GroupSlice, Rollout
from grpolab.model.checkpointing import checkpointed
from grpolab.model.compiling import Compiler, compiled
from grpolab.model.logprobs import grouped_completion_logp
from grpolab.model.moe import RouterAux, RouterLogits


@dataclass(frozen=True)
class PassSpec:
    """What a model pass needs to know of the run (grpolab.training.run.Run.pass_spec, built once by setup)."""

    device: torch.device
    """Where the micro-batches are moved and the model runs."""
    amp_dtype: torch.dtype | None = None
    """Autocast dtype of the scoring passes (update, reference, critic); None: plain fp32 (grpolab.model.precision)."""
    temperature: float = 1.0
    """The sampling temperature: logits are divided by it, so pi_theta is the distribution sampled from."""
    micro_batch: int = 16
    """Sequences per micro-batch (whole groups: max(1, micro_batch // G) of them; grpolab.training.config)."""
    checkpoint: bool = False
    """Activation checkpointing of the policy's decoder layers in the update pass (grpolab.model.checkpointing)."""
    head_fp32: bool = False
    """The LM head in fp32 whatever the autocast (grpolab.model.logprobs; the run's lm_head_fp32)."""
    compiler: Compiler | None = None
    """torch.compile's options for the policy's decoder layers in the update pass; None: eager (grpolab.model.compiling)."""
    router: RouterAux | None = None
    """A mixture of experts' load-balancing term of the update (grpolab.model.moe); None: no router logits asked."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the passes (a no-op in fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)


FSDP_MARK = "_grpolab_fsdp"
"""Attribute that grpolab.parallel.fsdp.shard sets on a sharded model: {"layers": [...], "root": FSDPModule, "depth": int}."""


def is_sharded(model) -> bool:
    """Whether grpolab.parallel.fsdp sharded `model` (its passes then need every rank to join)."""
    return model is not None and getattr(model, FSDP_MARK, None) is not None


def micro_batches(rollout: Rollout, groups: Tensor, seqs_per_batch: int) -> list[Tensor]:
    """Split prompt groups `groups` (g,) into micro-batches of whole groups, longest completions first
    so that each micro-batch carries little padding. Returns the row indices of each micro-batch; a
    micro-batch holds max(1, seqs_per_batch // G) groups."""
    G = rollout.G
    if len(groups) == 0:
        return []
    longest = rollout.attention_mask.sum(-1).view(-1, G).amax(-1)[groups]  # (g,)
    groups = groups[torch.argsort(longest, descending=True)]
    per = max(1, seqs_per_batch // G)
    offsets = torch.arange(G)
    return [(groups[s : s + per, None] * G + offsets).reshape(-1) for s in range(0, len(groups), per)]


def all_groups(rollout: Rollout) -> Tensor:
    """Indices of every prompt group of the rollout, (N/G,)."""
    return torch.arange(rollout.completion_ids.shape[0] // rollout.G)


def slice_groups(rollout: Rollout, rows: Tensor, device: torch.device) -> GroupSlice:
    """The whole groups `rows` of the rollout: one prompt row per group, cut to the slice's longest
    completion and its shortest prompt padding, moved to `device`."""
    prompt_rows = rows[:: rollout.G]
    prompt_mask = rollout.prompt_mask[prompt_rows]
    completion_mask = rollout.completion_mask[rows]
    present = rollout.attention_mask[rows]  # model and environment tokens: what the pass attends to
    first = int((prompt_mask.sum(0) > 0).nonzero().min())  # drop all-padding prompt columns
    width = int((present.sum(0) > 0).nonzero().max()) + 1
    return GroupSlice(
        rows,
        rollout.prompt_ids[prompt_rows, first:].to(device),
        prompt_mask[:, first:].to(device),
        rollout.completion_ids[rows, :width].to(device),
        completion_mask[:, :width].to(device),
        rollout.G,
        None if rollout.env_mask is None else present[:, :width].to(device),
    )


def slice_logp(
    spec: PassSpec,
    model: nn.Module,
    part: GroupSlice,
    *,
    with_entropy: bool = False,
    router: RouterLogits | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log pi (b, C') of the slice's completion tokens under `model` (fp32), and the entropy at each
    position when asked; logits divided by the sampling temperature, under the spec's autocast. router:
    collects the slice's MoE router logits (grpolab.model.logprobs.grouped_completion_logp)."""
    with spec.autocast():
        logp, entropy = grouped_completion_logp(
            model,
            part.prompt_ids,
            part.prompt_mask,
            part.completion_ids,
            part.present,
            part.G,
            temperature=spec.temperature,
            with_entropy=with_entropy,
            head_fp32=spec.head_fp32,
            router=router,
        )
    if part.attention_mask is not None:  # environment tokens: context only, exactly 0 and no gradient
        model_token = part.completion_mask.bool()
        logp = torch.where(model_token, logp, torch.zeros_like(logp))
        entropy = None if entropy is None else torch.where(model_token, entropy, torch.zeros_like(entropy))
    return logp.float(), entropy


def slice_values(spec: PassSpec, value_model: nn.Module, part: GroupSlice) -> Tensor:
    """V(s_t) (b, C') before each completion token of the slice, fp32, under the spec's autocast: the
    critic's pass (grpolab.model.critic.ValueModel gives a value per position, aligned as logits)."""
    with spec.autocast():
        v = value_model(*part.full_sequences())  # (b, P' + C')
    return completion_values(v.float(), part.prompt_ids.shape[1], part.width)  # (b, C')


def _every_group(spec: PassSpec, rollout: Rollout, per_slice: Callable[[GroupSlice], Tensor]) -> Tensor:
    """(N, C) on the CPU: `per_slice` (b, C') of every micro-batch of whole groups, 0 past each slice's width."""
    N, C = rollout.completion_ids.shape
    out = torch.zeros((N, C))
    for rows in micro_batches(rollout, all_groups(rollout), spec.micro_batch):
        part = slice_groups(rollout, rows, spec.device)
        out[rows, : part.width] = per_slice(part).cpu()
    return out


@torch.no_grad()
def logp_without_grad(spec: PassSpec, model: nn.Module, rollout: Rollout) -> Tensor:
    """log pi (N, C) of every completion token under `model`, on the CPU, without gradients: the
    reference's log-probs (or the policy's, where the rollout's own cannot stand in for them)."""
    return _every_group(spec, rollout, lambda part: slice_logp(spec, model, part)[0])


@torch.no_grad()
def values_without_grad(spec: PassSpec, value_model: nn.Module, rollout: Rollout) -> Tensor:
    """V_old (N, C) before every completion token, on the CPU, without gradients (the critic's targets)."""
    return _every_group(spec, rollout, lambda part: slice_values(spec, value_model, part))


@torch.no_grad()
def sampled_token_logp(
    spec: PassSpec, policy: nn.Module, rollout: Rollout, *, plain: bool, sampler_is_policy: bool = True
) -> Tensor:
    """log pi_theta (N, C) of the sampled tokens, before any update.

    The rollout recorded the log-prob of each token under its sampling distribution; when that is
    softmax(z / T) itself (`plain`: no top-p, top-k, min-p or repetition penalty) it is exactly what a
    forward pass of the policy would give (up to float rounding between the cached decoding and a full
    pass), so no pass is made. A filtered distribution was renormalised, so the policy is run once
    without gradients; so it is when another engine sampled (`sampler_is_policy` False: vLLM's
    log-probs are not the policy's).
    """
    if plain and sampler_is_policy:
        return rollout.sample_logp
    return logp_without_grad(spec, policy, rollout)


def policy_logp(
    spec: PassSpec,
    policy: nn.Module,
    part: GroupSlice,
    *,
    with_entropy: bool = False,
    router: RouterLogits | None = None,
) -> tuple[Tensor, Tensor | None]:
    """slice_logp of the policy on `part`, its decoder layers checkpointed when spec.checkpoint, compiled when
    spec.compiler; sharded, a
    one-column slice gets a masked second column so that the pass makes the same module calls (and so
    the same collectives) on every rank. router: collects the pass's MoE router logits (spec.router)."""
    with checkpointed(policy, spec.checkpoint), compiled(policy, spec.compiler):
        if not is_sharded(policy) or part.width > 1:
            return slice_logp(spec, policy, part, with_entropy=with_entropy, router=router)
        wide = GroupSlice(
            part.rows,
            part.prompt_ids,
            part.prompt_mask,
            part.completion_ids.repeat(1, 2),
            torch.nn.functional.pad(part.completion_mask, (0, 1)),
            part.G,
        )
        logp, entropy = slice_logp(spec, policy, wide, with_entropy=with_entropy, router=router)
    return logp[:, :1], entropy[:, :1] if entropy is not None else None


def idle_pass(spec: PassSpec, policy: nn.Module, rollout: Rollout) -> None:
    """A forward and backward of weight zero (on this rank's first group): the collectives of a
    micro-batch that another rank has and this one does not."""
    part = slice_groups(rollout, torch.arange(rollout.G), spec.device)
    logp, _ = policy_logp(spec, policy, part)
    (logp.sum() * 0.0).backward()
