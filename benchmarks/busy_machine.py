"""The demo's step alone and beside busy processes, for two thread wait policies side by side.

    .venv/bin/python benchmarks/busy_machine.py --steps 3 --busy 2 --json busy.json
    .venv/bin/python benchmarks/busy_machine.py --policies openmp,auto,passive --rounds 2 steps... KEY=VALUE

Runs `grpolab train RECIPE steps=N eval_size=0` (default recipes/demo.yaml) once per policy (the config
key thread_wait; `openmp` is OpenMP's own default, what grpolab did before thread_wait existed) alone and
once beside --busy single-threaded processes spinning (`python -c "while True: pass"`, started before
the run and killed after it), interleaved: every policy alone, then every policy loaded, per round.
Each run is a fresh process (the wait policy is read once, when torch starts), with OMP_WAIT_POLICY,
GOMP_SPINCOUNT and KMP_BLOCKTIME removed from its environment so that the config key alone decides.
Prints per policy the median of time/step_s over steps --skip+1..N (the same steps for every run),
loaded / alone, and each policy against the first one (alone and loaded), and writes all of it,
with every step's time and the load average before each run, to --json.

precision=bf16 by default (an override like any other): precision=auto measures at start, and on a
loaded machine its choice could differ between the runs being compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpolab.util.procs import busy_processes  # noqa: E402
from grpolab.util.threads import USER_VARS  # noqa: E402


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def run_once(recipe: str, steps: int, policy: str, overrides: list[str], out: Path, busy: int) -> dict:
    """One `grpolab train` process; its step times (time/step_s) and its first line."""
    env = {k: v for k, v in os.environ.items() if k not in USER_VARS}
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [
        sys.executable,
        "-m",
        "grpolab.app.cli",
        "train",
        recipe,
        f"steps={steps}",
        "eval_size=0",
        f"out={out}",
        f"thread_wait={policy}",
        "progress=false",
        "report=false",
        "tensorboard=false",
        *overrides,
    ]
    load = load_average()
    t0 = time.perf_counter()
    with busy_processes(busy):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"busy_machine: {' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    times = [json.loads(line)["time/step_s"] for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    first = next((ln for ln in proc.stdout.splitlines() if ln.startswith("threads:")), "")
    return {"policy": policy, "busy": busy, "step_s": times, "wall_s": wall, "load_before": load, "first_line": first}


def median_of(runs: list[dict], skip: int) -> float:
    return statistics.median(t for r in runs for t in r["step_s"][skip:])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    ap.add_argument("--steps", type=int, default=3, help="steps per run (default 3)")
    ap.add_argument("--skip", type=int, default=0, help="first steps of each run left out of the medians")
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs (default 2)")
    ap.add_argument("--policies", default="openmp,auto", help="thread_wait values, the first is the baseline")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="write the result as JSON")
    ap.add_argument("overrides", nargs="*", default=["precision=bf16"], help="KEY=VALUE for every run")
    ns = ap.parse_args(argv)
    if ns.steps <= ns.skip:
        ap.error("--steps must exceed --skip")
    policies = ns.policies.split(",")
    runs: dict[tuple[str, int], list[dict]] = {(p, b): [] for p in policies for b in (0, ns.busy)}
    with tempfile.TemporaryDirectory(prefix="busy-machine-") as tmp:
        for r in range(ns.rounds):
            for busy in (0, ns.busy):
                for p in policies:
                    out = Path(tmp) / f"{p}-{busy}-{r}"
                    res = run_once(ns.recipe, ns.steps, p, ns.overrides, out, busy)
                    runs[(p, busy)].append(res)
                    print(
                        f"round {r + 1} thread_wait={p:8} busy={busy}: step s {[round(t, 2) for t in res['step_s']]} "
                        f"(load before {res['load_before']})",
                        file=sys.stderr,
                        flush=True,
                    )
    med = {k: median_of(v, ns.skip) for k, v in runs.items()}
    base = policies[0]
    print(
        f"median s/step over steps {ns.skip + 1}..{ns.steps}, {ns.rounds} round(s); loaded = beside {ns.busy} busy "
        f"processes; {os.cpu_count()} cores"
    )
    print(f"{'thread_wait':12}{'alone':>9}{'loaded':>9}{'loaded/alone':>14}{'alone/' + base:>16}{'loaded/' + base:>16}")
    rows = {}
    for p in policies:
        a, b = med[(p, 0)], med[(p, ns.busy)]
        rows[p] = {
            "alone_s": a,
            "loaded_s": b,
            "loaded_over_alone": b / a,
            "alone_over_base": a / med[(base, 0)],
            "loaded_over_base": b / med[(base, ns.busy)],
        }
        print(
            f"{p:12}{a:9.2f}{b:9.2f}{b / a:14.2f}{rows[p]['alone_over_base']:16.3f}{rows[p]['loaded_over_base']:16.3f}"
        )
    result = {
        "recipe": ns.recipe,
        "steps": ns.steps,
        "skip": ns.skip,
        "busy": ns.busy,
        "rounds": ns.rounds,
        "overrides": ns.overrides,
        "cores": os.cpu_count(),
        "summary": rows,
        "runs": [r for v in runs.values() for r in v],
    }
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
