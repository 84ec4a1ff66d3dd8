"""The advantage component the training step uses, per step: a group baseline (below) or a critic
(grpolab.model.critic.Critic). The contract names the step's types (Batch, the model's PassSpec), so it
lives with the step and not with the maths it calls (grpolab.algo.advantages)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

from grpolab.algo.advantages import compute_advantages

if TYPE_CHECKING:
    from grpolab.algo.presets import AlgoConfig
    from grpolab.batch import Batch, GroupSlice
    from grpolab.model.passes import PassSpec


@runtime_checkable
class AdvantageComponent(Protocol):
    """What the training step (grpolab.training.step) asks of `run.advantage`, per step:

        adv = targets(spec, batch)                       A (N,) or (N, C), no grad
        loss, info = add_loss(policy_loss, spec, part, batch)   per micro-batch, before backward
        step(max_grad_norm)   after the policy's optimizer step, or discard() when it was skipped

    `spec` is the grpolab.model.passes.PassSpec of the component's own model passes (a critic's);
    `part` a grpolab.batch.GroupSlice. The checkpoint saves state_dict() beside the policy.
    GroupBaseline (below) and grpolab.model.critic.Critic satisfy it.
    """

    computes_every_group: bool
    """True when add_loss needs every group, also those whose policy advantages are all 0."""

    def targets(self, spec: PassSpec, batch: Batch) -> Tensor: ...

    def add_loss(self, loss: Tensor, spec: PassSpec, part: GroupSlice, batch: Batch) -> tuple[Tensor, dict]: ...

    def step(self, max_grad_norm: float) -> None: ...

    def discard(self) -> None: ...

    def trained_params(self) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class GroupBaseline:
    """Advantages of every method without a value model: compute_advantages of the shaped sequence
    rewards. It has no parameters and no state; it is an AdvantageComponent like the critic
    (grpolab.model.critic.Critic), so the step has no branch for either."""

    computes_every_group = False
    """A group whose advantages are all 0 adds nothing to the loss and need not be computed."""

    def __init__(self, algo: AlgoConfig):
        self.algo = algo

    def targets(self, spec: PassSpec, batch: Batch) -> Tensor:
        """A (N,) from batch.reward (N,) in groups of G (no model pass: `spec` is unused)."""
        return compute_advantages(batch.reward, batch.rollout.G, self.algo)  # (N,)

    def add_loss(self, loss: Tensor, spec: PassSpec, part: GroupSlice, batch: Batch) -> tuple[Tensor, dict]:
        """No value loss: the policy loss as it is."""
        return loss, {}

    def step(self, max_grad_norm: float) -> None:
        """No optimiser to step."""

    def discard(self) -> None:
        """Nothing to discard when an update is skipped."""

    def trained_params(self) -> int:
        return 0

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
