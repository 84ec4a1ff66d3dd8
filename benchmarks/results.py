"""The results table: docs/results.md, made from the entries the benchmarks write.

    python benchmarks/results.py                 # rewrite docs/results.md from benchmarks/results/*.jsonl
    python benchmarks/results.py --check         # exit 1, with a diff, when docs/results.md is not current
    python benchmarks/results.py add-bench RUN.json --json benchmarks/results/entries.jsonl
                                                 # entries from a `grpolab bench --json-out RUN.json`

Every benchmark here takes `--json PATH` and appends one JSON line per measurement to PATH, in the one
format of `entry` below: the claim it backs (a key of CLAIMS), the setting, the machine, grpolab's
figure and the peer's (what it is compared with), their ratio, an interval where the figure is a rate
or an accuracy, and the date, commit and command that produced it. docs/results.md holds one table per
claim, oldest entry first; an entry whose ratio (or, without a peer, whose own figure) is more than 5%
worse than the previous entry of the same claim, setting and machine is flagged.

Entries are only compared within one machine: the same command on another CPU is another row, not a
regression.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "results.md"
REGRESSION = 0.05  # a ratio more than 5% worse than the previous entry's is flagged

# claim key: (title, what `grpolab` and `peer` are, unit, which way is better: "lower", "higher", or
# "one" for a prediction against a measurement), in the order docs/results.md shows them.
CLAIMS: dict[str, tuple[str, str, str, str, str]] = {
    "bench-step": ("Step time against TRL's GRPOTrainer", "grpolab", "TRL", "s/step", "lower"),
    "bench-memory": ("Peak memory against TRL's GRPOTrainer", "grpolab", "TRL", "MB", "lower"),
    "bench-floor": (
        "grpolab bench --against none: each phase against its floor, the larger of its FLOPs at the measured "
        "matmul rate and its bytes at the measured memory bandwidth (targets in fp32: generation at most 2.0x, "
        "the step at most 1.35x)",
        "measured",
        "floor",
        "s",
        "lower",
    ),
    "busy-step": (
        "The demo's step beside busy processes against alone (benchmarks/busy_machine.py; target: at most 2.5x)",
        "beside busy",
        "alone",
        "s/step (median)",
        "lower",
    ),
    "threads-alone": (
        "The demo's step alone: today's thread settings against the ones before (target: at most 1.05x)",
        "now",
        "before",
        "s/step (median)",
        "lower",
    ),
    "rollout-hf": (
        "Rollout throughput against transformers' generate",
        "grpolab generate",
        "model.generate",
        "tok/s",
        "higher",
    ),
    "prompt-once": (
        "The prompt computed once per group in the update",
        "once per group",
        "once per sequence",
        "s/pass",
        "lower",
    ),
    "sampler": ("Inverse-CDF sampling against torch.multinomial", "inverse-CDF", "torch.multinomial", "ms", "lower"),
    "precision": ("bf16 autocast against fp32 on a CPU (what precision=auto measures)", "bf16", "fp32", "s", "lower"),
    "engine-speed": ("Rollout engines: native against vLLM", "native", "vLLM engine", "tok/s", "higher"),
    "engine-overhead": (
        "The vLLM engine against vLLM's own LLM.generate",
        "vLLM engine",
        "LLM.generate",
        "tok/s",
        "higher",
    ),
    "engine-memory": (
        "Peak resident memory of a run with the vLLM engine against the native one",
        "vLLM engine",
        "native",
        "MB",
        "lower",
    ),
    "memory-plan": ("`grpolab plan`'s predicted peak against the measured one", "predicted", "measured", "MB", "one"),
    "decode-ab": (
        "The lean decode step against another commit's (benchmarks/ab.py decode)",
        "this tree",
        "other tree",
        "ms/step",
        "lower",
    ),
    "step-ab": (
        "A bench setting's step against another commit's (benchmarks/ab.py phases)",
        "this tree",
        "other tree",
        "s/step",
        "lower",
    ),
    "cpu-malloc": ("Freed memory kept (cpu_malloc=keep) against malloc as it is", "keep", "system", "s/step", "lower"),
    "lora-memory": ("LoRA r=16 against full fine-tuning, peak RSS", "LoRA", "full", "MB", "lower"),
    "demo-learns": (
        "Recipes learn: held-out accuracy after training against before",
        "after",
        "before",
        "accuracy",
        "higher",
    ),
    "sandbox": (
        "Sandbox throughput (run_many, 2 slots)",
        "grpolab.sandbox",
        "previous sandbox",
        "candidates/s",
        "higher",
    ),
    "wall-time": (
        "Wall time of long commands (the lab's claims, test files); the load of the shared machine in the setting",
        "wall",
        "",
        "s",
        "lower",
    ),
    "trl-suite": (
        "TRL's own GRPOTrainer tests (its tests/test_grpo_trainer.py) with the import changed to grpolab "
        "(benchmarks/trl_suite.py)",
        "pass with grpolab",
        "pass with TRL",
        "tests",
        "higher",
    ),
    "humaneval": (
        "HumanEval canonical solutions graded 1.0 by the code reward",
        "canonical = 1.0",
        "",
        "fraction",
        "higher",
    ),
}
FIELDS = ("claim", "setting", "machine", "grpolab", "peer", "ratio", "interval", "n", "date", "commit", "command")


# ---- what a benchmark calls ---------------------------------------------------------------------


def machine() -> str:
    """The CPU (or GPU) this process runs on, in words: model name, cores, AMX where present."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = f"{name}, {cores} cores" + (", AMX" if "amx_bf16" in flags else "")
    try:
        import torch

        if torch.cuda.is_available():
            out = f"{torch.cuda.get_device_name(0)} ({out})"
    except ImportError:
        pass
    return out


