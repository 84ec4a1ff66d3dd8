"""The demo's step alone and beside busy processes, for thread settings side by side.

    .venv/bin/python benchmarks/busy_machine.py --steps 4 --skip 1 --busy 2 --json busy.json
    .venv/bin/python benchmarks/busy_machine.py --variants "before:thread_wait=openmp,threads=CORES default:"
    .venv/bin/python benchmarks/busy_machine.py --policies openmp,auto,passive --rounds 2 KEY=VALUE ...

Runs `grpolab train RECIPE steps=N eval_size=0` (default recipes/demo.yaml) once per variant alone and
once beside --busy single-threaded processes spinning (`python -c "while True: pass"`, started before
the run, or once it has written step --load-from-step K: load that arrives while it runs, and killed
after it), interleaved: every variant alone, then every variant loaded, per round.
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

Same work on every side (the default; --moving-weights turns it off): every run gets `lr=1e-30`, so that
each step computes exactly what the demo's step computes (rollout, scoring, forward, backward, AdamW)
while the weights stay bitwise where they were, and every run samples the same completions. Without it a
run's sampled tokens depend on its thread count through the update (the sums of a parallel reduction
depend on how many threads share them): a run on one thread and a run on two part after step 1, and from
then on their steps differ in work severalfold (the prompt groups with a reward signal, which the update
computes), which buries the cost of the load in the noise of the work. The
runs' work per step (tokens/generated, update/seqs_computed) is compared and printed: the medians are
reported as the same work only where every run agrees at every step.
"""

from __future__ import annotations

import argparse
import contextlib
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

