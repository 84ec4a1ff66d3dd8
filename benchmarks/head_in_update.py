"""Seconds of the LM head's forward and backward (grpolab.model.lmhead) inside grpolab's update on a bench setting.

    .venv/bin/python benchmarks/head_in_update.py --setting b [--updates 4]
    PYTHONPATH=/path/to/a/worktree/src .venv/bin/python benchmarks/head_in_update.py --setting b   # another commit

Builds the Run `grpolab bench` builds (grpolab.app.bench.ours.setup_run), makes one training step, then runs
`grpolab.training.step.update` on that step's batch --updates more times, timing `_ChunkedTokenLogp`'s forward and
backward inside each (the update's own pass, with its entropies, under the run's autocast). Prints each
update and the medians over all but the first. To compare commits on one machine, alternate the two runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    from grpolab.app.bench.ours import setup_run
    from grpolab.app.bench.spec import parse_spec
    from grpolab.model import lmhead
    from grpolab.training import step as S

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--updates", type=int, default=4)
    own, rest = ap.parse_known_args(argv)
    run = setup_run(parse_spec(rest), tempfile.mkdtemp(prefix="grpolab-head-") + "/run")
    _, batch = S.train_step(run, 1)
    fn = lmhead._ChunkedTokenLogp
    spent = {"forward": 0.0, "backward": 0.0}
    forward, backward = fn.forward, fn.backward

    def timed(name, f):
        def wrapper(ctx, *args):
            t = time.perf_counter()
            out = f(ctx, *args)
            spent[name] += time.perf_counter() - t
            return out
        return staticmethod(wrapper)

    fn.forward, fn.backward = timed("forward", forward), timed("backward", backward)
    rows = []
    for i in range(own.updates):
        spent.update(forward=0.0, backward=0.0)
        t = time.perf_counter()
        S.update(run, batch)
        rows.append((time.perf_counter() - t, spent["forward"], spent["backward"]))
        print(f"update {i + 1}: {rows[-1][0]:.2f} s, head forward {rows[-1][1]:.3f} s, backward {rows[-1][2]:.3f} s")
    steady = rows[1:] or rows
    print(f"medians of updates 2-{len(rows)}: update {statistics.median(r[0] for r in steady):.2f} s, "
          f"head forward {statistics.median(r[1] for r in steady):.3f} s, "
          f"backward {statistics.median(r[2] for r in steady):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
