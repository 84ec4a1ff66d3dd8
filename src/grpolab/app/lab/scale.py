"""Claim: the signal is relative. GRPO's group z-score advantage is invariant to any increasing affine
change of the reward, r -> a*r + b with a > 0 (up to the adv_eps guard), so GRPO needs rewards that
order the completions, not rewards that are calibrated. REINFORCE without a baseline (A = r) is not
invariant; the group mean baseline removes b but keeps a. For a few (a, b): the max |A(a*r+b) - A(r)|
over a batch of random rewards, per estimator.
"""

from __future__ import annotations

import argparse

import torch

from grpolab.algo.advantages import compute_advantages
from grpolab.algo.presets import resolve_algo

CLAIM = "the signal is relative: GRPO needs rewards that order, not rewards that are calibrated"
ESTIMATORS = ("group_zscore", "group_mean", "rloo", "none")
DEFAULT_AB = "2:0,0.5:3,10:-5,100:100"


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(prog="grpolab lab scale", description=__doc__)
    ap.add_argument("--ab", default=DEFAULT_AB, help=f"a:b pairs, comma-separated, a > 0 (default {DEFAULT_AB})")
    ap.add_argument("--G", type=int, default=8, help="group size (default 8)")
    ap.add_argument("--groups", type=int, default=64, help="groups (prompts) (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    try:
        pairs = [tuple(float(x) for x in p.split(":")) for p in ns.ab.split(",") if p.strip()]
        assert all(len(p) == 2 and p[0] > 0 for p in pairs) and pairs
    except (ValueError, AssertionError):
        ap.error(f"--ab: expected a:b pairs with a > 0, got {ns.ab!r}")
    if ns.G < 2:
        ap.error("--G must be >= 2")
    gen = torch.Generator().manual_seed(ns.seed)
    # graded rewards in [0, 1] (e.g. a partial-credit verifier), float64 so eps is the only difference
    r = torch.rand(ns.groups * ns.G, generator=gen, dtype=torch.float64)
    res: dict = {"pairs": {}}
    rows = []
    for a, b in pairs:
        key = f"{a:g}:{b:g}"
        res["pairs"][key] = {}
        row = [f"a={a:g} b={b:g}"]
        for name in ESTIMATORS:
            algo = resolve_algo("grpo", {"advantage": name, "adv_scale": "none"})
            d = float((compute_advantages(a * r + b, ns.G, algo) - compute_advantages(r, ns.G, algo)).abs().max())
            res["pairs"][key][name] = d
            row.append(d)
        rows.append(row)
    print(f"max |A(a*r + b) - A(r)| over {ns.groups} groups of G={ns.G}, rewards uniform in [0, 1]")
    print(table(["transform"] + list(ESTIMATORS), rows))
    z = max(v["group_zscore"] for v in res["pairs"].values())
    n = min(v["none"] for v in res["pairs"].values())
    holds = z < 1e-2 and n > 0.1
    verdict = (
        f"{'holds' if holds else 'does not hold here'}: group z-score advantages change by at most {z:.2g} "
        f"(the eps guard) under a*r + b, REINFORCE's by at least {n:.3g}; group_mean and rloo remove b "
        f"but scale with a"
    )
    print(verdict)
    res["verdict"] = verdict
    return res
