"""Evaluation statistics: pass@k, 95% intervals, and paired before/after comparisons (numpy, no torch).

    pass_at_k(n, c, k)                    unbiased pass@k of one prompt (Chen et al. 2021)
    pass_at_k_per_prompt(n, c, k)         the same for an array of per-prompt counts
    wilson_interval(x, m)                 95% interval of a proportion x/m (Wilson 1927)
    bootstrap_interval(values)            95% percentile interval of a mean, resampling prompts (Efron 1979)
    paired_comparison(a, b)               mean of b - a over the same prompts, its paired bootstrap
                                          interval, McNemar's exact test for 0/1 outcomes, one sentence

Every interval here treats the prompts as the sampled unit: the held-out prompts are a sample of the
task, and the samples of one prompt are correlated (they share its difficulty), so resampling whole
prompts is what carries the prompt-to-prompt spread into the interval (docs/evaluation.md).
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054
"""The two-sided 95% quantile of the standard normal, Phi^-1(0.975)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt from n samples of which c are correct:

        pass@k = 1 - C(n - c, k) / C(n, k)
               = 1 - prod_{i = n-c+1}^{n} (1 - k / i)          (the numerically stable product form)

    and 1 when n - c < k (every k-subset holds a correct sample). It is the probability that k samples
    drawn without replacement from the n hold at least one correct one; its expectation over the draw
    of the n samples is 1 - (1 - p)^k, the pass@k of the prompt's true success rate p.
    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex), eq. 1 and
    the numpy snippet of its figure 3.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_per_prompt(n: int, correct, k: int) -> np.ndarray:
    """pass_at_k(n, c_j, k) for every prompt j of `correct` (an array of counts c_j of any shape): the
    product 1 - prod_{i=n-c+1}^{n} (1 - k/i) as one cumulative product over i = 1..n, read at c.
    Source: Chen et al. 2021 (eq. 1), vectorised."""
    c = np.asarray(correct, dtype=np.int64)
    if not 1 <= k <= n or (c < 0).any() or (c > n).any():
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, k={k}")
    i = np.arange(1, n + 1, dtype=np.float64)
    factors = np.clip(1.0 - k / i, 0.0, None)  # i <= k gives a factor <= 0: the product is 0 there
    # prod_{i=n-c+1}^{n} = prod_{i=1}^{n} / prod_{i=1}^{n-c}; computed as a suffix product to avoid 0/0
    suffix = np.concatenate([np.cumprod(factors[::-1])[::-1], [1.0]])  # suffix[m] = prod_{i=m+1}^{n}
    return 1.0 - suffix[n - c]


def default_ks(n: int) -> list[int]:
    """The k reported for n samples per prompt: the powers of two below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 1 else []


def wilson_interval(successes, trials, z: float = Z95) -> tuple:
    """Wilson score interval of a proportion p_hat = x / m (95% with the default z):

        centre = (p_hat + z^2 / (2m)) / (1 + z^2 / m)
        half   = z / (1 + z^2 / m) * sqrt(p_hat (1 - p_hat) / m + z^2 / (4 m^2))

    Unlike p_hat +- z sqrt(p_hat (1 - p_hat) / m) it stays inside [0, 1] and does not collapse to a
    point at 0 or m successes. Works elementwise on arrays. Source: Wilson 1927, "Probable inference,
    the law of succession, and statistical inference" (JASA 22); Brown, Cai & DasGupta 2001
    recommend it for small m.
    """
    x = np.asarray(successes, dtype=np.float64)
    m = np.asarray(trials, dtype=np.float64)
    if (m <= 0).any() or (x < 0).any() or (x > m).any():
        raise ValueError(f"wilson_interval needs 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    p = x / m
    denom = 1.0 + z * z / m
    centre = (p + z * z / (2 * m)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    lo, hi = np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


def bootstrap_indices(m: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, m) indices drawn with replacement from range(m), from a seeded generator."""
    return np.random.default_rng(seed).integers(0, m, size=(resamples, m))


