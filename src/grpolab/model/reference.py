"""The reference policy pi_ref of the KL term (algo.beta > 0): whatever it is, one way to use it.

    with run.ref.model() as ref:          # a model to run without gradients
        ref_logp = logp_without_grad(run.pass_spec(), ref, rollout)   # grpolab.model.passes

Two kinds, chosen by `reference_for(policy)`:

  * FrozenCopy: a deep copy of the policy at the start of training, frozen (full fine-tuning). It
    costs a second copy of the weights. When its passes run under autocast, its linear layers keep
    their weights in the autocast dtype (`store_linear_in`): autocast would cast them to it at every
    pass anyway, so the log-probs are the same bit for bit, the copy takes half the memory for them,
    and no pass re-casts them.
  * AdapterOff: under LoRA the base weights never change, so pi_ref is the policy itself with its
    adapter disabled (peft's `disable_adapter()`): the same network, no second copy. The log-probs
    are those of the base model, bit for bit.
"""

from __future__ import annotations

import contextlib

import torch

from grpolab.model.load import frozen_copy
from grpolab.model.lora import is_peft


class FrozenCopy:
    """pi_ref as a frozen copy of the policy's initial weights."""

    def __init__(self, policy):
        self.frozen = frozen_copy(policy)

    @contextlib.contextmanager
    def model(self):
        yield self.frozen

    def store_linear_in(self, dtype: torch.dtype) -> int:
        """Convert the copy's nn.Linear layers to `dtype`, except those sharing a parameter with another
        module (a head tied to the embeddings, whose lookup must stay in the model's dtype). Returns the
        number of parameters converted. Only for a copy whose passes run under autocast to `dtype`."""
        users: dict[int, int] = {}
        for module in self.frozen.modules():
            for p in module.parameters(recurse=False):
                users[id(p)] = users.get(id(p), 0) + 1
        converted = 0
        for module in self.frozen.modules():
            own = list(module.parameters(recurse=False))
            if type(module) is torch.nn.Linear and all(users[id(p)] == 1 for p in own):
                module.to(dtype)
                converted += sum(p.numel() for p in own)
        return converted


class AdapterOff:
    """pi_ref as the LoRA policy with its adapter disabled (the base model), in eval mode for the pass."""

    def __init__(self, policy):
        self.policy = policy

    @contextlib.contextmanager
    def model(self):
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.disable_adapter():
                yield self.policy
        finally:
            self.policy.train(was_training)


def reference_for(policy) -> FrozenCopy | AdapterOff:
    """The reference of a run that trains `policy`: its base with the adapter off under LoRA, else a frozen copy."""
    return AdapterOff(policy) if is_peft(policy) else FrozenCopy(policy)


__all__ = ["AdapterOff", "FrozenCopy", "reference_for"]
