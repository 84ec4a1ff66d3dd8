"""The evaluation statistics (grpolab.algo.stats): pass@k against hand-computed values and its
unbiasedness by Monte Carlo, the coverage of the 95% intervals by simulation, and the arithmetic of
the paired before/after comparison."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from grpolab.algo.stats import (
    bootstrap_interval,
    default_ks,
    describe_change,
    mcnemar_exact_p,
    paired_comparison,
    pass_at_k,
    pass_at_k_per_prompt,
    wilson_interval,
)


def test_pass_at_k_hand_computed():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    # k=1 is the fraction correct: 2/5
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-12)
    # n=10, c=3, k=4: 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6, abs=1e-12)
    # n - c < k: every 4-subset of 5 samples with 2 correct holds one
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 5) == 1.0
    # the product form against the binomial ratio for every (c, k) of n=16
    for c in range(17):
        for k in range(1, 17):
            want = 1 - comb(16 - c, k) / comb(16, k)
            assert pass_at_k(16, c, k) == pytest.approx(want, abs=1e-12), (c, k)
            assert pass_at_k_per_prompt(16, [c], k)[0] == pytest.approx(want, abs=1e-12), (c, k)


def test_pass_at_k_is_stable_at_large_n():
    # n=1000, c=1, k=500: C(999,500)/C(1000,500) = 500/1000, though both binomials overflow a float
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-9)
    assert pass_at_k_per_prompt(1000, [1, 0, 1000], 500) == pytest.approx([0.5, 0.0, 1.0], abs=1e-9)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k_per_prompt(4, [5], 1)


def test_pass_at_k_is_unbiased_by_monte_carlo():
    """E[pass@k(n, c)] over c ~ Binomial(n, p) is 1 - (1 - p)^k: the mean of 200,000 draws lies within
    5 standard errors of it for each (p, k)."""
    rng = np.random.default_rng(0)
    n, draws = 16, 200_000
    for p in (0.05, 0.15, 0.3):  # p small enough that c = 0 is drawn: the k = n estimate is not constant
        c = rng.binomial(n, p, draws)
        for k in (1, 4, 16):
            est = pass_at_k_per_prompt(n, c, k)
            truth = 1 - (1 - p) ** k
            se = est.std() / np.sqrt(draws) + 1e-12
            assert abs(est.mean() - truth) < 5 * se + 1e-9, (p, k, est.mean(), truth)
    # the naive plug-in 1 - (1 - c/n)^k is biased low at k > 1: the test would see it
    c = rng.binomial(n, 0.05, draws)
    naive = 1 - (1 - c / n) ** 16
    assert 1 - 0.95**16 - naive.mean() > 0.05


def test_default_ks():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]


def test_wilson_hand_computed():
    # x=3, m=10, z=1.96: centre (0.3 + 0.19208)/1.38416 = 0.35548; half 1.96/1.38416 * sqrt(0.021 + 0.0096040)
    lo, hi = wilson_interval(3, 10, z=1.96)
    centre, half = (0.3 + 1.96**2 / 20) / (1 + 1.96**2 / 10), 1.96 / (1 + 1.96**2 / 10) * (0.021 + 1.96**2 / 400) ** 0.5
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert (lo, hi) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0 and 0.15 < hi < 0.17  # not a point at 0 successes
    with pytest.raises(ValueError):
        wilson_interval(3, 0)


@pytest.mark.parametrize("m,p", [(50, 0.2), (100, 0.5)])
def test_wilson_covers_the_truth_95_percent(m, p):
    """2,000 binomial draws: the 95% Wilson interval holds p in 93-97% of them."""
    x = np.random.default_rng(1).binomial(m, p, 2000)
    lo, hi = wilson_interval(x, np.full(2000, m))
    coverage = float(((lo <= p) & (p <= hi)).mean())
    assert 0.93 <= coverage <= 0.97, coverage


def test_bootstrap_of_pass_at_k_covers_the_truth_95_percent():
    """2,000 evaluations of 80 prompts whose success rates p ~ Beta(1, 2), 8 samples each: the
    bootstrap interval of mean pass@2 over the prompts holds the population's pass@2,
    E[1 - (1 - p)^2] = 1 - (2/3)(3/4) = 0.5, in 93-97% of them."""
    rng = np.random.default_rng(1)
    m, n, k, truth = 80, 8, 2, 0.5
    covered = []
    for chunk in range(20):  # 100 evaluations at a time share one set of resample indices
        c = rng.binomial(n, rng.beta(1, 2, (100, m)))
        lo, hi = bootstrap_interval(pass_at_k_per_prompt(n, c, k), resamples=1000, seed=chunk)
        covered.append((lo <= truth) & (truth <= hi))
    coverage = float(np.concatenate(covered).mean())
    assert 0.93 <= coverage <= 0.97, coverage


def test_bootstrap_is_seeded_and_brackets_the_mean():
    v = np.arange(20) % 3 / 2
    assert bootstrap_interval(v, seed=3) == bootstrap_interval(v, seed=3)
    lo, hi = bootstrap_interval(v)
    assert lo < v.mean() < hi
    assert bootstrap_interval(np.ones(7)) == (1.0, 1.0)  # no spread, no width


def test_paired_comparison_arithmetic():
    before = np.array([0, 0, 1, 0, 1, 0, 0, 0, 1, 1], dtype=float)
    after = np.array([1, 1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=float)
    cmp = paired_comparison(before, after)
    # means 4/10 -> 7/10; differences (1, 1, 0, 0, 0, 1, 1, 0, -1, 0): mean 3/10
    assert cmp["before"] == pytest.approx(0.4) and cmp["after"] == pytest.approx(0.7)
    assert cmp["change"] == pytest.approx(0.3) and cmp["prompts"] == 10
    assert cmp["gained"] == 4 and cmp["lost"] == 1
    # McNemar: d = 5, min = 1: p = 2 (C(5,0) + C(5,1)) / 32 = 12/32
    assert cmp["mcnemar_p"] == pytest.approx(12 / 32)
    assert not cmp["beyond_noise"]
    # the interval is the bootstrap of the per-prompt differences, not of either side alone
    assert tuple(cmp["ci"]) == bootstrap_interval(after - before)
    assert "within noise" in describe_change("accuracy", cmp)


def test_paired_comparison_sees_a_real_change():
    """40 of 50 prompts gained, none lost: beyond noise, and the sentence says so."""
    before, after = np.zeros(50), np.r_[np.ones(40), np.zeros(10)]
    cmp = paired_comparison(before, after)
    assert cmp["beyond_noise"] and cmp["mcnemar_p"] == pytest.approx(2 * 0.5**40)
    assert 0.65 < cmp["ci"][0] < 0.8 < cmp["ci"][1] < 0.92
    text = describe_change("pass@1", cmp)
    assert text.startswith("pass@1 0.0% -> 80.0%: +80.0 points (95% CI +") and "beyond noise" in text


def test_pairing_narrows_the_interval():
    """Per-prompt scores that share the prompt's difficulty: the paired interval of the change is much
    narrower than the independent intervals of the two means would suggest."""
    rng = np.random.default_rng(2)
    difficulty = rng.uniform(0, 1, 64)
    before, after = difficulty, np.clip(difficulty + 0.05 + rng.normal(0, 0.01, 64), 0, 1)
    cmp = paired_comparison(before, after, binary=False)
    lo_b, hi_b = bootstrap_interval(before)
    assert cmp["beyond_noise"] and (cmp["ci"][1] - cmp["ci"][0]) < (hi_b - lo_b) / 5
    assert "mcnemar_p" not in cmp


def test_mcnemar_exact():
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(4, 0) == pytest.approx(2 / 16)  # 2 * C(4,0) / 2^4
    assert mcnemar_exact_p(3, 3) == 1.0
