"""Reward and completion length per step of several runs, side by side (docs/performance.md, "Learning
unchanged").

    .venv/bin/python benchmarks/learning_curves.py OUT.png LABEL=RUN_DIR_OR_METRICS_JSONL ...

Each argument after the image names one curve: a label, "=" (the last one), and a run directory (its metrics.jsonl) or
a metrics.jsonl file itself. Prints, per run, the mean reward of the first and last 5 steps and the
mean completion length, and the first step at which two runs' rewards differ (against the first run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: str) -> list[dict]:
    p = Path(path)
    p = p / "metrics.jsonl" if p.is_dir() else p
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(a.rsplit("=", 1)[0], load(a.rsplit("=", 1)[1])) for a in argv[1:]]  # a label may hold "="
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    styles = ["-o", "--s", ":^", "-.d", "-x", "--v"]
    first = runs[0][1]
    for (label, m), st in zip(runs, styles * 3):
        steps = [x["step"] for x in m]
        ax[0].plot(steps, [x["reward/mean"] for x in m], st, ms=4, label=label)
        ax[1].plot(steps, [x["completion/length_mean"] for x in m], st, ms=4, label=label)
        r = [x["reward/mean"] for x in m]
        diverge = next((x["step"] for x, y in zip(m, first) if x["reward/mean"] != y["reward/mean"]), None)
        print(f"{label:40s} reward first 5 {sum(r[:5]) / 5:.3f} last 5 {sum(r[-5:]) / 5:.3f}  length mean "
              f"{sum(x['completion/length_mean'] for x in m) / len(m):.1f}  first step with another reward than "
              f"{runs[0][0]!r}: {diverge}")
    ax[0].set_title("reward/mean")
    ax[1].set_title("completion/length_mean")
    for a in ax:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=7)
    fig.suptitle("demo recipe, steps=20 batch_size=16, seed 0", fontsize=9)
    fig.tight_layout()
    fig.savefig(argv[0], dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
