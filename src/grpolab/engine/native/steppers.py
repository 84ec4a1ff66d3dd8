"""The two ways a decode loop runs the model one step: the model's own forward with its KV cache
(HFStepper, any causal LM), or grpolab's lean decode step (grpolab.engine.native.decoder.LeanStepper), and
stepper_for, which builds the one that grpolab.engine.native.decoder.lean_decodes picked."""

from __future__ import annotations

import torch

from grpolab.model.cache import cache_of, with_cache


class HFStepper:
    """The rollout's model steps on the model's own forward and its KV cache (any causal LM)."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache, self.attn = cache_of(out), mask
        return out.logits[:, -1]

    def repeat(self, G: int) -> None:
        self.cache.batch_repeat_interleave(G)
        self.attn = self.attn.repeat_interleave(G, 0)

    def keep(self, idx: torch.Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.attn = self.attn[idx]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Logits after one new token per row; valid (n,) bool False: that row's slot is a hole (a row
        waiting for the others to end their turn), which no later token attends to."""
        new = torch.ones_like(self.attn[:, :1]) if valid is None else valid[:, None].to(self.attn.dtype)
        self.attn = torch.cat([self.attn, new], dim=1)
        out = self.model(
            input_ids=tok[:, None],
            attention_mask=self.attn,
            position_ids=pos[:, None],
            use_cache=True,
            **with_cache(self.model, self.cache),
        )
        self.cache = cache_of(out)
        return out.logits[:, -1]

    def extend(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append L tokens per row onto the cache (environment tokens between turns), left-padded:
        ids/mask/pos (n, L). Returns the logits after each row's last token (n, V)."""
        self.attn = torch.cat([self.attn, mask.to(self.attn.dtype)], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **with_cache(self.model, self.cache),
        )
        self.cache = cache_of(out)
        return out.logits[:, -1]


def stepper_for(model, dtype: torch.dtype, max_new_tokens: int, lean: bool):
    """The lean step (grpolab.engine.native.decoder) where the model is one it supports and `lean`, else HFStepper."""
    from grpolab.engine.native import decoder

    w = decoder.weights_of(model, dtype) if lean else None
    return decoder.LeanStepper(w, max_new_tokens) if w is not None else HFStepper(model)
