"""The reference policy pi_ref of the KL term (algo.beta > 0): whatever it is, one way to use it.

    with run.ref.model() as ref:          # a model to run without gradients
        ref_logp = logp_without_grad(run.pass_spec, ref, rollout)     # grpolab.model.passes

Whether there is one and which kind is `reference_kind(beta, adaptive_kl, lora_r)` (the trainer builds
it with `reference_for`, grpolab plan counts its bytes):

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

from grpolab.model.load import frozen_copy, prepare_policy
from grpolab.model.lora import is_peft


class FrozenCopy:
    """pi_ref as a frozen copy of the policy's initial weights."""

    def __init__(self, policy, given=None):
        """A frozen copy of `policy`; or `given`, a copy of the policy's initial weights the caller made and holds
        (TRL's trainer.ref_model), made ready in place as the policy was (prepare_policy: fp32, the policy's
        device, grpolab's attention) and frozen, so that what the caller holds is the reference the run uses."""
        if given is None:
            self.frozen = frozen_copy(policy)
            return
        self.frozen = prepare_policy(given, next(policy.parameters()).device).requires_grad_(False).eval()
        if _shapes(self.frozen) != _shapes(policy):
            raise ValueError("reference: the given model's weights are not the policy's (names or shapes differ)")

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

    def sync(self, policy, alpha: float) -> None:
        """TR-DPO's soft reference update (mix_into): pi_ref <- alpha pi_theta + (1 - alpha) pi_ref."""
        mix_into(self.frozen, policy, alpha)

    def state_dict(self) -> dict:
        """The copy's weights: saved as reference.pt in each checkpoint once they can move (sync_ref_model)."""
        return self.frozen.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.frozen.load_state_dict(state)


@torch.no_grad()
def mix_into(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """theta_target <- alpha theta_source + (1 - alpha) theta_target, parameter by parameter (TR-DPO,
    Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment", eq. 3, the soft update;
    TRL 1.16: trl/trainer/callbacks.py, SyncRefModelCallback._sync_target_model). Computed in fp32 and
    stored in each target parameter's own dtype (a reference kept in bf16 is rounded once per update)."""
    pairs = list(zip(target.parameters(), source.parameters(), strict=True))
    for t, src in pairs:
        if t.shape != src.shape:
            raise ValueError(f"reference and policy differ in shape: {tuple(t.shape)} vs {tuple(src.shape)}")
        t.copy_(t.float().mul(1.0 - alpha).add_(src.detach().float(), alpha=alpha))


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


def synced_reference(ref, sharded: bool = False) -> FrozenCopy:
    """`ref` when algo.sync_ref_model can update it (a FrozenCopy in one piece); else a ConfigError (exit 2)."""
    if not isinstance(ref, FrozenCopy) or sharded:
        from grpolab.util.fields import ConfigError

        raise ConfigError(
            "algo.sync_ref_model: the reference must be its own copy of the weights to be updated, "
            "but with lora.r > 0 it is the policy with its adapter off (and under fsdp a sharded "
            "copy); use algo.sync_ref_model=false, or full fine-tuning without fsdp"
        )
    return ref


def reference_kind(beta: float, adaptive_kl: bool, lora_r: int) -> str:
    """The reference a run needs: "none" without a KL term (beta = 0 and beta not adapted), else
    "adapter_off" under LoRA (lora_r > 0: the base weights never change) or "copy" (full fine-tuning)."""
    if not (beta > 0 or adaptive_kl):
        return "none"
    return "adapter_off" if lora_r > 0 else "copy"


REFERENCES = {"copy": FrozenCopy, "adapter_off": AdapterOff}
"""Each kind of reference_kind but "none", and the class that holds it."""


def _shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def reference_for(policy, kind: str, given=None) -> FrozenCopy | AdapterOff | None:
    """The reference of `kind` (reference_kind) for a run that trains `policy`: None, a frozen copy, or
    the policy with its adapter off (a peft policy). given: the caller's own copy of the policy's initial
    weights (TRL's trainer.ref_model), used as the frozen copy (FrozenCopy); only for kind "copy"."""
    if kind == "none":
        return None
    if kind == "adapter_off" and not is_peft(policy):
        raise ValueError("reference_for: adapter_off needs the LoRA (peft) policy; this one has no adapter")
    if given is not None and kind != "copy":
        raise ValueError(f"reference_for: a given reference model serves as a frozen copy, not as {kind}")
    return FrozenCopy(policy, given) if given is not None else REFERENCES[kind](policy)


__all__ = ["AdapterOff", "FrozenCopy", "mix_into", "reference_for", "reference_kind", "synced_reference"]
