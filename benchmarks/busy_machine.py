"""The demo's step alone and beside busy processes, for thread settings side by side.

    .venv/bin/python benchmarks/busy_machine.py --steps 4 --skip 1 --busy 2 --json busy.json
    .venv/bin/python benchmarks/busy_machine.py --variants "before:thread_wait=openmp,threads=CORES default:"
    .venv/bin/python benchmarks/busy_machine.py --policies openmp,auto,passive --rounds 2 KEY=VALUE ...

Runs `grpolab train RECIPE steps=N eval_size=0` (default recipes/demo.yaml) once per variant alone and
once beside --busy single-threaded processes spinning (`python -c "while True: pass"`, started before
the run and killed after it), interleaved: every variant alone, then every variant loaded, per round.
A variant is NAME:KEY=VALUE,... (config overrides; CORES stands for this machine's core count); the
default pair is `before` (thread_wait=openmp, OpenMP's own wait, and threads=CORES: what grpolab did before
either key decided anything) against `default` (no override: what a run gets now). --policies P,Q is
short for variants that set only thread_wait. Each run is a fresh process (the wait policy is read once,
when torch starts), with OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME and OMP_NUM_THREADS removed from
its environment so that the config alone decides. Prints per variant the median of time/step_s over steps
--skip+1..N (the same steps for every run), loaded / alone, and each variant against the first one
(alone and loaded), and writes all of it, with every step's time, the run's first line and the load
average before each run, to --json.

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


def run_once(recipe: str, steps: int, variant: str, overrides: list[str], out: Path, busy: int) -> dict:
    """One `grpolab train` process; its step times (time/step_s) and its first line."""
    env = {k: v for k, v in os.environ.items() if k not in (*USER_VARS, "OMP_NUM_THREADS")}
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
    return {"variant": variant, "busy": busy, "step_s": times, "wall_s": wall, "load_before": load, "first_line": first}


def median_of(runs: list[dict], skip: int) -> float:
    return statistics.median(t for r in runs for t in r["step_s"][skip:])


def parse_variants(text: str) -> dict[str, list[str]]:
    """NAME:KEY=VALUE,KEY=VALUE ... (space-separated) -> {NAME: overrides}; CORES becomes the core count."""
    out = {}
    for item in text.split():
        name, _, over = item.partition(":")
        out[name] = [o.replace("CORES", str(os.cpu_count() or 1)) for o in over.split(",") if o]
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    ap.add_argument("--steps", type=int, default=3, help="steps per run (default 3)")
    ap.add_argument("--skip", type=int, default=0, help="first steps of each run left out of the medians")
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs (default 2)")
    ap.add_argument(
        "--variants",
        default="before:thread_wait=openmp,threads=CORES default:",
        help="NAME:KEY=VALUE,... per variant, space-separated; the first is the baseline",
    )
    ap.add_argument(
        "--loaded-only-for",
        metavar="NAMES",
        help="NAME,...: run only these variants beside the busy processes (the others alone only)",
    )
    ap.add_argument("--policies", help="P,Q,...: variants that set only thread_wait (replaces --variants)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="write the result as JSON")
    ap.add_argument(
        "--results",
        metavar="FILE",
        help="append entries for docs/results.md (benchmarks/results/entries.jsonl): each variant loaded "
        "against alone, and each variant alone against the first",
    )
    ap.add_argument("overrides", nargs="*", default=["precision=bf16"], help="KEY=VALUE for every run")
    ns = ap.parse_args(argv)
    if ns.steps <= ns.skip:
        ap.error("--steps must exceed --skip")
    variants = {p: [f"thread_wait={p}"] for p in ns.policies.split(",")} if ns.policies else parse_variants(ns.variants)
    policies = list(variants)
    loaded = ns.loaded_only_for.split(",") if ns.loaded_only_for else policies
    runs: dict[tuple[str, int], list[dict]] = {
        (p, b): [] for p in policies for b in (0, ns.busy) if b == 0 or p in loaded
    }
    with tempfile.TemporaryDirectory(prefix="busy-machine-") as tmp:
        for r in range(ns.rounds):
            for half, busy in enumerate((0, ns.busy)):  # --busy 0: every variant alone twice per round
                for p in policies if busy == 0 else loaded:
                    out = Path(tmp) / f"{p}-{busy}-{r}-{half}"
                    res = run_once(ns.recipe, ns.steps, p, [*ns.overrides, *variants[p]], out, busy)
                    runs[(p, busy)].append(res)
                    print(
                        f"round {r + 1} {p:8} busy={busy}: step s {[round(t, 2) for t in res['step_s']]} "
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
    print(f"{'variant':12}{'alone':>9}{'loaded':>9}{'loaded/alone':>14}{'alone/' + base:>16}{'loaded/' + base:>16}")
    rows = {}
    nan = float("nan")
    for p in policies:
        a, b = med[(p, 0)], med.get((p, ns.busy), nan)
        rows[p] = {
            "alone_s": a,
            "loaded_s": b,
            "loaded_over_alone": b / a,
            "alone_over_base": a / med[(base, 0)],
            "loaded_over_base": b / med.get((base, ns.busy), nan),
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
        "variants": variants,
        "cores": os.cpu_count(),
        "summary": rows,
        "runs": [r for v in runs.values() for r in v],
    }
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    if ns.results:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import results

        steps = f"demo, steps {ns.skip + 1}-{ns.steps}"
        entries = []
        for p, row in rows.items():
            how = f"{p} ({' '.join(variants[p]) or 'no override'})"
            if p in loaded:
                entries.append(
                    results.entry(
                        "busy-step", f"{steps}, {ns.busy} busy processes, {how}", row["loaded_s"], row["alone_s"]
                    )
                )
            if p != base:
                entries.append(
                    results.entry(
                        "threads-alone", f"{steps}, alone, {how} against {base}", row["alone_s"], med[(base, 0)]
                    )
                )
        results.record(ns.results, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
