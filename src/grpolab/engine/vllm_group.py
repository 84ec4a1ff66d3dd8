"""vLLM's tensor parallelism in colocate mode, as TRL runs it: the processes of a torchrun launch in
groups of `size` consecutive ranks, each group one vLLM whose weights are sharded over its members
(distributed_executor_backend="external_launcher": every member makes the same generate calls on the
same requests, in step).

    a call        every member's requests gathered in the group (all_gather_object), generated as one
                  list, each member keeping its own slice (TRL: the prompts gathered, then tp_slice)
    an operation  a rollout, a multi-turn rollout, an evaluation: the members make different numbers of
                  calls (a rank's turns end when its trajectories do; rank 0 alone evaluates), so a
                  member leaving an operation serves the others' calls until every member has left it
                  (`together`), and the calls of the members stay paired round by round

A member's contribution to a round is its requests, or LEFT once it has left the operation; a round in
which every member has left ends the operation for all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from grpolab.engine.settings import EngineError

LEFT = None  # a member's contribution to a round after it has left the operation


def own_slice(parts: list[list | None], member: int) -> slice:
    """Where member `member`'s requests are in the concatenation of the round's parts (LEFT counts 0)."""
    start = sum(len(p) for p in parts[:member] if p is not LEFT)
    return slice(start, start + len(parts[member] or []))


class TensorGroup:
    """This process's tensor-parallel group: `generate(requests) -> outputs`, one output per request in
    their order, runs vLLM's generate on what the round gathered."""

    def __init__(self, size: int, generate: Callable[[list], list]):
        import torch.distributed as dist

        world = dist.get_world_size()
        if world % size:
            raise EngineError(
                f"rollout.vllm_tensor_parallel_size={size} does not divide the launch's {world} processes; "
                f"use a divisor of {world}"
            )
        ranks = [list(range(i * size, (i + 1) * size)) for i in range(world // size)]
        self.group, _ = dist.new_subgroups_by_enumeration(ranks)
        self.size, self.member = size, dist.get_rank() % size
        self.generate = generate
        self.depth = 0  # operations entered and not left (an evaluation's rollouts are inside it)

    def _round(self, mine: list | None) -> list[list | None]:
        import torch.distributed as dist

        parts: list = [None] * self.size
        dist.all_gather_object(parts, mine, group=self.group)
        return parts

    def _run(self, parts: list[list | None]) -> list:
        flat = [r for p in parts if p is not LEFT for r in p]
        return self.generate(flat) if flat else []

    def call(self, requests: list) -> list:
        """This member's requests generated with the other members' of the same round; its outputs."""
        parts = self._round(list(requests))
        return self._run(parts)[own_slice(parts, self.member)]

    @contextmanager
    def together(self) -> Iterator[None]:
        """An operation: on leaving the outermost one, serve the others' calls until every member has left."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                while True:
                    parts = self._round(LEFT)
                    if all(p is LEFT for p in parts):
                        break
                    self._run(parts)


def keep_launchers_process_group() -> None:
    """vLLM's shutdown (when the engine closes) ends with torch.distributed.destroy_process_group()
    (vllm.distributed.parallel_state.destroy_distributed_environment): in one process that group is vLLM's
    own, under torchrun it is the launch's, which the trainer's last barrier and the user's script still
    use. From the first external_launcher start on, vLLM's teardown ends its own groups only."""
    from vllm.distributed import parallel_state

    if getattr(parallel_state.destroy_distributed_environment, "keeps_launchers_group", False):
        return

    def destroy_vllms_groups_only() -> None:
        if parallel_state._WORLD:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    destroy_vllms_groups_only.keeps_launchers_group = True
    parallel_state.destroy_distributed_environment = destroy_vllms_groups_only


__all__ = ["LEFT", "TensorGroup", "keep_launchers_process_group", "own_slice"]
