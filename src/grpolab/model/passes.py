"""Every forward pass over whole groups has its owner here: the policy's training pass, the no-grad
passes (reference, old policy), the critic's and the FSDP idle pass. Each takes a PassSpec (device,
autocast dtype, temperature, micro-batch), not the whole run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpolab.batch import GroupSlice, Rollout
from grpolab.model.logprobs import grouped_completion_logp

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
    longest = rollout.completion_mask.sum(-1).view(-1, G).amax(-1)[groups]  # (g,)
    groups = groups[torch.argsort(longest, descending=True)]
    per = max(1, seqs_per_batch // G)
    offsets = torch.arange(G)
    return [(groups[s:s + per, None] * G + offsets).reshape(-1) for s in range(0, len(groups), per)]


def all_groups(rollout: Rollout) -> Tensor:
    """Indices of every prompt group of the rollout, (N/G,)."""
    return torch.arange(rollout.completion_ids.shape[0] // rollout.G)


def slice_groups(rollout: Rollout, rows: Tensor, device: torch.device) -> GroupSlice:
    """The whole groups `rows` of the rollout: one prompt row per group, cut to the slice's longest
    completion and its shortest prompt padding, moved to `device`."""
    prompt_rows = rows[::rollout.G]
    prompt_mask = rollout.prompt_mask[prompt_rows]
    completion_mask = rollout.completion_mask[rows]
    first = int((prompt_mask.sum(0) > 0).nonzero().min())  # drop all-padding prompt columns
    width = int((completion_mask.sum(0) > 0).nonzero().max()) + 1
    return GroupSlice(rows, rollout.prompt_ids[prompt_rows, first:].to(device), prompt_mask[:, first:].to(device),
                      rollout.completion_ids[rows, :width].to(device), completion_mask[:, :width].to(device),
                      rollout.G)


def slice_logp(run, model, part: GroupSlice, *, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log pi (b, C') of the slice's completion tokens under `model` (fp32), and the entropy at each
    position when asked; logits divided by the sampling temperature, under the run's autocast."""
    with run.autocast():
        logp, entropy = grouped_completion_logp(model, part.prompt_ids, part.prompt_mask, part.completion_ids,
                                                part.completion_mask, part.G, temperature=run.cfg.temperature,
                                                with_entropy=with_entropy)
    return logp.float(), entropy


@torch.no_grad()
def logp_without_grad(run, model, rollout: Rollout) -> Tensor:
    """log pi (N, C) of every completion token under `model`, on the CPU, without gradients: the
    reference's log-probs (or the policy's, where the rollout's own cannot stand in for them)."""
    N, C = rollout.completion_ids.shape
    out = torch.zeros((N, C))
    for rows in micro_batches(rollout, all_groups(rollout), run.cfg.micro_batch):
        part = slice_groups(rollout, rows, run.device)
        logp, _ = slice_logp(run, model, part)
        out[rows, :part.width] = logp.cpu()
    return out


@torch.no_grad()
def sampled_token_logp(run, rollout: Rollout) -> Tensor:
    """log pi_theta (N, C) of the sampled tokens, before any update.

    The rollout recorded the log-prob of each token under its sampling distribution, softmax(z / T);
    with top_p = 1 that is exactly what a forward pass of the policy would give (up to float rounding
    between the cached decoding and a full pass), so no pass is made. With top_p < 1 the sampling
    distribution was renormalised over the nucleus, so the policy is run once without gradients.
    """
    if run.cfg.top_p >= 1.0:
        return rollout.sample_logp
    return logp_without_grad(run, run.policy, rollout)


def policy_logp(run, part: GroupSlice, *, with_entropy: bool = False):
    """slice_logp of the policy on `part`; sharded, a one-column slice gets a masked second column so
    that the pass makes the same module calls (and so the same collectives) on every rank."""
    if not is_sharded(run.policy) or part.width > 1:
        return slice_logp(run, run.policy, part, with_entropy=with_entropy)
    wide = GroupSlice(part.rows, part.prompt_ids, part.prompt_mask, part.completion_ids.repeat(1, 2),
                      torch.nn.functional.pad(part.completion_mask, (0, 1)), part.G)
    logp, entropy = slice_logp(run, run.policy, wide, with_entropy=with_entropy)
    return logp[:, :1], entropy[:, :1] if entropy is not None else None


def idle_pass(run, rollout) -> None:
    """A forward and backward of weight zero (on this rank's first group): the collectives of a
    micro-batch that another rank has and this one does not."""
    part = slice_groups(rollout, torch.arange(rollout.G), run.device)
    logp, _ = policy_logp(run, part)
    (logp.sum() * 0.0).backward()


