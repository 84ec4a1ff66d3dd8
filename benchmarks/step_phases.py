"""grpolab's own step on a bench setting, in this process: generation, update and step seconds.

    .venv/bin/python benchmarks/step_phases.py --setting a [any grpolab bench flag]
    PYTHONPATH=/path/to/a/worktree/src .venv/bin/python benchmarks/step_phases.py --setting a   # another commit
    .venv/bin/python benchmarks/step_phases.py --setting b --cpu-malloc system   # the config key cpu_malloc
    .venv/bin/python benchmarks/step_phases.py --setting a --steps 10 --per-step  # resident memory per step

The same Run as `grpolab bench` builds (grpolab.app.bench.ours.setup_run: every completion forced to the
full length, the bench's reward), --steps steps (default 4); prints the medians of steps 2 on of
time/generate_s, time/update_s and time/step_s, and the process's peak RSS; with --per-step also each
step's time and current RSS. For comparing commits side by side on one machine: alternate them
(worktrees on PYTHONPATH), since one machine's speed drifts over minutes.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile


def resident_mb() -> float:
    """The process's resident memory now (VmRSS), MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def main(argv: list[str]) -> int:
    from grpolab.app.bench.ours import setup_run
    from grpolab.app.bench.spec import parse_spec
    from grpolab.training import step as S

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--cpu-malloc", choices=("keep", "system"))  # unset: the default (and older commits work)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--per-step", action="store_true")
    own, rest = ap.parse_known_args(argv)
    overrides = {"cpu_malloc": own.cpu_malloc} if own.cpu_malloc else {}
    run = setup_run(parse_spec(rest), tempfile.mkdtemp(prefix="grpolab-phases-") + "/run", **overrides)
    ts = []
    for step in range(1, own.steps + 1):
        ts.append(S.train_step(run, step)[0])
        if own.per_step:
            print(f"step {step}: {ts[-1]['time/step_s']:.2f} s, RSS {resident_mb():.0f} MB")

    def med(key: str) -> float:
        return statistics.median(m[key] for m in ts[1:])

    print(f"gen {med('time/generate_s'):.2f} update {med('time/update_s'):.2f} step {med('time/step_s'):.2f} "
          f"peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