SAME_WORK = "lr=1e-30"
"""Every step's computation with weights that stay bitwise (1e-30 times an AdamW step is below the last
bit of every weight), so that every run samples the same completions."""


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def steps_written(out: Path) -> int:
    try:
        return sum(1 for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        return 0


def run_train(
    cmd: list[str], env: dict, out: Path, busy: int, from_step: int, own_sessions: bool = True
) -> tuple[subprocess.CompletedProcess, float]:
    """The run, with `busy` processes beside it from the start (from_step 0) or from the moment its step
    `from_step` is written (load that arrives while it runs) to its end; and the CPU seconds (user +
    system) the run itself used, its children included."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, text=True)
        with contextlib.ExitStack() as load:
            started = False
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if busy and not started and steps_written(out) >= from_step:
                    load.enter_context(busy_processes(busy, own_sessions))
                    started = True
                time.sleep(0.1)
        stdout.seek(0)
        stderr.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, stdout.read(), stderr.read())
        return done, usage.ru_utime + usage.ru_stime


def run_once(
    recipe: str,
    steps: int,
    variant: str,
    overrides: list[str],
    out: Path,
    busy: int,
    from_step: int = 0,
    own_sessions: bool = True,
) -> dict:
    """One `grpolab train` process; its step times (time/step_s), the work of each step, the thread count
    each step ran with and its first line."""
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
    proc, cpu = run_train(cmd, env, out, busy, from_step, own_sessions)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"busy_machine: {' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    first = next((ln for ln in proc.stdout.splitlines() if ln.startswith("threads:")), "")
    return {
        "variant": variant,
        "busy": busy,
        "step_s": [m["time/step_s"] for m in rows],
        "work": [work_of(m) for m in rows],
        "threads": [m.get("threads") for m in rows],
        "wall_s": wall,
        "cores_used": cpu / wall,
        "load_before": load,
        "first_line": first,
    }


WORK_KEYS = ("tokens/generated", "update/seqs_computed")
"""What a step computes: the tokens sampled and the sequences the update ran through the policy."""


def work_of(metrics: dict) -> list:
    return [metrics.get(k) for k in WORK_KEYS]


def work_differences(runs: list[dict]) -> list[str]:
    """The runs whose work differs from the first run's at some step ("VARIANT busy=B: step S"), empty
    where every run computed the same tokens and sequences at every step."""
    first = runs[0]["work"]
    out = []
    for r in runs[1:]:
        steps = [i + 1 for i, (a, b) in enumerate(zip(first, r["work"])) if a != b]
        if steps or len(r["work"]) != len(first):
            out.append(f"{r['variant']} busy={r['busy']}: step {', '.join(map(str, steps)) or 'count'}")
    return out


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
        "--load-from-step",
        type=int,
        default=0,
        metavar="K",
        help="start the busy processes once a loaded run has written step K (default 0: before it starts); "
        "the medians then read the steps after --skip, so set --skip >= K + 1 to time the steps under load",
    )
    ap.add_argument(
        "--busy-groups",
        choices=("own", "shared"),
        default="own",
        help="own (default): each busy process a scheduling group of its own (a new session each, as separate "
        "programs are; the kernel groups by session under autogroup); shared: in this script's session, as jobs "
        "started with `&` "
        "from the shell that runs the trainer are (one group for all)",
    )
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
    ap.add_argument(
        "--moving-weights",
        action="store_true",
        help="train with the recipe's learning rate (runs then sample different completions: different work)",
    )
    ap.add_argument("overrides", nargs="*", default=["precision=bf16"], help="KEY=VALUE for every run")
    ns = ap.parse_args(argv)
    if ns.steps <= ns.skip:
        ap.error("--steps must exceed --skip")
    if not ns.moving_weights:
        ns.overrides = [SAME_WORK, *ns.overrides]
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
                    res = run_once(
                        ns.recipe,
                        ns.steps,
                        p,
                        [*ns.overrides, *variants[p]],
                        out,
                        busy,
                        ns.load_from_step,
                        ns.busy_groups == "own",
                    )
                    runs[(p, busy)].append(res)
                    print(
                        f"round {r + 1} {p:8} busy={busy}: step s {[round(t, 2) for t in res['step_s']]} "
                        f"threads {res['threads']}, {res['cores_used']:.2f} cores used (load before "
                        f"{res['load_before']})",
                        file=sys.stderr,
                        flush=True,
                    )
    med = {k: median_of(v, ns.skip) for k, v in runs.items()}
    base = policies[0]
    every_run = [r for v in runs.values() for r in v]
    arrival = f" from the end of step {ns.load_from_step}" if ns.load_from_step else ""
    differ = work_differences(every_run)
    same_work = not differ
    print(
        f"median s/step over steps {ns.skip + 1}..{ns.steps}, {ns.rounds} round(s); loaded = beside {ns.busy} busy "
        f"processes ({ns.busy_groups} scheduling groups){arrival}; {os.cpu_count()} cores"
    )
    if same_work:
        print(
            f"same work: every run sampled the same tokens and updated the same sequences at every step ({SAME_WORK})"
        )
    else:
        print(f"NOT the same work ({'weights moving' if ns.moving_weights else SAME_WORK}): " + "; ".join(differ))
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
            "cores_used_alone": statistics.median(r["cores_used"] for r in runs[(p, 0)]),
            "cores_used_loaded": statistics.median(r["cores_used"] for r in runs[(p, ns.busy)])
            if (p, ns.busy) in runs
            else nan,
        }
        print(
            f"{p:12}{a:9.2f}{b:9.2f}{b / a:14.2f}{rows[p]['alone_over_base']:16.3f}{rows[p]['loaded_over_base']:16.3f}"
        )
    print(
        "cores used (the run's CPU time over its wall time, start-up included): "
        + "; ".join(
            f"{p} {r['cores_used_alone']:.2f} alone, {r['cores_used_loaded']:.2f} loaded" for p, r in rows.items()
        )
    )
    result = {
        "recipe": ns.recipe,
        "steps": ns.steps,
        "skip": ns.skip,
        "busy": ns.busy,
        "load_from_step": ns.load_from_step,
        "busy_groups": ns.busy_groups,
        "rounds": ns.rounds,
        "overrides": ns.overrides,
        "variants": variants,
        "cores": os.cpu_count(),
        "summary": rows,
        "same_work": same_work,
        "work_differs": differ,
        "runs": every_run,
    }
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    if ns.results:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import results

        work = f"same work ({SAME_WORK})" if same_work else "work differs between runs"
        steps = f"demo, steps {ns.skip + 1}-{ns.steps}, {ns.rounds} round(s), {work}"
        groups = "each its own scheduling group" if ns.busy_groups == "own" else "in the trainer's scheduling group"
        entries = []
        for p, row in rows.items():
            how = f"{p} ({' '.join(variants[p]) or 'no override'})"
            if p in loaded and ns.busy:  # --busy 0 compares the variants alone only
                entries.append(
                    results.entry(
                        "busy-step",
                        f"{steps}, {ns.busy} busy processes {groups}{arrival}, {how}",
                        row["loaded_s"],
                        row["alone_s"],
                    )
                )
            if p != base and not ns.load_from_step:  # alone against the baseline: a question of its own
                entries.append(
                    results.entry(
                        "threads-alone", f"{steps}, alone, {how} against {base}", row["alone_s"], med[(base, 0)]
                    )
                )
        results.record(ns.results, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
