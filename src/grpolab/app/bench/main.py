"""`grpolab bench`: run the workers, alternating the sides, and print the table and one JSON line.

    check    one process: grpolab and TRL score the same sequences; they must agree to 1e-3 (exit 1)
    rounds   grpolab, TRL fp32, TRL bf16, grpolab, TRL fp32, ... each a fresh process (grpolab.app.bench.worker)
    summary  medians of the timed steps of every round, per configuration; grpolab/TRL ratios

With --against none: grpolab alone, then the device's matmul rate and memory bandwidth, and each phase
against its floor: the larger of its FLOPs at that rate and its bytes at that bandwidth
(grpolab.app.bench.floor). A worker's step lines are passed on as they come, and a worker silent for
QUIET_S seconds gets a line saying it still runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpolab.app.bench.spec import Spec, grpolab_config, parse_spec
from grpolab.util.procs import busy_processes
from grpolab.util.threads import current, environ_without_plan

PHASES = ("generation", "reference", "update")
ISA_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")  # a CPU's instructions capped


class WorkerFailed(Exception):
    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


def run_worker(mode: str, spec_path: Path, tmp: Path, *extra: str, label: str) -> dict:
    """One worker process; its result, or WorkerFailed with its exit code and the end of its output."""
    import grpolab

    out = tmp / f"{label.replace(' ', '_')}-{time.monotonic_ns()}.json"
    log = out.with_suffix(".log")
    # TRL's workers wait as OpenMP does by default (what a TRL user gets); grpolab's as its thread_wait says
    env = environ_without_plan() if mode == "trl" else dict(os.environ)
    src = str(Path(grpolab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    threads = json.loads(spec_path.read_text()).get("threads") or 0
    if threads:  # the thread pools of every library in the worker, not only torch's
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "grpolab.app.bench.worker", mode, str(spec_path), str(out), *extra]
    with open(log, "w") as f:
        rc = _watched(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), log, label)
    if rc != 0 or not out.exists():
        text = log.read_text(errors="replace").strip().splitlines()
        mine = [ln for ln in text if ln.startswith("grpolab bench:")]
        tail = "\n".join(mine or text[-25:])
        raise WorkerFailed(f"{label} (exit {rc}):\n{tail}" if not mine else tail, rc if rc in (1, 2) else 1)
    return json.loads(out.read_text())


QUIET_S = 5.0  # a worker silent this long gets a line saying it is still running
PROGRESS = ("grpolab step", "TRL step")  # a worker's lines that the bench passes on as they come


def _watched(proc, log: Path, label: str, quiet_s: float = QUIET_S) -> int:
    """Wait for the worker `proc`, passing on its step lines (PROGRESS) as it writes them to `log`, and
    after quiet_s seconds without one a line saying what still runs and for how long; its exit code."""
    start = last = time.monotonic()
    seen = 0
    while True:
        rc = proc.poll()
        lines = log.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            if line.startswith(PROGRESS):
                _progress(f"  {label}: {line.strip()}")
                last = time.monotonic()
        seen = len(lines)
        if rc is not None:
            return rc
        if time.monotonic() - last >= quiet_s:
            _progress(f"  {label}: running, {time.monotonic() - start:.0f} s")
            last = time.monotonic()
        time.sleep(0.25)


NOCKPT_MEMORY = 1.5  # TRL without checkpointing runs where this many times its checkpointed peak is available


def available_mb() -> float | None:
    """MemAvailable of /proc/meminfo in MB (None where unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _no_memory_for(name: str, runs: dict) -> str | None:
    """Why TRL without gradient checkpointing (`name` trl_P_nockpt) must not run: less memory available
    than NOCKPT_MEMORY times what TRL's checkpointed run of the precision peaked at (on a CPU; without
    checkpointing TRL keeps every layer's activations for the backward). None: it may run."""
    ckpt = name.removesuffix("_nockpt")
    if ckpt == name or not runs.get(ckpt):
        return None
    peak, avail = max(r["peak_mb"] for r in runs[ckpt]), available_mb()
    if avail is None or runs[ckpt][0].get("device", "cpu") != "cpu" or avail >= NOCKPT_MEMORY * peak:
        return None
    return f"{avail:.0f} MB available, under {NOCKPT_MEMORY:g} x the {peak:.0f} MB TRL peaked at with checkpointing"


def summarise(runs: list[dict]) -> dict:
    """Medians over every timed step of every round of one configuration."""
    steps = [s for r in runs for s in r["steps"]]

    def med(f):
        vals = [v for v in (f(s) for s in steps) if v is not None]
        return statistics.median(vals) if vals else None

    out = {k: v for k, v in runs[0].items() if k not in ("steps", "warmup", "peak_mb")}
    out.update(
        {
            "s_per_step": med(lambda s: s["step_s"]),
            "gen_tok_s": med(lambda s: s["generated_tokens"] / s["generation_s"] if s["generation_s"] else None),
            "train_tok_s": med(lambda s: s["trained_tokens"] / s["update_s"] if s["update_s"] else None),
            "peak_mb": max(r["peak_mb"] for r in runs),
            "phases_s": {p: med(lambda s, p=p: s[f"{p}_s"]) for p in PHASES + ("score",)},
            "generated_tokens": med(lambda s: s["generated_tokens"]),
            "trained_tokens": med(lambda s: s["trained_tokens"]),
            "timed_steps": len(steps),
            "step_s_all": [s["step_s"] for s in steps],
            "steps": steps,
        }
    )
    if steps and all("turns_mean" in s for s in steps):  # the agent setting: what each side's rollouts held

        def mean(key):
            vals = [s[key] for s in steps if s.get(key) is not None]
            return sum(vals) / len(vals) if vals else None

        out["agent"] = {k: mean(k) for k in AGENT_SHAPES}
    return out


AGENT_SHAPES = {
    "turns_mean": "turns/traj",
    "tool_calls_mean": "calls/traj",
    "generated_tokens": "model tok",
    "env_tokens": "env tok",
    "tool_errors": "tool errors",
    "prompt_tokens_mean": "prompt tok",
}
"""The agent setting's shapes per step (means over the timed steps), with their table headings: they vary with
sampling on each side, so the table prints them beside the times they explain."""


def ratios(ours: dict, theirs: dict) -> dict:
    """grpolab / TRL: time and memory (< 1: grpolab uses less), throughputs (> 1: grpolab is faster)."""

    def div(a, b):
        return a / b if a is not None and b else None

    return {
        "s_per_step": div(ours["s_per_step"], theirs["s_per_step"]),
        "gen_tok_s": div(ours["gen_tok_s"], theirs["gen_tok_s"]),
        "train_tok_s": div(ours["train_tok_s"], theirs["train_tok_s"]),
        "peak_mb": div(ours["peak_mb"], theirs["peak_mb"]),
    }


def _f(x, fmt: str) -> str:
    """x formatted, or a dash of the same width when there is no value."""
    width = int(fmt.split(".")[0] or 0)
    return f"{'-':>{width}}" if x is None else format(x, fmt)


def _label(name: str, c: dict | None = None) -> str:
    """A configuration's row label: `grpolab bf16`, `grpolab+vllm bf16`, `TRL fp32` (TRL's default
    gradient_checkpointing=True), `TRL fp32 no-ckpt` (False)."""
    if name.startswith("trl_"):
        return name.replace("trl_", "TRL ").replace("_nockpt", " no-ckpt")
    base = name.replace("grpolab_", "grpolab+")
    return f"{base} {c['precision']}" if c else base


def _threads_text(spec, threads) -> str:
    """The torch threads of the timed processes: --threads N on both sides; otherwise TRL's torch default
    and grpolab's threads=0 choice (grpolab.util.threads.choose_threads: the cores other processes
    leave idle when it starts, so beside --busy processes it may run fewer)."""
    if spec.threads:
        return f"{threads} torch threads per process"
    return f"torch threads: TRL's default ({threads}), grpolab's threads=0 (the cores left idle at its start)"


def table(result: dict) -> str:
    """The human-readable table of a result (what `grpolab bench` prints above the JSON line)."""
    spec = Spec.from_dict(result["spec"])
    lines = [
        f"grpolab bench: {spec.describe()}",
        f"device {result['device']}, {_threads_text(spec, result.get('threads', '?'))}; {spec.steps} timed steps after 1 warm-up step per process, {spec.rounds} "
        f"round(s); medians over the timed steps of all rounds",
    ]
    if result.get("thread_wait"):
        lines.append(
            f"grpolab's {result['thread_wait']['grpolab']}; TRL's threads wait as {result['thread_wait']['trl']}"
        )
    if result.get("logp_check"):
        c = result["logp_check"]
        lines.append(
            f"log-prob check: {c['verdict']}, over {c['tokens']} tokens of {c['sequences']} sequences; "
            f"same prompt tokens: {c['same_prompt_tokens']}"
        )
        if c.get("rollout_vs_update_max_abs_diff") is not None:
            lines.append(
                f"grpolab's rollout (lean decode step) vs its update pass, same sequences: max |d log pi| = "
                f"{c['rollout_vs_update_max_abs_diff']:.2e} per token (fp32)"
            )
    lines.append("")
    head = f"{'':24}{'s/step':>9}{'gen tok/s':>11}{'train tok/s':>13}{'peak MB':>9}   " + "".join(
        f"{p + ' s':>13}" for p in PHASES
    )
    lines.append(head)
    for name, c in result["configs"].items():
        label = _label(name, c)
        lines.append(
            f"{label:24}{_f(c['s_per_step'], '9.2f')}{_f(c['gen_tok_s'], '11.1f')}"
            f"{_f(c['train_tok_s'], '13.1f')}{_f(c['peak_mb'], '9.0f')}   "
            + "".join(f"{_f(c['phases_s'][p], '13.2f')}" for p in PHASES)
        )
    rows = [("grpolab / " + _label(name), r) for name, r in result.get("ratios", {}).items()]
    rows += [(" / ".join(_label(n) for n in name.split("/")), r) for name, r in result.get("engine_ratios", {}).items()]
    for label, r in rows:
        lines.append(
            f"{label:24}{_f(r['s_per_step'], '9.2f')}{_f(r['gen_tok_s'], '11.2f')}"
            f"{_f(r['train_tok_s'], '13.2f')}{_f(r['peak_mb'], '9.2f')}"
        )
    if any(c.get("agent") for c in result["configs"].values()):
        lines += [
            "",
            "multi-turn shapes, means over the timed steps (sampled, not forced: each side's own draw)",
            f"{'':24}" + "".join(f"{h:>13}" for h in AGENT_SHAPES.values()),
        ]
        for name, c in result["configs"].items():
            label = _label(name, c)
            lines.append(f"{label:24}" + "".join(_f(c["agent"].get(k), "13.2f") for k in AGENT_SHAPES))
        if result.get("logp_check", {}).get("agent_same_prompt_tokens") is not None:
            c = result["logp_check"]
            lines.append(
                f"same prompt tokens on both sides: {c['agent_same_prompt_tokens']} "
                f"({', '.join(map(str, c['agent_prompt_tokens']))} tokens); same tool-reply tokens: "
                f"{c['agent_same_tool_reply_tokens']}"
            )
    if any(n.startswith("trl_") for n in result["configs"]):
        lines.append("TRL: gradient_checkpointing=True (TRL's default); TRL no-ckpt: gradient_checkpointing=False")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"{_label(name)} not run: {why}")
    if result.get("grpolab_vs_fastest_trl") is not None:
        lines.append(
            f"\ngrpolab s/step / TRL's fastest configuration ({_label(result['fastest_trl'])}): "
            f"{result['grpolab_vs_fastest_trl']:.3f}"
        )
    if result.get("floor"):
        lines += floor_lines(result, spec)
    return "\n".join(lines)


