"""Claim: G = 1 gives no signal. With one sample per prompt the group mean is the sample itself, so the
group-relative advantage (GRPO's z-score) is exactly 0 and the gradient vanishes. For each G, on the
exact-gradient bandit: the fraction of samples whose advantage is exactly zero (every group with equal
rewards gets zero too) and the mean norm of the batch gradient, under group_zscore.
"""

from __future__ import annotations

import argparse

from grpolab.app.lab import bandit

CLAIM = "G = 1 gives no signal"


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(prog="grpolab lab g1", description=__doc__)
    ap.add_argument("--Gs", default="1,2,4,8,16", help="group sizes, comma-separated (default 1,2,4,8,16)")
    ap.add_argument("--batches", type=int, default=2000, help="independent groups per G (default 2000)")
    ap.add_argument("--advantage", default="group_zscore", help="estimator (default group_zscore)")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    try:
        Gs = [int(x) for x in ns.Gs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--Gs: expected comma-separated integers, got {ns.Gs!r}")
    if not Gs or min(Gs) < 1:
        ap.error("--Gs: group sizes must be >= 1")
    res: dict = {"advantage": ns.advantage, "G": {}}
    rows = []
    for G in Gs:
        est, adv = bandit.estimates(ns.advantage, ns.batches, G, seed=ns.seed + G)
        zero = float((adv == 0).double().mean())
        norm = float(est.norm(dim=1).mean())
        res["G"][G] = {"zero_frac": zero, "grad_norm": norm}
        rows.append([G, zero, norm])
    print(f"softmax bandit, 0/1 rewards, advantage {ns.advantage}, {ns.batches} groups per G")
    print(table(["G", "zero adv frac", "mean |grad|"], rows))
    if 1 in res["G"]:
        z = res["G"][1]
        holds = z["zero_frac"] == 1.0 and z["grad_norm"] == 0.0
        verdict = (
            "holds: G=1 gives advantage exactly 0 for every sample and a zero gradient"
            if holds
            else f"does not hold here: G=1 gives zero-advantage fraction {z['zero_frac']:.3g}, "
            f"mean gradient norm {z['grad_norm']:.3g}"
        )
        others = [G for G in res["G"] if G > 1]
        if holds and others:
            verdict += (
                f"; larger groups carry signal (zero fraction {res['G'][max(others)]['zero_frac']:.3g} "
                f"at G={max(others)}: only groups whose rewards all agree are silent)"
            )
    else:
        verdict = "not measured: include G=1 in --Gs"
    print(verdict)
    res["verdict"] = verdict
    return res
