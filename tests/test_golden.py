"""Golden runs: the metrics of a fixed-seed 3-step run of every preset on the tiny model.

tests/golden/presets.json was recorded by this file (GRPOLAB_WRITE_GOLDEN=1) on 2026-12-01, on the
2-core development machine, *before* the training step was rewritten as a pipeline of stages (issue
"One readable training step"). The rewrite must leave every recorded number as it was: the test
compares each recorded metric of each step, and the sum and sum of squares of the final policy weights.

Where the rewrite legitimately changed a number, the change is named in EXPECTED_CHANGES with its
reason; nothing else may move. Floats are compared with a relative tolerance of 1e-6 (and an absolute
one of 1e-9 near zero): float order may change where a pass was removed, never the maths.
Numbers are only comparable on the machine (CPU kind, PyTorch build) that recorded them: on another
machine the fixed seed still gives one run, but not necessarily bit for bit this one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from grpolab import rewards as rewards_mod
from grpolab.cli import main

from e2e_helpers import read_jsonl, varied_score, weights

GOLDEN = Path(__file__).parent / "golden" / "presets.json"
RUNS = {
    "grpo": [], "dr_grpo": [], "dapo": [], "gspo": [], "cispo": [], "rloo": [], "reinforce": [], "ppo": [],
    "grpo_adaptive_kl": ["algo=grpo", "algo.adaptive_kl=true", "algo.kl_target=0.001"],
    "grpo_mu2": ["algo=grpo", "algo.mu=2", "lr=1e-3"],
    "rloo_kl_in_reward": ["algo=rloo", "algo.beta=0.05"],
}
ARGS = ["steps=3", "batch_size=8", "G=4", "max_new_tokens=8", "micro_batch=4", "eval_size=0", "progress=false",
        "samples_per_step=0", "tensorboard=false", "save_every=0", "rewards=[{name: test_varied}]", "lr=1e-4"]
SKIP_PREFIXES = ("time/", "memory/")  # wall clock and process-wide numbers
EXPECTED_CHANGES: dict[tuple[str, str], str] = {}
"""(run, metric) -> why the rewrite changed it. Empty: nothing changed."""


@pytest.fixture(scope="module", autouse=True)
def test_rewards():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        yield


def run_preset(name: str, extra: list[str], model_dir: Path, root: Path) -> dict:
    out = root / name
    algo = [] if any(a.startswith("algo=") for a in extra) else [f"algo={name}"]
    assert main(["train", f"model={model_dir}", f"out={out}", *algo, *ARGS, *extra]) == 0
    metrics = [{k: v for k, v in m.items() if not k.startswith(SKIP_PREFIXES)}
               for m in read_jsonl(out / "metrics.jsonl")]
    w = weights(out / "checkpoints" / "step-000003")
    return {"metrics": metrics,
            "weights_sum": float(sum(t.double().sum() for t in w.values())),
            "weights_sq": float(sum((t.double() ** 2).sum() for t in w.values()))}


def close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


@pytest.mark.parametrize("name", sorted(RUNS))
def test_preset_matches_golden(name, tiny_model_dir, tmp_path):
    got = run_preset(name, RUNS[name], tiny_model_dir, tmp_path)
    if os.environ.get("GRPOLAB_WRITE_GOLDEN") == "1":
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[name] = got
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True))
        return
    want = json.loads(GOLDEN.read_text())[name]
    assert len(got["metrics"]) == len(want["metrics"]) == 3
    diffs = []
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"]), start=1):
        for key, value in w.items():
            if (name, key) in EXPECTED_CHANGES:
                continue
            if key not in g:
                diffs.append(f"step {step} {key}: missing (was {value})")
            elif not close(g[key], value):
                diffs.append(f"step {step} {key}: {g[key]!r} != golden {value!r}")
    for key in ("weights_sum", "weights_sq"):
        if not close(got[key], want[key]):
            diffs.append(f"{key}: {got[key]!r} != golden {want[key]!r}")
    assert not diffs, f"{name} moved from the recorded run:\n" + "\n".join(diffs)
