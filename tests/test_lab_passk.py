"""grpolab lab passk: base vs trained pass@k with intervals, its --quick form end to end on the tiny
model (a real one-step run, both models sampled on the same prompts), and the verdict's three cases."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import varied_score

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.app.lab import passk


def test_passk_quick_end_to_end(tiny_model_dir, tmp_path, capsys):
    from grpolab.app import lab

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        rc = main(
            [
                "lab",
                "passk",
                "--quick",
                "--out",
                str(tmp_path),
                f"model={tiny_model_dir}",
                "rewards=[{name: test_varied}]",
            ]
        )
    assert rc == 0
    res = lab.last_result
    printed = capsys.readouterr().out
    assert "pass@4" in printed and "change (paired)" in printed and res["verdict"] in printed
    assert res["n"] == 4 and res["prompts"] == 4 and (tmp_path / "train" / "checkpoints" / "step-000001").is_dir()
    assert json.loads((tmp_path / "passk.json").read_text())["verdict"] == res["verdict"]
    for side in (res["base"], res["trained_eval"]):
        est = [side["pass@k"][k]["estimate"] for k in ("1", "2", "4")]
        assert est == sorted(est)  # pass@k never falls with k
        assert side["per_prompt"]["id"] == res["base"]["per_prompt"]["id"]  # the same prompts, paired
    # the gap is the difference of the two paired changes, prompt by prompt and so on average
    gap, change = res["gain_gap"], res["change"]
    assert gap["change"] == pytest.approx(change["pass@1"]["change"] - change["pass@4"]["change"])
    assert res["verdict"].startswith(("holds here", "does not hold here", "not measured here"))


def _cmp(before, after, lo, hi, beyond):
    return {"before": before, "after": after, "change": after - before, "ci": [lo, hi], "beyond_noise": beyond}


def test_verdict_cases():
    change = {"pass@1": _cmp(0.30, 0.60, 0.2, 0.4, True), "pass@64": _cmp(0.90, 0.85, -0.1, 0.0, False)}
    gap = {"change": 0.35, "ci": [0.2, 0.5]}
    text = passk.verdict(change, gap, 64)
    assert text.startswith("holds here") and "base model is ahead" in text
    assert passk.verdict(change, {"change": -0.2, "ci": [-0.3, -0.1]}, 64).startswith("does not hold here")
    assert passk.verdict(change, {"change": 0.05, "ci": [-0.05, 0.15]}, 64).startswith(
        "not measured here: the two gains are within noise"
    )
    flat = {"pass@1": _cmp(0.3, 0.32, -0.05, 0.09, False), "pass@64": _cmp(0.9, 0.9, 0, 0, False)}
    assert "did not raise pass@1" in passk.verdict(flat, gap, 64)


def test_passk_usage_errors(tmp_path):
    with pytest.raises(SystemExit) as e:
        passk.run([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        passk.run(["--n", "1", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert not (tmp_path / "out").exists()  # nothing written for a usage error
