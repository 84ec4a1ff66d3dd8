"""benchmarks/results.py: docs/results.md is what the recorded entries give (no hand edits, no stale
table), a regression of more than 5% against the previous entry of the same claim, setting and machine
is flagged and a smaller change or another machine's entry is not, and the accuracy interval is the
Wilson score interval."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


results = benchmark_script("results")


def test_results_page_is_current():
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "results.py"), "--check"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr


def test_every_entry_names_its_provenance():
    for e in results.load():
        assert e["claim"] in results.CLAIMS
        assert e["date"][:2] == "20" and len(e["date"]) == 10, e
        assert e["commit"] and e["machine"] and e["command"], e
        if e["grpolab"] is not None and e["peer"]:
            assert e["ratio"] == pytest.approx(e["grpolab"] / e["peer"], rel=0.01), e


def _e(ratio: float, machine: str = "m", date: str = "2026-01-01", claim: str = "bench-step") -> dict:
    return {
        "claim": claim,
        "setting": "s",
        "machine": machine,
        "grpolab": ratio * 10,
        "peer": 10.0,
        "ratio": ratio,
        "interval": None,
        "n": None,
        "date": date,
        "commit": "abc",
        "command": "c",
    }


def test_a_regression_over_five_percent_is_flagged():
    # step time (lower is better): 0.30 -> 0.32 is 6.7% worse, 0.32 -> 0.33 is 3.1% worse
    page = results.render([_e(0.30), _e(0.32, date="2026-01-02"), _e(0.33, date="2026-01-03")])
    rows = [line for line in page.splitlines() if line.startswith("| s |")]
    assert len(rows) == 3
    assert "**worse** (7% against 2026-01-01)" in rows[1]
    assert "worse" not in rows[0] and "worse" not in rows[2]


def test_another_machine_or_a_better_entry_is_not_flagged():
    page = results.render([_e(0.30), _e(0.40, machine="other", date="2026-01-02"), _e(0.20, date="2026-01-03")])
    assert not [line for line in page.splitlines() if line.startswith("| s |") and "worse" in line]
    # throughput (higher is better): a drop of 10% is flagged
    tok = [
        dict(_e(1.0, claim="engine-speed"), grpolab=100.0, peer=100.0),
        dict(_e(0.9, claim="engine-speed", date="2026-01-02"), grpolab=90.0, peer=100.0),
    ]
    assert "**worse** (10%" in results.render(tok)


def test_a_prediction_is_judged_by_its_distance_from_one():
    before, after = _e(0.99, claim="memory-plan"), _e(1.05, claim="memory-plan", date="2026-01-02")
    assert results.worse_by("memory-plan", before, after) == pytest.approx(0.04)
    assert results.worse_by("memory-plan", after, before) == pytest.approx(-0.04)


def test_wilson_interval():
    # all 164 right: the lower bound is 1 / (1 + z^2/n)
    lo, hi = results.wilson(164, 164)
    assert lo == pytest.approx(1 / (1 + 1.96**2 / 164)) and hi == pytest.approx(1.0)
    # 32 of 64: symmetric about 0.5, half-width z sqrt(1/4n + z^2/4n^2) / (1 + z^2/n)
    lo, hi = results.wilson(32, 64)
    half = 1.96 * math.sqrt(0.25 / 64 + 1.96**2 / (4 * 64**2)) / (1 + 1.96**2 / 64)
    assert (lo, hi) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))


def test_an_unknown_claim_is_refused():
    with pytest.raises(ValueError, match="unknown claim"):
        results.entry("no-such-claim", "s", 1.0, 1.0)
