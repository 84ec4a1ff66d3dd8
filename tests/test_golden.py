"""Every preset, end to end through `grpolab train` on the tiny model, checked two ways that hold on any CPU.

1. Determinism: the same fixed-seed run done twice on the machine at hand gives bit-identical metrics
   (every logged number but wall-clock and memory figures), samples and final weights.
2. Hand-computed references: from the run's own record of step 1 (samples.jsonl holds every sample's
   shaped reward, length and per-token values), the test recomputes by the papers' formulas

   - the advantages: group z-score (r - mean_G r) / (std_G r + eps) with the population std (GRPO,
     Shao et al. 2024, eq. 3), r - mean_G r (Dr. GRPO, Liu et al. 2025), G/(G-1) (r - mean_G r) (RLOO,
     Ahmadian et al. 2024), r (REINFORCE, Williams 1992), each against the recorded per-token advantage
     within 5e-5 (samples.jsonl rounds it to 4 decimals);
   - which groups the update computes: those whose advantages are not all zero;
   - on-policy at step 1 with one update per rollout, the importance ratio of every token is 1, so every
     objective's per-token loss is -A_i (clipped surrogate, GSPO's sequence ratio, CISPO's clipped weight,
     plain policy gradient alike) and the logged `loss/policy`, a token-weighted mean over the computed
     sequences, is -sum_i L_i A_i / sum_i L_i, within 1e-5 of the value recomputed in float64;
   - the KL in the loss is 0 at step 1, where the policy is the reference.

The number recorded by the run and the one recomputed by the test come from independent code: a
change to an advantage, an objective or an aggregation fails here on any machine, and a change that
makes runs irreproducible fails the determinism check. PPO (GAE over a critic's values) and runs with
several updates per rollout get the determinism check and the advantage-free checks only.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl, weights

from grpolab.algo.presets import resolve_algo
from grpolab.app.cli import main

# name: (preset, algo.* overrides, other settings)
RUNS = {
    **{name: (name, {}, []) for name in ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce", "ppo")},
    "grpo_adaptive_kl": ("grpo", {"adaptive_kl": True, "kl_target": 0.001}, []),
    "grpo_mu2": ("grpo", {"mu": 2}, ["lr=1e-3"]),
    "rloo_kl_in_reward": ("rloo", {"beta": 0.05}, []),
}
STEPS, BATCH, G, NEW = 2, 8, 4, 8
ARGS = [
    f"steps={STEPS}",
    f"batch_size={BATCH}",
    f"G={G}",
    f"max_new_tokens={NEW}",
    "micro_batch=4",
    "eval_size=0",
    "progress=false",
    f"samples_per_step={BATCH}",
    f"sample_tokens={NEW}",
    "tensorboard=false",
    "report=false",
    "save_every=0",
    "rewards=[{name: test_varied}]",
    "lr=1e-4",
]
SKIP_PREFIXES = ("time/", "memory/")  # wall clock and process-wide numbers
ADV_TOL = 5e-5 + 1e-6  # samples.jsonl rounds advantages to 4 decimals
LOSS_TOL = 1e-5

pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry


def run_preset(name: str, model_dir: Path, out: Path) -> dict:
    preset, overrides, extra = RUNS[name]
    algo = [
        f"algo={preset}",
        *(f"algo.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()),
    ]
    assert main(["train", f"model={model_dir}", f"out={out}", *algo, *ARGS, *extra]) == 0
    metrics = [
        {k: v for k, v in m.items() if not k.startswith(SKIP_PREFIXES)} for m in read_jsonl(out / "metrics.jsonl")
    ]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    return {
        "metrics": metrics,
        "samples": read_jsonl(out / "samples.jsonl"),
        "weights": weights(out / "checkpoints" / f"step-{STEPS:06d}"),
    }


def advantages(rewards: list[float], estimator: str, eps: float) -> list[float]:
    """The papers' sequence advantages in float64, group by group (groups of G consecutive samples)."""
    out = []
    for g in range(0, len(rewards), G):
        r = rewards[g : g + G]
        mean = sum(r) / G
        if estimator == "group_zscore":
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / G)  # population std
            out += [(x - mean) / (std + eps) for x in r]
        elif estimator == "group_mean":
            out += [x - mean for x in r]
        elif estimator == "rloo":
            out += [x - (sum(r) - x) / (G - 1) for x in r]
        elif estimator == "none":
            out += list(r)
        else:
            raise AssertionError(f"no hand formula for {estimator}")
    return out


