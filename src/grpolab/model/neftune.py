"""NEFTune (Jain et al. 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning"): uniform noise added
to the input embeddings of the update's forward passes (`neftune_alpha`; TRL's neftune_noise_alpha).

    e'_{b,t,j} = e_{b,t,j} + u_{b,t,j},    u ~ U(-m, m) i.i.d.,    m = alpha / sqrt(L * d)

with L the length of the sequence the forward pass runs over and d the embedding width, as transformers'
neftune_post_forward_hook adds it (transformers.integrations.neftune: m = alpha / sqrt(output.size(1) *
output.size(2)), drawn with torch's global generator).

Which passes: the update's (grpolab.training.update.micro_batch_pass), whose first epoch's log-probs are also
log pi_old, as in TRL, where the hook sits on the policy's embeddings and acts while the model is in training
mode (its loss pass, and its old-log-prob pass when it makes one). Never: the rollout, the reference's pass,
the evaluation (TRL evaluates in eval mode, without noise). Where TRL samples with transformers' generate
(use_vllm=False) the policy is in training mode too, so TRL's rollouts are noised; grpolab's are not
(docs/migrating-from-trl.md).

grpolab's pass runs a group's prompt once and its G completions after it
(grpolab.model.logprobs.grouped_completion_logp), so the embeddings are looked up in two calls; L is the whole
sequence's, prompt + completion width, as in TRL's one forward over prompt and completion. The G completions
of a group share the prompt's noise (TRL draws it per sequence): the same distribution for each sequence.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor, nn


def neftune_magnitude(alpha: float, length: int, dim: int) -> float:
    """m = alpha / sqrt(L * d): the bound of NEFTune's uniform noise for a sequence of L positions of width d."""
    return alpha / math.sqrt(length * dim)


def add_neftune_noise(embeds: Tensor, alpha: float, length: int) -> Tensor:
    """embeds (b, T, d) + u, u ~ U(-m, m) elementwise, m = neftune_magnitude(alpha, length, d); the draw comes
    from torch's global generator, as transformers' hook draws it."""
    m = neftune_magnitude(alpha, length, embeds.shape[-1])
    return embeds + torch.zeros_like(embeds).uniform_(-m, m)


@contextlib.contextmanager
def noisy_embeddings(model: nn.Module, alpha: float | None, length: int):
    """While open, every lookup of `model`'s input embeddings (through a PEFT wrapper too) gets NEFTune's
    noise for a sequence of `length` positions; nothing when alpha is None or 0. Nothing is left on the model."""
    if not alpha:
        yield
        return
    handle = model.get_input_embeddings().register_forward_hook(
        lambda module, args, output: add_neftune_noise(output, alpha, length)
    )
    try:
        yield
    finally:
        handle.remove()


__all__ = ["add_neftune_noise", "neftune_magnitude", "noisy_embeddings"]