def floor_lines(result: dict, spec: Spec) -> list[str]:
    """The --against none table: each phase against its FLOP floor and (generation) its memory floor."""
    fl, rates = result["floor"], result["matmul_flops"]
    sizes = rates.get("sizes", {})
    timed = ", ".join(
        f"{p} {rates[p] / 1e12:.3f} TFLOP/s ({sizes.get(p, 2048)}^3)" for p in ("fp32", "bf16") if p in rates
    )
    lines = [
        "",
        f"matmul rate ({result['device']}): {timed}"
        + (f"; bf16 not timed: {rates['bf16_not_timed']}" if rates.get("bf16_not_timed") else ""),
    ]
    if rates.get("bandwidth"):
        lines.append(
            f"memory bandwidth: {rates['bandwidth'] / 1e9:.1f} GB/s (reading a {rates['bandwidth_bytes'] / 1e6:.0f} MB "
            f"buffer, the size of the decode step's weights, best of 3)"
        )
    lines += [
        f"each phase's floor: the larger of its FLOPs at the rate of grpolab's precision in it "
        f"({', '.join(f'{k} {v}' for k, v in fl['precision'].items())}) and the bytes it must read at that bandwidth",
        f"{'phase':12}{'seconds':>10}{'GFLOP':>10}{'FLOP fl s':>11}{'GB read':>9}{'mem fl s':>10}{'floor s':>9}"
        f"{'x floor':>9}  bound",
    ]
    for row in fl["rows"]:
        lines.append(
            f"{row['phase']:12}{row['seconds']:10.2f}{row['flops'] / 1e9:10.1f}{row.get('flop_floor_s', row['floor_s']):11.3f}"
            f"{row.get('bytes', 0) / 1e9:9.2f}{row.get('memory_floor_s', 0):10.3f}{row['floor_s']:9.3f}"
            f"{_f(row['ratio'], '9.2f')}  {row.get('bound') or '-'}"
        )
    k = "4" if spec.lora_r else "6"
    lines.append(
        f"FLOPs per sequence: generation and reference 2N(P+C) + 2VHC, update {k}N(P+C) + {k}VHC; N = "
        f"{fl['N']:,} non-embedding parameters, V x H = {fl['V']} x {fl['H']} (LM head, C positions), "
        f"P = {fl['P']:.1f}, C = {fl['C']:.1f}, {fl['seqs']:.0f} sequences; attention left out"
    )
    if fl.get("kv_slot_bytes"):
        lines.append(
            f"bytes of a rollout: C b (N + VH) + n s ((C-1) P + C(C-1)/2): b = {fl['weight_bytes']} bytes per weight, "
            f"s = {fl['kv_slot_bytes']:,} KV-cache bytes per token and row, n = {fl['seqs']:.0f}"
        )
    return lines


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench(spec: Spec) -> dict:
    """Run every worker; the result dict (also the JSON line)."""
    from grpolab.model.load import pick_device, resolve_model

    resolve_model(spec.model)  # a bad --model: ConfigError, exit 2, before any process starts
    device = pick_device(spec.device)
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-") as tmp_s:
        tmp = Path(tmp_s)
        grpolab_config(spec, str(tmp / "run"))  # every grpolab setting valid (LoRA support included)
        if spec.against == "trl":
            from grpolab.app.bench.trl_side import import_trl

            import_trl()  # TrlMissing: exit 2 with the install command
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict()))
        import torch

        result: dict = {
            "spec": spec.to_dict(),
            "device": device.type,
            "threads": spec.threads or torch.get_num_threads(),
            "thread_wait": {"grpolab": current("auto").describe(), "trl": "OpenMP's default"},
            "cpu": {  # what the CPU ran: torch's kernels' capability and the variables that cap instruction sets
                "capability": torch.backends.cpu.get_cpu_capability(),
                "env": {k: os.environ[k] for k in ISA_ENV if os.environ.get(k)},
            },
        }
        if spec.against == "trl":
            _progress("grpolab bench: log-prob check (grpolab vs TRL on the same sequences, fp32)...")
            result["logp_check"] = run_worker("check", spec_path, tmp, label="log-prob check")
            _progress(f"  {result['logp_check']['verdict']}")
        runs: dict[str, list[dict]] = {}
        order = []
        for engine in spec.engines():  # "grpolab" is the native engine's configuration, as before
            name = "grpolab" if engine == "native" else f"grpolab_{engine}"
            runs[name] = []
            order.append((name, "grpolab", ("--engine", engine)))
        if spec.against == "trl":
            for p in spec.trl_precisions():
                for ck in spec.trl_checkpointings():
                    name = f"trl_{p}" if ck == "on" else f"trl_{p}_nockpt"
                    runs[name] = []
                    order.append((name, "trl", ("--precision", p, "--checkpointing", ck)))
        skipped: dict[str, str] = {}
        for r in range(spec.rounds):
            for name, mode, extra in order:
                if name in skipped:
                    continue
                why = _no_memory_for(name, runs)
                if why:
                    skipped[name] = why
                    runs.pop(name)
                    _progress(f"grpolab bench: {name} skipped: {why}")
                    continue
                t = time.perf_counter()
                with busy_processes(spec.busy):  # --busy: the same load beside either side
                    res = run_worker(mode, spec_path, tmp, *extra, label=f"{name} round {r + 1}")
                runs[name].append(res)
                _progress(
                    f"grpolab bench: round {r + 1}/{spec.rounds} {name:9} "
                    f"{statistics.median(s['step_s'] for s in res['steps']):7.2f} s/step "
                    f"({time.perf_counter() - t:.0f} s with loading)"
                )
        configs = {name: summarise(rs) for name, rs in runs.items()}
        result["configs"] = configs
        if skipped:
            result["skipped"] = skipped
        ours = [n for n in configs if n.startswith("grpolab")]
        if len(ours) > 1:  # grpolab+vLLM against grpolab native
            result["engine_ratios"] = {f"{n}/grpolab": ratios(configs[n], configs["grpolab"]) for n in ours[1:]}
        if spec.against == "trl":
            first = ours[0]
            theirs = [n for n in configs if n not in ours]
            result["ratios"] = {n: ratios(configs[first], configs[n]) for n in theirs}
            for n in ours[1:]:
                result["engine_ratios"].update({f"{n}/{t}": ratios(configs[n], configs[t]) for t in theirs})
            fastest = min(theirs, key=lambda n: configs[n]["s_per_step"])
            result["fastest_trl"] = fastest
            result["grpolab_vs_fastest_trl"] = configs[first]["s_per_step"] / configs[fastest]["s_per_step"]
        else:
            from grpolab.app.bench.floor import floor_table

            ours = configs[ours[0]]
            used = sorted(set(ours["phase_precision"].values()))
            weight_bytes = (4 if ours["phase_precision"]["generation"] == "fp32" else 2) * (
                ours["params_non_embedding"] + ours["vocab"] * ours["hidden"]
            )
            _progress(f"grpolab bench: matmul rate ({', '.join(used)}) and memory bandwidth...")
            rates = run_worker(
                "rate", spec_path, tmp, "--precisions", ",".join(used), "--bytes", str(weight_bytes), label="rates"
            )
            rows = floor_table(ours, rates, beta=spec.beta, lora=bool(spec.lora_r))
            s = ours["steps"]
            result["matmul_flops"] = rates
            result["floor"] = {
                "precision": ours["phase_precision"],
                "rows": rows,
                "N": ours["params_non_embedding"],
                "V": ours["vocab"],
                "H": ours["hidden"],
                "P": statistics.median(x["prompt_tokens_mean"] for x in s),
                "C": statistics.median(x["completion_tokens_mean"] for x in s),
                "seqs": statistics.median(x["seqs"] for x in s),
                "kv_slot_bytes": ours.get("kv_slot_bytes"),
                "weight_bytes": 4 if ours["phase_precision"]["generation"] == "fp32" else 2,
            }
    return result


def main(argv: list[str]) -> int:
    spec = parse_spec(argv)  # argparse: exit 2; a bad value: ConfigError, exit 2 (grpolab.app.cli)
    from grpolab.app.bench.trl_side import TrlMissing

    try:
        result = bench(spec)
    except TrlMissing as e:
        print(f"grpolab bench: {e}", file=sys.stderr)
        return 2
    except WorkerFailed as e:
        print(f"grpolab bench: {e}" if not str(e).startswith("grpolab bench:") else str(e), file=sys.stderr)
        return e.code
    print(table(result))
    for c in result["configs"].values():
        c.pop("steps", None)  # the per-step records stay out of the JSON line (step_s_all keeps the times)
    line = json.dumps(result, separators=(",", ":"))
    print(line)
    if spec.json_out:
        Path(spec.json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


__all__ = ["bench", "main", "ratios", "summarise", "table"]
