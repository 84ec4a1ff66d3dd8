"""Tool time of one turn under the tool-time budgets (issue 30's liveness case).

Every trajectory's turn makes `--calls` python calls that each sleep 10 s (in the sandbox, under the
python tool's own 5 s limit), all trajectories at once, through grpolab.env.run_turns with the budgets of
grpolab.env.budget. Prints the turn's wall time, the events counted, and the env/tool_* metrics. The
review measured the same turn without budgets at 82 s for one trajectory and 160 s for four on 2 slots.

    python benchmarks/tool_budget.py [--trajectories 32] [--calls 16] [--per-trajectory-s 60] [--per-step-s 300]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from grpolab.env import load_environment, run_turns
from grpolab.env.budget import DEFAULT_STEP_S, DEFAULT_TRAJECTORY_S, ToolBudget
from grpolab.sandbox import SLOTS

CALL = '<tool_call>{"name": "python", "arguments": {"code": "import time\\ntime.sleep(10)"}}</tool_call>'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--calls", type=int, default=16, help="sleeping python calls in each trajectory's turn")
    ap.add_argument("--per-trajectory-s", type=float, default=DEFAULT_TRAJECTORY_S)
    ap.add_argument("--per-step-s", type=float, default=DEFAULT_STEP_S)
    args = ap.parse_args(argv)
    make = load_environment("calculator_python", timeout_s=5.0, max_result_chars=2000)
    envs = [make() for _ in range(args.trajectories)]
    for env in envs:
        env.reset({})
    budget = ToolBudget(len(envs), args.per_trajectory_s, args.per_step_s)
    t0 = time.monotonic()
    replies = run_turns(envs, [CALL * args.calls] * len(envs), clocks=budget.clocks)
    wall = time.monotonic() - t0
    events: Counter = Counter()
    for r in replies:
        events.update(r.events)
    print(json.dumps({"wall_s": round(wall, 1), "sandbox_slots": SLOTS.n, "loadavg": os.getloadavg()[0],
                      "events": dict(events), **{k: round(v, 1) for k, v in budget.metrics().items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
