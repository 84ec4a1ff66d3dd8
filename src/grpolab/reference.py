"""The reference policy pi_ref of the KL term (algo.beta > 0): whatever it is, one way to use it.

    with run.ref.model() as ref:          # a model to run without gradients
        ref_logp = logp_without_grad(run, ref, rollout)

Two kinds, chosen by `reference_for(policy)`:

  * FrozenCopy: a deep copy of the policy at the start of training, frozen (full fine-tuning). It
    costs a second copy of the weights.
  * AdapterOff: under LoRA the base weights never change, so pi_ref is the policy itself with its
    adapter disabled (peft's `disable_adapter()`): the same network, no second copy. The log-probs
    are those of the base model, bit for bit.
"""

from __future__ import annotations

import contextlib

from grpolab.lora import is_peft
from grpolab.models import frozen_copy


class FrozenCopy:
    """pi_ref as a frozen copy of the policy's initial weights."""

    def __init__(self, policy):
        self.frozen = frozen_copy(policy)

    @contextlib.contextmanager
    def model(self):
        yield self.frozen


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