def bootstrap_interval(values, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple:
    """Percentile bootstrap interval of the mean of `values` over its last axis (the prompts):

        draw B resamples of the m prompts with replacement, mean_b = mean of resample b;
        interval = (quantile_{(1-level)/2}(mean_b), quantile_{(1+level)/2}(mean_b))

    Any leading axes are independent sets of values sharing the same resample indices (seeded, so the
    interval of the same values is always the same). For pass@k, `values` are the per-prompt unbiased
    estimates; for a before/after change, the per-prompt differences (paired_comparison).
    Source: Efron 1979, "Bootstrap methods: another look at the jackknife" (Ann. Statist. 7);
    Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13 (percentile interval).
    """
    v = np.asarray(values, dtype=np.float64)
    m = v.shape[-1]
    if m == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    idx = bootstrap_indices(m, resamples, seed)
    means = v[..., idx].mean(axis=-1)  # (..., B)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, alpha, axis=-1), np.quantile(means, 1 - alpha, axis=-1)
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


def mcnemar_exact_p(b01: int, b10: int) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes: of the d = b01 + b10 discordant prompts
    (wrong before and right after: b01; right before and wrong after: b10), under "no change" each is
    equally likely either way, so

        p = min(1, 2 * sum_{i=0}^{min(b01, b10)} C(d, i) / 2^d)          (1 when d = 0).

    Source: McNemar 1947, "Note on the sampling error of the difference between correlated proportions
    or percentages" (Psychometrika 12); the exact binomial form, e.g. Fagerland, Lydersen & Laake 2013.
    """
    d = b01 + b10
    if d == 0:
        return 1.0
    tail = sum(math.comb(d, i) for i in range(min(b01, b10) + 1)) / 2.0**d
    return min(1.0, 2.0 * tail)


def paired_comparison(
    before, after, *, resamples: int = 2000, seed: int = 0, level: float = 0.95, binary: bool | None = None
) -> dict:
    """Change of a per-prompt metric measured on the same prompts before and after:

        d_j = after_j - before_j,  change = mean_j d_j = mean(after) - mean(before),
        interval = percentile bootstrap of mean(d) over the prompts (bootstrap_interval(d)).

    Resampling the differences keeps each prompt's before and after together, so what both share (the
    prompt's difficulty) cancels: the paired interval is narrower than one from two independent
    samples. For 0/1 outcomes (greedy accuracy; `binary`, detected when None), also McNemar's exact
    p-value on the discordant prompts. `beyond_noise`: the interval excludes 0 and, for 0/1 outcomes,
    McNemar's p < 0.05 as well (the percentile bootstrap is too narrow with a handful of discordant
    prompts: 4 gained and 0 lost exclude 0 from it, yet p = 0.125).
    Source: Efron & Tibshirani 1993 (bootstrap of paired differences); McNemar 1947.
    """
    a = np.asarray(before, dtype=np.float64)
    b = np.asarray(after, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(
            f"paired_comparison needs two equal-length 1-D arrays of per-prompt values, "
            f"got shapes {a.shape} and {b.shape}"
        )
    d = b - a
    lo, hi = bootstrap_interval(d, resamples=resamples, seed=seed, level=level)
    out = {
        "before": float(a.mean()),
        "after": float(b.mean()),
        "change": float(d.mean()),
        "ci": [lo, hi],
        "prompts": len(a),
        "beyond_noise": bool(lo > 0 or hi < 0),
    }
    if binary is None:
        binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    if binary:
        b01, b10 = int(((a == 0) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())
        p = mcnemar_exact_p(b01, b10)
        out.update({"gained": b01, "lost": b10, "mcnemar_p": p, "beyond_noise": out["beyond_noise"] and p < 0.05})
    return out


def describe_change(name: str, cmp: dict, *, percent: bool = True) -> str:
    """One sentence on a paired_comparison: the two values, the change with its 95% interval, and
    whether the change is beyond noise (the interval excludes 0) or within it."""
    f = (lambda x: f"{100 * x:.1f}%") if percent else (lambda x: f"{x:.3g}")
    g = (lambda x: f"{100 * x:+.1f}") if percent else (lambda x: f"{x:+.3g}")
    unit = " points" if percent else ""
    lo, hi = cmp["ci"]
    text = (
        f"{name} {f(cmp['before'])} -> {f(cmp['after'])}: {g(cmp['change'])}{unit} "
        f"(95% CI {g(lo)} to {g(hi)}, paired over {cmp['prompts']} prompts"
    )
    if "mcnemar_p" in cmp:
        text += f"; {cmp['gained']} gained, {cmp['lost']} lost, McNemar p = {cmp['mcnemar_p']:.3g}"
    text += "): "
    excludes = lo > 0 or hi < 0
    if cmp["beyond_noise"]:
        text += f"beyond noise, the interval excludes 0 ({'a rise' if cmp['change'] > 0 else 'a fall'})"
    elif excludes:  # McNemar disagrees: too few discordant prompts
        text += (
            f"within noise: the interval excludes 0, but McNemar's exact test on the "
            f"{cmp['gained'] + cmp['lost']} prompts that changed gives p >= 0.05"
        )
    else:
        text += "within noise, the interval includes 0: these prompts cannot tell the two apart"
    return text


__all__ = [
    "Z95",
    "bootstrap_indices",
    "bootstrap_interval",
    "default_ks",
    "describe_change",
    "mcnemar_exact_p",
    "paired_comparison",
    "pass_at_k",
    "pass_at_k_per_prompt",
    "wilson_interval",
]
