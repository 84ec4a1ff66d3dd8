"""KV-cache plumbing shared by every model pass: left padding, position ids that skip it, and the
keyword a transformers version uses for the cache.
"""

from __future__ import annotations

import functools
import inspect

import torch


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and mask, padded on the left."""
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, P - len(s) :] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


@functools.cache
def _cache_arg(forward_owner: type) -> str:
    """Name of the KV-cache argument: `cache` in newer transformers (5.24 has it), `past_key_values` in older ones."""
    return "cache" if "cache" in inspect.signature(forward_owner.forward).parameters else "past_key_values"


def with_cache(module, cache) -> dict:
    """Keyword arguments passing a KV cache to `module` under the name its transformers version uses
    (a peft wrapper passes its keyword arguments through: the name is the wrapped model's)."""
    inner = module.get_base_model() if hasattr(module, "get_base_model") else module
    return {_cache_arg(type(inner)): cache}


def cache_of(out):
    """The KV cache a forward returned (`cache` or `past_key_values`, by transformers version)."""
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values
