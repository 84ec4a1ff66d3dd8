"""Activation (gradient) checkpointing of the policy's decoder layers in the update pass (`grad_checkpointing=true`).

Without it, the update's forward keeps every layer's intermediate tensors for the backward: for a
decoder layer over T positions that is about T (8 H + 4 I) values plus the attention's
probabilities (grpolab.training.plan.memory, `layer_saved`), for every layer of every micro-batch. With it,
each layer keeps only its input; the backward runs the layer's forward again (one layer at a time)
to rebuild what its own backward needs, so the activations of a micro-batch shrink to about one
(T, H) tensor per layer, for one more forward pass of the layers (about a third more arithmetic in
the update; measured in docs/performance.md, "Activation checkpointing").

Why not transformers' own `gradient_checkpointing_enable()`: it drops the KV cache in every layer
(`use_cache=False`), and grpolab's update pass needs it -- the prompt of a group runs once and its
keys and values are repeated for the G completions (grpolab.model.logprobs.grouped_completion_logp).
A layer that writes the cache cannot simply be run twice (the replay would append its keys again),
so `checkpointed` runs each layer under torch.utils.checkpoint (non-reentrant) and restores that
layer's slot of the cache to what it held before the call each time the layer is replayed: the
replay then sees exactly the keys and values the first run saw, and computes the same numbers. After
a replay the slot is restored again: the replayed keys and values carry the replay's autograd graph,
and left in the cache they would keep that graph's tensors alive, layer after layer, until the
backward ends (docs/performance.md, "Memory plan").

    with checkpointed(policy):            # grpolab.model.passes.policy_logp, when PassSpec.checkpoint
        logp, entropy = grouped_completion_logp(policy, ...)
    loss.backward()                       # each layer's forward is replayed here, one at a time

The context only swaps in the layers' `forward` while it is open (nothing is left on the model, so a
deep copy or a checkpoint of the model never carries it); the replay in the backward needs nothing
from the context. Passes without gradients (generation, reference, evaluation) are never affected.
RNG state (a LoRA adapter's dropout) and autocast are replayed as torch.utils.checkpoint does.
tests/test_checkpointing.py checks the gradients against the plain pass.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CACHE_KEYWORDS = ("cache", "past_key_values")
"""The names a transformers decoder layer takes its KV cache under (newer versions: `cache`)."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM (through a peft wrapper), in order; [] when it has none that
    this module knows (such a model then runs without checkpointing)."""
    from grpolab.model.logprobs import backbone

    try:
        body = backbone(model)
    except AttributeError:
        return []
    layers = getattr(body, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def _layer_index(layer: nn.Module) -> int | None:
    attn = getattr(layer, "self_attn", None)
    idx = getattr(attn, "layer_idx", None)
    return int(idx) if idx is not None else None


def _slot(cache, idx: int | None):
    """The cache object's per-layer slot (transformers' DynamicLayer), or None where there is none."""
    layers = getattr(cache, "layers", None)
    if idx is None or layers is None or idx >= len(layers):
        return None
    return layers[idx]


def _checkpointed_forward(layer: nn.Module, forward):
    """`forward` of one decoder layer, run under non-reentrant checkpointing when gradients are on."""
    idx = _layer_index(layer)

    def run(*args, **kwargs):
        if not (torch.is_grad_enabled() and layer.training):
            return forward(*args, **kwargs)
        cache = next((kwargs[k] for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)
        slot = _slot(cache, idx)
        before = copy.copy(slot.__dict__) if slot is not None else None  # the tensors it refers to, not copies
        calls = [0]

        def restore() -> None:
            slot.__dict__.clear()
            slot.__dict__.update(before)

        def replayable(*a, **kw):
            calls[0] += 1
            if slot is None or calls[0] == 1:  # the first run: its keys and values stay in the cache
                return forward(*a, **kw)
            restore()  # a replay sees the slot as the first run saw it ...
            try:
                return forward(*a, **kw)
            finally:  # ... and leaves nothing in it: the replayed keys and values would keep the replay's
                restore()  # graph (and every tensor it saved) alive until the whole backward ends

        return checkpoint(replayable, *args, use_reentrant=False, **kwargs)

    return run


@contextlib.contextmanager
def checkpointed(model: nn.Module, enabled: bool = True):
    """Within the context, every decoder layer of `model` checkpoints its activations in passes with
    gradients (see the module docstring). enabled=False, or a model without known decoder layers,
    leaves the model as it is."""
    layers = decoder_layers(model) if enabled else []
    installed = []
    try:
        for layer in layers:
            if "forward" in layer.__dict__:  # already wrapped (a nested context): leave it
                continue
            layer.forward = _checkpointed_forward(layer, layer.forward)
            installed.append(layer)
        yield bool(layers)
    finally:
        for layer in installed:
            del layer.forward


__all__ = ["checkpointed", "decoder_layers"]
