"""Sandbox throughput: candidates per second through grpolab.sandbox.run_many, and one run's latency.

Candidates are the reference solutions of the built-in code problems (2-5 tests each), twice over.
The machine's load average is printed with each measurement: other jobs on the same cores lower
the numbers (docs/security.md quotes ~40 candidates/s on 2 idle cores).

    python benchmarks/bench_sandbox.py [--repeats 3] [--sequential 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from grpolab import sandbox as sb
from grpolab.rewards.code import convert_tests
from grpolab.tasks.code import load_problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sequential", type=int, default=20, help="runs for the single-candidate latency")
    ap.add_argument("--json", help="append the result to this JSON-lines file (benchmarks/results.py)")
    args = ap.parse_args(argv)
    iso = sb.check_isolation("best_effort")
    print(f"isolation: {iso.describe()}; MAX_PARALLEL = {sb.MAX_PARALLEL}; cpus = {os.cpu_count()}")
    jobs = [(p["solution"], convert_tests(p["tests"], p["entry_point"])) for p in load_problems(None)] * 2
    sb.run_many(jobs[:4])  # warm up (lease uids, create cgroups, compute the root plan)
    lat = []
    c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    for code, tests in jobs[: args.sequential]:
        t = time.monotonic()
        assert sb.run_tests(code, tests).fraction == 1.0
        lat.append(time.monotonic() - t)
    c1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    lat.sort()
    print(
        f"latency of one candidate, sequential ({len(lat)} runs): median {statistics.median(lat):.3f} s, "
        f"p90 {lat[int(0.9 * (len(lat) - 1))]:.3f} s  (load average {os.getloadavg()[0]:.2f})"
    )
    # CPU time of every process of a run (the kernel adds the namespace's processes to its init's
    # children, and the init to unshare's): what bounds throughput on idle cores, whatever the load
    cpu = sum(getattr(c1, f) - getattr(c0, f) + getattr(s1, f) - getattr(s0, f) for f in ("ru_utime", "ru_stime"))
    per = cpu / len(lat)
    print(
        f"CPU per candidate (all its processes and the trainer's share): {per * 1000:.1f} ms, so at most "
        f"{os.cpu_count() / per:.0f} candidates/s on {os.cpu_count()} idle cores"
    )
    rates, loads = [], []
    for _ in range(args.repeats):
        load = os.getloadavg()[0]
        t = time.monotonic()
        res = sb.run_many(jobs)
        wall = time.monotonic() - t
        assert all(r.fraction == 1.0 for r in res), [r.details for r in res if r.fraction != 1.0][:3]
        print(
            f"run_many: {len(jobs)} candidates in {wall:.2f} s = {len(jobs) / wall:.1f} candidates/s "
            f"(load average before {load:.2f})"
        )
        rates.append(len(jobs) / wall)
        loads.append(load)
    if args.json:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import results

        setting = (
            f"{len(jobs)} candidates, {sb.MAX_PARALLEL} slots, load {min(loads):.1f}-{max(loads):.1f} "
            f"(median of {len(rates)})"
        )
        results.record(
            args.json,
            [results.entry("sandbox", setting, statistics.median(rates), None, interval=[min(rates), max(rates)])],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
