"""Claim: a baseline changes the variance of the policy-gradient estimate, never its expectation.

On the exact-gradient bandit (grpolab.app.lab.bandit), M batches of G samples per estimator; for each:
  bias/SE  max over arms of |mean of the M estimates - exact grad J| / standard error
  cosine   cosine between the mean estimate and the exact gradient
  var/none total variance (trace of the covariance) relative to REINFORCE (advantage none)
  scale    least-squares factor s with mean estimate ~ s * exact grad
Expected: none and rloo unbiased; batch_mean and group_mean include the sample in their own mean and
estimate (1 - 1/G) grad J (a shrink, same direction); group_zscore divides by the sample's group std
and estimates a rescaled, reweighted gradient, not grad J.
"""

from __future__ import annotations

import argparse

from grpolab.app.lab import bandit

CLAIM = "a baseline changes the variance, never the expectation"
ESTIMATORS = ("none", "rloo", "batch_mean", "group_mean", "group_zscore")


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(prog="grpolab lab baseline", description=CLAIM + ". " + __doc__.split("\n")[2])
    ap.add_argument("--G", type=int, default=4, help="samples per batch (= group size) (default 4)")
    ap.add_argument("--batches", type=int, default=4000, help="independent batches M (default 4000)")
    ap.add_argument(
        "--offset",
        type=float,
        default=1.0,
        help="constant added to every 0/1 reward; a baseline removes it (default 1.0)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    if ns.G < 2 or ns.batches < 10:
        ap.error("--G must be >= 2 and --batches >= 10")
    exact = bandit.exact_grad(mean_r=bandit.mean_rewards(ns.offset))
    res: dict = {"G": ns.G, "batches": ns.batches}
    rows = []
    var_none = None
    for i, name in enumerate(ESTIMATORS):
        est, _ = bandit.estimates(name, ns.batches, ns.G, seed=ns.seed + i, offset=ns.offset)
        mean = est.mean(0)
        bias = float(bandit.z_scores(est, exact).abs().max())
        var = float(est.var(0).sum())
        var_none = var if var_none is None else var_none
        s = float((mean @ exact) / (exact @ exact))
        res[name] = {"bias_se": bias, "cosine": bandit.cosine(mean, exact), "var_ratio": var / var_none, "scale": s}
        rows.append([name, bias, res[name]["cosine"], var / var_none, s])
    print(
        f"softmax bandit, {len(exact)} arms, Bernoulli rewards + {ns.offset:g}, G={ns.G}, "
        f"{ns.batches} batches; exact grad J in closed form"
    )
    print(table(["advantage", "bias/SE", "cosine", "var/none", "scale"], rows))
    print(f"(unbiased: bias/SE < 5 and scale ~ 1; group/batch mean expect scale 1 - 1/G = {1 - 1 / ns.G:.3g})")
    unbiased = [n for n in ESTIMATORS if res[n]["bias_se"] < 5]
    lower = [n for n in ESTIMATORS[1:] if res[n]["var_ratio"] < 1]
    holds = "none" in unbiased and "rloo" in unbiased and "rloo" in lower
    verdict = (
        f"{'holds' if holds else 'does not hold here'}: unbiased: {', '.join(unbiased) or '-'}; "
        f"lower variance than REINFORCE: {', '.join(lower) or '-'}. The mean baselines (batch_mean, "
        f"group_mean) include the sample itself, so they shrink the gradient by 1 - 1/G (direction kept); "
        f"group_zscore divides by the std and estimates a rescaled gradient, not grad J."
    )
    print(verdict)
    res["unbiased"] = unbiased
    res["lower_variance"] = lower
    res["verdict"] = verdict
    return res
