"""A developer's A/B tool: this tree against another commit's, or one setting against another, on one
machine, alternating (one machine's speed drifts over minutes, so only alternation shows a few percent).

    git worktree add /tmp/base <commit>          # the other side, where a subcommand takes a tree

    python benchmarks/ab.py decode /tmp/base [--rounds 6] [--steps 48] [--json PATH]
        The lean decode step (grpolab.engine.native.decoder) of both trees in this process, on the bundled
        SmolLM2-135M in bf16 (oneDNN-packed weights, as the rollout runs it): first whether both give the
        same logits (bf16 and fp32, a left-padded prefill and 5 greedy steps), then the time of each
        tree's weight layout, then --rounds alternations of --steps 16-row decode steps each; prints the
        median milliseconds per step.

    python benchmarks/ab.py phases [--other /tmp/base | --cpu-malloc keep system] [--rounds 2]
                                   [--steps 4] [--json PATH] -- [any grpolab bench flag, e.g. --setting b]
        grpolab's own step on a bench setting (grpolab.app.bench.ours.setup_run: every completion forced
        to full length, the bench's reward), each side in a process of its own, alternating --rounds
        times: this tree against --other's, or cpu_malloc=keep against system in this tree. Prints, per
        run, the medians of steps 2 on of generation, update and step seconds, and the peak RSS.

    python benchmarks/ab.py curves OUT.png LABEL=RUN_DIR_OR_METRICS_JSONL ...
        Reward and completion length per step of several runs side by side (before and after a change
        that should not change learning); prints, per run, the mean reward of the first and last 5 steps,
        the mean length, and the first step whose reward differs from the first run's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


# ---- decode --------------------------------------------------------------------------------------


def load_decoder(tree: str):
    """grpolab's decoder module of another tree, loaded beside this tree's."""
    for rel in ("src/grpolab/engine/native/decoder.py", "src/grpolab/" + "model/decoder.py", "src/grpolab/decoder.py"):
        path = Path(tree) / rel
        if path.exists():
            break
    else:
        raise SystemExit(f"ab.py decode: no src/grpolab/engine/native/decoder.py under {tree}")
    spec = importlib.util.spec_from_file_location("grpolab_decoder_other", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def greedy_logits(dec, model, dtype) -> list:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40000, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    st = dec.LeanStepper(dec.weights_of(model, dtype), 8)
    out = [st.prefill(ids, mask, pos)]
    st.repeat(3)
    p, tok = pos[:, -1].repeat_interleave(3), out[0].argmax(-1).repeat_interleave(3)
    for _ in range(5):
        p = p + 1
        out.append(st.step(tok, p))
        tok = out[-1].argmax(-1)
    return out


def ms_per_step(dec, w, steps: int) -> float:
    import torch

    st = dec.LeanStepper(w, steps)
    ids = torch.randint(0, 40000, (2, 46))
    mask = torch.ones_like(ids)
    pos = mask.cumsum(-1) - 1
    st.prefill(ids, mask, pos)
    st.repeat(8)
    p, tok = pos[:, -1].repeat_interleave(8), torch.randint(0, 40000, (16,))
    t = time.perf_counter()
    for _ in range(steps):
        p = p + 1
        st.step(tok, p)
    return (time.perf_counter() - t) / steps * 1e3


def decode(a) -> int:
    import torch

    from grpolab.engine.native import decoder as ours
    from grpolab.model.load import load_policy, model_dir
    from grpolab.parallel.allocator import keep_freed_memory

    keep_freed_memory()  # as the training process runs
    other = load_decoder(a.other)
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu")).eval()
    torch.set_grad_enabled(False)
    for dtype in (torch.bfloat16, torch.float32):
        x, y = greedy_logits(ours, model, dtype), greedy_logits(other, model, dtype)
        same = all(torch.equal(u, v) for u, v in zip(x, y))
        diff = max(float((u.float() - v.float()).abs().max()) for u, v in zip(x, y))
        print(f"{str(dtype)[6:]} logits, this tree vs {a.other}: identical {same} (max |diff| {diff:.3g})")
    mods = {"this tree": ours, a.other: other}
    layout: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(6):  # the per-rollout weight layout (cast, fuse, oneDNN reorder), alternating
        for name, dec in mods.items():
            t = time.perf_counter()
            dec.weights_of(model, torch.bfloat16)
            layout[name].append(time.perf_counter() - t)
    for name, ts in layout.items():
        print(f"{name:>20s}: weights_of {statistics.median(ts[1:]):.3f} s (bf16, median of 5 after one warm-up)")
    ws = {name: dec.weights_of(model, torch.bfloat16) for name, dec in mods.items()}
    times: dict[str, list[float]] = {k: [] for k in ws}
    for _ in range(a.rounds):
        for name, dec in mods.items():
            times[name].append(ms_per_step(dec, ws[name], a.steps))
    for name, ts in times.items():
        print(
            f"{name:>20s}: {statistics.median(ts):6.2f} ms per 16-row decode step (median of {a.rounds}; "
            f"{', '.join(f'{t:.1f}' for t in ts)})"
        )
    ours_ms, other_ms = statistics.median(times["this tree"]), statistics.median(times[a.other])
    print(f"ratio this tree / other: {ours_ms / other_ms:.3f}")
    if a.json:
        import results

        t = times["this tree"]
        results.record(
            a.json,
            [
                results.entry(
                    "decode-ab",
                    f"16 rows, 2 prompts of 46 tokens, {a.steps} steps, median of {a.rounds} "
                    f"(peer: {a.label or a.other})",
                    ours_ms,
                    other_ms,
                    interval=[min(t), max(t)],
                )
            ],
        )
    return 0


# ---- phases --------------------------------------------------------------------------------------


def phases_worker(argv: list[str]) -> int:
    """One side of `phases`, in its own process: prints one JSON line with the medians."""
    from grpolab.app.bench.ours import setup_run
    from grpolab.app.bench.spec import parse_spec
    from grpolab.training import step as S

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--cpu-malloc", choices=("keep", "system"))  # unset: the default (older commits work)
    ap.add_argument("--steps", type=int, default=4)
    own, rest = ap.parse_known_args(argv)
    overrides = {"cpu_malloc": own.cpu_malloc} if own.cpu_malloc else {}
    run = setup_run(parse_spec(rest), tempfile.mkdtemp(prefix="grpolab-phases-") + "/run", **overrides)
    ms = [S.train_step(run, step)[0] for step in range(1, own.steps + 1)]

    def med(key: str) -> float:
        return statistics.median(m[key] for m in ms[1:])

    print(
        json.dumps(
            {
                "generate_s": med("time/generate_s"),
                "update_s": med("time/update_s"),
                "step_s": med("time/step_s"),
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )
    return 0


def phases(a, bench_flags: list[str]) -> int:
    if a.other and a.cpu_malloc:
        raise SystemExit("ab.py phases: give --other TREE or --cpu-malloc A B, not both")
    if a.other:
        sides = {"this tree": (ROOT, []), a.other: (Path(a.other), [])}
    elif a.cpu_malloc:
        sides = {f"cpu_malloc={m}": (ROOT, ["--cpu-malloc", m]) for m in a.cpu_malloc}
    else:
        raise SystemExit("ab.py phases: give --other TREE or --cpu-malloc keep system")
    got: dict[str, list[dict]] = {k: [] for k in sides}
    for r in range(a.rounds):
        for name, (tree, extra) in sides.items():
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")]))
            p = subprocess.run(
                [sys.executable, __file__, "_phases", "--steps", str(a.steps), *extra, *bench_flags],
                env=env,
                capture_output=True,
                text=True,
            )
            if p.returncode != 0:
                print(p.stdout + p.stderr, file=sys.stderr)
                raise SystemExit(f"ab.py phases: the run of {name} failed (exit {p.returncode})")
            got[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            m = got[name][-1]
            print(
                f"round {r + 1} {name:>20s}: gen {m['generate_s']:.2f} update {m['update_s']:.2f} "
                f"step {m['step_s']:.2f} peak {m['peak_mb']:.0f} MB",
                flush=True,
            )
    (first, x), (second, y) = got.items()
    sx, sy = statistics.median(m["step_s"] for m in x), statistics.median(m["step_s"] for m in y)
    print(f"step seconds, median over rounds: {first} {sx:.2f}, {second} {sy:.2f}, ratio {sx / sy:.3f}")
    if a.json:
        import results

        setting = " ".join(bench_flags) or "the bench's default setting"
        if a.cpu_malloc:
            keep, system = (sx, sy) if first.endswith("keep") else (sy, sx)
            e = results.entry("cpu-malloc", f"{setting}, median of {a.rounds} rounds", keep, system)
        else:
            e = results.entry("step-ab", f"{setting}, median of {a.rounds} rounds (peer: {a.label or a.other})", sx, sy)
        results.record(a.json, [e])
    return 0


# ---- curves --------------------------------------------------------------------------------------


def load_metrics(path: str) -> list[dict]:
    p = Path(path)
    p = p / "metrics.jsonl" if p.is_dir() else p
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def curves(out: str, specs: list[str]) -> int:
    if not specs or any("=" not in s for s in specs):
        raise SystemExit("ab.py curves OUT.png LABEL=RUN_DIR_OR_METRICS_JSONL ... (at least one run)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(s.rsplit("=", 1)[0], load_metrics(s.rsplit("=", 1)[1])) for s in specs]  # a label may hold "="
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    styles = ["-o", "--s", ":^", "-.d", "-x", "--v"]
    first = runs[0][1]
    for (label, m), st in zip(runs, styles * 3):
        steps = [x["step"] for x in m]
        ax[0].plot(steps, [x["reward/mean"] for x in m], st, ms=4, label=label)
        ax[1].plot(steps, [x["completion/length_mean"] for x in m], st, ms=4, label=label)
        r = [x["reward/mean"] for x in m]
        diverge = next((x["step"] for x, y in zip(m, first) if x["reward/mean"] != y["reward/mean"]), None)
        print(
            f"{label:40s} reward first 5 {sum(r[:5]) / 5:.3f} last 5 {sum(r[-5:]) / 5:.3f}  length mean "
            f"{sum(x['completion/length_mean'] for x in m) / len(m):.1f}  first step with another reward than "
            f"{runs[0][0]!r}: {diverge}"
        )
    ax[0].set_title("reward/mean")
    ax[1].set_title("completion/length_mean")
    for x in ax:
        x.set_xlabel("step")
        x.grid(alpha=0.3)
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["_phases"]:
        return phases_worker(argv[1:])
    bench_flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_flags = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("decode", help="the lean decode step of this tree against another tree's")
    d.add_argument("other", help="a worktree of the commit to compare against")
    d.add_argument("--rounds", type=int, default=6)
    d.add_argument("--steps", type=int, default=48)
    p = sub.add_parser("phases", help="a bench setting's step, this tree against another, or cpu_malloc")
    p.add_argument("--other", help="a worktree of the commit to compare against")
    p.add_argument("--cpu-malloc", nargs=2, choices=("keep", "system"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    for q in (d, p):
        q.add_argument("--json", help="append the result to this JSON-lines file (benchmarks/results.py)")
        q.add_argument("--label", help="the other side's name in the result (default: its path)")
    c = sub.add_parser("curves", help="reward and length per step of several runs, as one figure")
    c.add_argument("out")
    c.add_argument("runs", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "decode":
        return decode(a)
    if a.cmd == "phases":
        return phases(a, bench_flags)
    return curves(a.out, a.runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
