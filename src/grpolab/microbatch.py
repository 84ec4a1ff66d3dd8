"""Micro-batches of whole groups, and the model passes over them.

A group of G completions shares its prompt, so a micro-batch always holds whole groups: the prompt is
run through the model once per group (grpolab.logprobs.grouped_completion_logp). Each micro-batch is
cut to its own longest completion and its shortest prompt padding, so little compute goes to padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpolab.logprobs import grouped_completion_logp
from grpolab.rollout import Rollout


@dataclass
class GroupSlice:
    """Whole groups of a rollout, trimmed, on the compute device."""

    rows: Tensor  # (b,) row indices into the rollout, b = groups * G, grouped contiguously
    prompt_ids: Tensor  # (b/G, P') one left-padded prompt per group
    prompt_mask: Tensor  # (b/G, P')
    completion_ids: Tensor  # (b, C') right-padded
    completion_mask: Tensor  # (b, C') float
    G: int

    @property
    def width(self) -> int:
        """C', the completion columns this slice kept."""
        return self.completion_ids.shape[1]

    def full_sequences(self) -> tuple[Tensor, Tensor]:
        """Prompt + completion ids and mask per sequence, (b, P' + C') each (a critic reads whole sequences)."""
        return (torch.cat([self.prompt_ids.repeat_interleave(self.G, 0), self.completion_ids], 1),
                torch.cat([self.prompt_mask.repeat_interleave(self.G, 0), self.completion_mask.long()], 1))


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


__all__ = ["GroupSlice", "all_groups", "logp_without_grad", "micro_batches", "sampled_token_logp", "slice_groups",
           "slice_logp"]