@pytest.mark.parametrize("name", sorted(RUNS))
def test_preset_is_deterministic_and_matches_hand_computed_references(name, tiny_model_dir, tmp_path):
    a, b = (run_preset(name, tiny_model_dir, tmp_path / side) for side in ("a", "b"))
    # 1. determinism: bit-identical metrics, samples and weights
    assert a["metrics"] == b["metrics"], [
        (m["step"], k, m[k], n.get(k)) for m, n in zip(a["metrics"], b["metrics"]) for k in m if m[k] != n.get(k)
    ][:10]
    assert a["samples"] == b["samples"]
    assert a["weights"].keys() == b["weights"].keys()
    assert all(a["weights"][k].equal(b["weights"][k]) for k in a["weights"]), "final weights differ between runs"

    # 2. hand-computed references from step 1's record
    preset, overrides, _ = RUNS[name]
    algo = resolve_algo(preset, overrides)
    step1 = [s for s in a["samples"] if s["step"] == 1]
    assert len(step1) == BATCH and all(s["tokens"]["shown"] == s["length"] for s in step1)
    m1 = a["metrics"][0]
    computed = [s["tokens"]["computed"] for s in step1]
    if algo.advantage != "gae":
        want = advantages([s["reward_shaped"] for s in step1], algo.advantage, algo.adv_eps)
        for s, adv in zip(step1, want):
            got = [x for x in s["tokens"]["adv"] if x is not None]
            assert len(got) == s["length"] and all(abs(x - adv) <= ADV_TOL for x in got), (name, got, adv)
        # the update computes exactly the groups that carry a signal
        for g in range(0, BATCH, G):
            assert all(computed[g : g + G]) == any(abs(x) > 0 for x in want[g : g + G]), (name, g, want[g : g + G])
            assert len(set(computed[g : g + G])) == 1
        rows = [i for i in range(BATCH) if computed[i]]
        if algo.mu == 1 and rows:
            tokens = sum(step1[i]["length"] for i in rows)
            loss = -sum(step1[i]["length"] * want[i] for i in rows) / tokens
            assert m1["loss/policy"] == pytest.approx(loss, abs=LOSS_TOL), (name, m1["loss/policy"], loss)
            assert m1["adv/mean"] == pytest.approx(-loss, abs=LOSS_TOL)
    if algo.mu == 1 and any(computed):
        ratios = [x for s in step1 if s["tokens"]["computed"] for x in s["tokens"]["ratio"] if x is not None]
        assert ratios and all(x == 1.0 for x in ratios), name  # on-policy: pi_theta / pi_old = 1 to the bit
        assert m1["ratio/mean"] == 1.0 and m1["clip/frac"] == 0.0
    if algo.mu == 1 and algo.beta > 0 and algo.kl_placement == "in_loss":
        assert abs(m1["kl"]) <= 1e-6 and abs(m1["loss/kl"]) <= 1e-6, (name, m1["kl"])


def test_the_hand_formulas():
    """The test's own advantage formulas on a worked group: rewards (0, 1, 1, 2), mean 1, population std
    sqrt(1/2)."""
    r = [0.0, 1.0, 1.0, 2.0]
    s = math.sqrt(0.5)
    assert advantages(r, "group_zscore", 0.0) == pytest.approx([-1 / s, 0, 0, 1 / s])
    assert advantages(r, "group_mean", 0.0) == pytest.approx([-1, 0, 0, 1])
    assert advantages(r, "rloo", 0.0) == pytest.approx([-4 / 3, 0, 0, 4 / 3])  # r_i - mean of the other three
    assert advantages(r, "none", 0.0) == r
    assert advantages([0.5] * 4, "group_zscore", 1e-4) == [0.0] * 4  # equal rewards: no signal, no NaN