def commit() -> str:
    """The short hash of HEAD, with "+changes" when the tree has uncommitted edits; "" outside git."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no") else "")
    except OSError:
        return ""


def entry(
    claim: str,
    setting: str,
    grpolab: float | None,
    peer: float | None,
    *,
    command: str | None = None,
    interval: list[float] | None = None,
    n: int | None = None,
) -> dict:
    """One measurement, dated and attributed to this machine and commit. `command` defaults to this
    process's command line."""
    if claim not in CLAIMS:
        raise ValueError(f"unknown claim {claim!r}; add it to CLAIMS in benchmarks/results.py ({sorted(CLAIMS)})")
    return {
        "claim": claim,
        "setting": setting,
        "machine": machine(),
        "grpolab": grpolab,
        "peer": peer,
        "ratio": grpolab / peer if grpolab is not None and peer else None,
        "interval": interval,
        "n": n,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "command": command or "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
    }


def record(path: str | Path | None, entries: list[dict]) -> None:
    """Append `entries` to the JSON-lines file `path` (nothing when path is None)."""
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in entries:
            f.write(json.dumps(e, sort_keys=True) + "\n")
    print(f"results: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} appended to {path}")


# ---- the statistics of a cell -------------------------------------------------------------------


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion k/n (Wilson 1927, "Probable inference, the law of
    succession, and statistical inference"): (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def worse_by(claim: str, before: dict, now: dict) -> float | None:
    """How much worse `now` is than `before` (a fraction; negative: better), on the ratio where both
    have one, else on grpolab's own figure; None when they cannot be compared."""
    key = "ratio" if before.get("ratio") is not None and now.get("ratio") is not None else "grpolab"
    a, b = before.get(key), now.get(key)
    if a is None or b is None or a == 0:
        return None
    better = CLAIMS[claim][4]
    if better == "one":
        return abs(b - 1) - abs(a - 1)
    change = (b - a) / abs(a)
    return change if better == "lower" else -change


# ---- the page -----------------------------------------------------------------------------------


def load(folder: Path = RESULTS) -> list[dict]:
    """Every entry of folder/*.jsonl, in file order (files by name)."""
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                e = json.loads(line)
                if e.get("claim") not in CLAIMS:
                    raise SystemExit(f"{path}:{i}: unknown claim {e.get('claim')!r} (known: {sorted(CLAIMS)})")
                out.append(e)
    return out


def fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:,.{3 if abs(x) < 1 else 2 if abs(x) < 100 else 1 if abs(x) < 1000 else 0}f}"
    return str(x)


def interval_of(e: dict) -> str:
    if e.get("interval"):
        lo, hi = e["interval"]
        return f"{fmt(lo)}-{fmt(hi)}"
    if CLAIMS[e["claim"]][3] in ("accuracy", "fraction") and e.get("n") and e.get("grpolab") is not None:
        lo, hi = wilson(e["grpolab"] * e["n"], e["n"])
        return f"{lo:.3f}-{hi:.3f} (95%, n={e['n']})"
    return ""


