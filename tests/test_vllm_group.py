"""The tensor-parallel group's protocol (grpolab.engine.vllm_group) without vLLM: two gloo processes whose
calls are paired round by round however many each makes, each getting back exactly its own outputs, and
the group's generate run the same number of times, on the same list, in both (external_launcher's rule)."""

from __future__ import annotations

import json
import os

import torch.multiprocessing as mp
from e2e_helpers import free_port

from grpolab.engine.vllm_group import LEFT, own_slice


def test_own_slice_counts_the_members_before_it_and_skips_those_that_left():
    parts = [[1, 2], LEFT, [3], [4, 5, 6]]
    assert own_slice(parts, 0) == slice(0, 2)
    assert own_slice(parts, 1) == slice(2, 2)  # a member that left has no requests
    assert own_slice(parts, 2) == slice(2, 3)
    assert own_slice(parts, 3) == slice(3, 6)


def _member(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from grpolab.engine.vllm_group import TensorGroup

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    seen = []  # every list the group's generate ran on, in order

    def generate(requests):
        seen.append(list(requests))
        return [f"out:{r}" for r in requests]

    group = TensorGroup(2, generate)
    got = {}
    # a rollout: rank 0 makes three calls (its turns), rank 1 one
    with group.together():
        calls = [[f"a{rank}"], [f"b{rank}", f"c{rank}"], [f"d{rank}"]] if rank == 0 else [[f"a{rank}"]]
        got["turns"] = [group.call(c) for c in calls]
    # an evaluation: rank 0 alone asks, in two nested operations (its rollouts inside the evaluation)
    with group.together():
        if rank == 0:
            with group.together():
                got["eval"] = [group.call(["e0"]), group.call([])]
            with group.together():
                got["eval"].append(group.call(["f0", "g0"]))
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"got": got, "seen": seen}, f)


def test_calls_pair_up_round_by_round_and_each_member_keeps_its_own(tmp_path):
    port = free_port()
    out = str(tmp_path / "member")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_member, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0], "a member failed or the group deadlocked"
    zero, one = (json.load(open(f"{out}.{r}")) for r in range(2))
    assert zero["got"]["turns"] == [["out:a0"], ["out:b0", "out:c0"], ["out:d0"]]
    assert one["got"]["turns"] == [["out:a1"]]
    assert zero["got"]["eval"] == [["out:e0"], [], ["out:f0", "out:g0"]]
    assert "eval" not in one["got"]
    # external_launcher's rule: both members ran the same generate calls on the same lists, in order
    assert zero["seen"] == one["seen"] == [["a0", "a1"], ["b0", "c0"], ["d0"], ["e0"], ["f0", "g0"]]
