"""grpolab's own step on a bench setting, in this process: generation, update and step seconds.

    .venv/bin/python benchmarks/step_phases.py --setting a [any grpolab bench flag]
    PYTHONPATH=/path/to/a/worktree/src .venv/bin/python benchmarks/step_phases.py --setting a   # another commit

The same Run as `grpolab bench` builds (grpolab.bench.ours.setup_run: every completion forced to the
full length, the bench's reward), 4 steps; prints the medians of steps 2-4 of time/generate_s,
time/update_s and time/step_s, and the process's peak RSS. For comparing commits side by side on
one machine: alternate them (worktrees on PYTHONPATH), since one machine's speed drifts over minutes.
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile


def main(argv: list[str]) -> int:
    from grpolab import step as S
    from grpolab.bench.ours import setup_run
    from grpolab.bench.spec import parse_spec

    run = setup_run(parse_spec(argv), tempfile.mkdtemp(prefix="grpolab-phases-") + "/run")
    ts = [S.train_step(run, step)[0] for step in range(1, 5)]

    def med(key: str) -> float:
        return statistics.median(m[key] for m in ts[1:])

    print(f"gen {med('time/generate_s'):.2f} update {med('time/update_s'):.2f} step {med('time/step_s'):.2f} "
          f"peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
