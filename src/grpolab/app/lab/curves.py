"""Claim: response length rises with reward during RL training (the DeepSeek-R1-Zero "aha"). Reads a
run's metrics.jsonl and prints reward/mean and completion/length_mean at the start, middle and end of
the run (means over the first, middle and last fifth of the steps) and their Pearson correlation across
steps. Whether it holds depends on the task: on the arithmetic demo the answers are short, and length
usually falls while reward rises (the policy learns to stop rambling) -- the verdict says so.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from grpolab.training.diagnostics import pearson

CLAIM = "response length rises with reward (the R1-Zero aha)"


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table
    from grpolab.training.metrics import read_jsonl

    ap = argparse.ArgumentParser(prog="grpolab lab curves", description=__doc__)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (with metrics.jsonl)")
    ns = ap.parse_args(argv)
    path = Path(ns.run_dir) / "metrics.jsonl"
    if not path.is_file():
        ap.error(f"{path}: no such file (RUN_DIR must be the out= directory of a grpolab train run)")
    recs = [
        r
        for r in read_jsonl(path)
        if isinstance(r.get("reward/mean"), (int, float)) and isinstance(r.get("completion/length_mean"), (int, float))
    ]
    if len(recs) < 3:
        ap.error(f"{path}: needs at least 3 steps with reward/mean and completion/length_mean, has {len(recs)}")
    reward = [float(r["reward/mean"]) for r in recs]
    length = [float(r["completion/length_mean"]) for r in recs]
    n = len(recs)
    k = max(1, n // 5)
    mid = n // 2 - k // 2
    spans = {"start": (0, k), "middle": (mid, mid + k), "end": (n - k, n)}
    res: dict = {"steps": n}
    rows = []
    for name, (a, b) in spans.items():
        res[name] = {"reward": sum(reward[a:b]) / (b - a), "length": sum(length[a:b]) / (b - a)}
        rows.append([name, res[name]["reward"], res[name]["length"]])
    corr = pearson(reward, length)
    res["corr"] = corr
    print(f"{path}: {n} steps (start/middle/end = means over {k} step{'s' if k > 1 else ''})")
    print(table(["", "reward/mean", "length_mean"], rows))
    print(f"Pearson correlation of reward and length across steps: {corr:.3f}")
    dr = res["end"]["reward"] - res["start"]["reward"]
    dl = res["end"]["length"] - res["start"]["length"]
    rise = "rises" if dr > 0 else "falls"
    if math.isnan(corr):
        verdict = "not measured: reward or length is constant over the run"
    elif corr > 0 and dl > 0:
        verdict = f"holds here: reward {rise} ({dr:+.3g}) and length rises ({dl:+.3g}); correlation {corr:.2f}"
    else:
        verdict = (
            f"does not hold here: reward {rise} ({dr:+.3g}) while length "
            f"{'rises' if dl > 0 else 'falls'} ({dl:+.3g}); correlation {corr:.2f}"
            + (" -- length falls as reward rises" if corr < 0 else "")
        )
    print(verdict)
    res["verdict"] = verdict
    return res