def render(entries: list[dict]) -> str:
    lines = [
        "# Results",
        "",
        "Generated by `python benchmarks/results.py` from `benchmarks/results/*.jsonl` (do not edit by hand).",
        "Each benchmark appends its entries with `--json PATH`; [performance.md](performance.md) says what",
        "each one measures and how to run it. `ratio` is grpolab / peer. Compare rows of one machine only:",
        "a CPU's speed also drifts with its load. **worse** marks an entry more than 5% worse than the",
        "previous entry of the same claim, setting and machine.",
        "",
    ]
    for claim, (title, ours, peer, unit, better) in CLAIMS.items():
        rows = [e for e in entries if e["claim"] == claim]
        if not rows:
            continue
        rows.sort(key=lambda e: e["date"])  # stable: file order within a day
        way = {"lower": "lower is better", "higher": "higher is better", "one": "1.0 is exact"}[better]
        lines += [
            f"## {title}",
            "",
            f"Unit: {unit}; {way}.",
            "",
            f"| setting | machine | {'grpolab' if ours == 'grpolab' else f'grpolab ({ours})'} | "
            f"{'peer' if not peer else peer if peer == 'TRL' else f'peer ({peer})'} | ratio | interval | date "
            "| commit | command |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        last: dict[tuple, dict] = {}
        for e in rows:
            key = (e["setting"], e["machine"])
            flag = ""
            if key in last:
                w = worse_by(claim, last[key], e)
                if w is not None and w > REGRESSION:
                    flag = f" **worse** ({100 * w:.0f}% against {last[key]['date']})"
            last[key] = e
            cmd = e["command"].replace("|", "\\|")
            lines.append(
                f"| {e['setting']} | {e['machine']} | {fmt(e['grpolab'])} | {fmt(e['peer'])} | "
                f"{fmt(e['ratio'])}{flag} | {interval_of(e)} | {e['date']} | {e['commit']} | `{cmd}` |"
            )
        lines.append("")
    return "\n".join(lines)


# ---- grpolab bench's JSON ----------------------------------------------------------------------


def trl_config(name: str, c: dict) -> str:
    """A TRL configuration in words: its precision and gradient checkpointing (True is TRL's default)."""
    ckpt = c.get("gradient_checkpointing", not name.endswith("_nockpt"))
    return f"TRL {c['precision']} (gradient_checkpointing={ckpt}{', its default' if ckpt else ''})"


def cpu_words(run: dict) -> str:
    """ ", torch at AVX2": the instruction set torch's CPU kernels ran at, as grpolab bench recorded it ("" if not)."""
    isa = run.get("cpu", {})
    return f", torch at {isa['capability']}" if isa.get("capability") else ""


def floor_entries(run: dict, command: str) -> list[dict]:
    """bench-floor entries of a `grpolab bench --against none` run: each phase's seconds against its floor."""
    spec, fl = run["spec"], run["floor"]
    c = run["configs"]["grpolab"]
    where = cpu_words(run)
    out = []
    for row in fl["rows"]:
        if not row["floor_s"]:
            continue
        setting = (
            f"({spec['setting']}) {row['phase']}, grpolab {c['precision']}, bound by {row.get('bound') or 'FLOPs'}"
            f"{where}"
        )
        out.append(entry("bench-floor", setting, row["seconds"], row["floor_s"], command=command))
    return out


def bench_command(run: dict) -> str:
    """The grpolab bench command line of a run's JSON, with the variables that capped the CPU's instructions."""
    spec = run["spec"]
    env = " ".join(f"{k}={v}" for k, v in run.get("cpu", {}).get("env", {}).items())
    flags = f"--setting {spec['setting']} --precision {spec['precision']}"
    if spec.get("against") == "none":
        flags += " --against none"
    else:
        flags += f" --trl-precision {spec['trl_precision']} --trl-checkpointing {spec.get('trl_checkpointing', 'on')}"
    flags += f" --rounds {spec['rounds']} --steps {spec['steps']}" + (
        f" --busy {spec['busy']}" if spec.get("busy") else ""
    )
    return (env + " " if env else "") + "grpolab bench " + flags


def from_bench(run: dict, command: str) -> list[dict]:
    """Entries from the JSON `grpolab bench --json-out` writes: step time and peak memory of each
    grpolab configuration against the fastest TRL configuration of the run (named with its gradient
    checkpointing), or with --against none each phase against its floor."""
    configs = run["configs"]
    trl = {k: v for k, v in configs.items() if k.startswith("trl")}
    out = []
    if run.get("floor"):
        out += floor_entries(run, command)
    if not trl:
        return out
    best = min(trl, key=lambda k: trl[k]["s_per_step"])
    spec = run["spec"]
    for name, c in configs.items():
        if name.startswith("trl"):
            continue
        engine = c.get("engine", "native")
        setting = (
            f"({spec['setting']}) {spec['new_tokens']} tokens, beta {spec['beta']:g}, lora_r "
            f"{spec['lora_r']}, engine {engine}, grpolab {c['precision']} vs {trl_config(best, trl[best])}, "
            f"the fastest of {len(trl)} TRL configuration{'s' if len(trl) > 1 else ''}{cpu_words(run)}"
        )
        if spec.get("busy"):  # both sides beside the same busy processes (grpolab bench --busy)
            setting += f", beside {spec['busy']} busy processes"
        for claim, key in (("bench-step", "s_per_step"), ("bench-memory", "peak_mb")):
            out.append(entry(claim, setting, c[key], trl[best][key], command=command))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is not current")
    sub = ap.add_subparsers(dest="cmd")
    add = sub.add_parser("add-bench", help="append entries from a `grpolab bench --json-out` file")
    add.add_argument("run", help="the JSON that grpolab bench wrote")
    add.add_argument("--json", required=True, help="the JSON-lines file to append to")
    a = ap.parse_args(argv)
    if a.cmd == "add-bench":
        run = json.loads(Path(a.run).read_text())
        record(a.json, from_bench(run, bench_command(run)))
        return 0
    text = render(load())
    if a.check:
        old = DOC.read_text() if DOC.exists() else ""
        if old != text:
            sys.stdout.writelines(
                difflib.unified_diff(old.splitlines(True), text.splitlines(True), "docs/results.md", "regenerated")
            )
            print("\ndocs/results.md is not current: run `python benchmarks/results.py`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)} ({len(load())} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
