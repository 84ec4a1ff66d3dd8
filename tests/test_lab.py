"""grpolab lab: each claim measured through the CLI, and the numbers it returns checked.

memory is not run (it trains the real model twice): only its argument parsing and command are checked.
"""

import json
import subprocess

import pytest

import grpolab.app.lab as lab
from grpolab.app.cli import main


def run_lab(*argv: str) -> dict:
    assert main(["lab", *argv]) == 0
    return dict(lab.last_result)


def test_listing_and_unknown_claim(capsys):
    assert main(["lab"]) == 0
    out = capsys.readouterr().out
    for name in lab.LABS:
        assert name in out
    assert main(["lab", "nope"]) == 2
    assert "known: baseline" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["lab", "g1", "--help"])
    assert e.value.code == 0


def test_baseline_changes_variance_not_expectation(capsys):
    res = run_lab("baseline")
    assert res["none"]["bias_se"] < 5 and res["rloo"]["bias_se"] < 5  # unbiased
    assert res["rloo"]["var_ratio"] < 1  # and the baseline lowers the variance
    for m in ("batch_mean", "group_mean"):  # mean includes the sample: shrinks by 1 - 1/G = 0.75
        assert res[m]["bias_se"] > 5 and abs(res[m]["scale"] - 0.75) < 0.05
        assert res[m]["cosine"] > 0.99
    assert {"none", "rloo"} <= set(res["unbiased"])
    out = capsys.readouterr().out
    assert "group_zscore" in out and out.strip().splitlines()[-1].startswith("holds")


def test_g1_gives_no_signal():
    res = run_lab("g1", "--batches", "500")
    assert res["G"][1] == {"zero_frac": 1.0, "grad_norm": 0.0}
    for G in (2, 4, 8, 16):
        assert res["G"][G]["grad_norm"] > 0.1
    assert res["G"][16]["zero_frac"] < res["G"][2]["zero_frac"]
    assert res["verdict"].startswith("holds")


def test_scale_invariance_of_group_zscore():
    res = run_lab("scale", "--ab", "2:0,0.5:3,100:100")
    for d in res["pairs"].values():
        assert d["group_zscore"] < 1e-2  # identical up to the eps guard
        assert d["none"] > 0.5  # REINFORCE is not
    assert res["pairs"]["2:0"]["group_mean"] > 0.1  # the mean removes b, not a
    assert res["verdict"].startswith("holds")


def _write_run(path, rewards, lengths):
    path.mkdir()
    with open(path / "metrics.jsonl", "w") as f:
        for i, (r, n) in enumerate(zip(rewards, lengths)):
            f.write(json.dumps({"step": i, "reward/mean": r, "completion/length_mean": n}) + "\n")
        f.write("{truncated\n")  # a torn last line is skipped by read_jsonl


def test_curves_sign_of_the_correlation(tmp_path):
    steps = range(20)
    _write_run(tmp_path / "down", [0.1 + 0.04 * i for i in steps], [30 - i for i in steps])
    res = run_lab("curves", str(tmp_path / "down"))
    assert res["corr"] < -0.99 and res["end"]["reward"] > res["start"]["reward"]
    assert res["verdict"].startswith("does not hold here") and "length falls" in res["verdict"]
    _write_run(tmp_path / "up", [0.1 + 0.04 * i for i in steps], [10 + 2 * i + (i % 3) for i in steps])
    res = run_lab("curves", str(tmp_path / "up"))
    assert res["corr"] > 0.9 and res["verdict"].startswith("holds")


def test_curves_usage_errors(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["lab", "curves", str(tmp_path)])  # no metrics.jsonl
    assert e.value.code == 2


def test_memory_builds_two_train_commands(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_run(cmd, check, stdout):
        calls.append(cmd)
        out = next(a for a in cmd if a.startswith("out="))[4:]
        algo = next(a for a in cmd if a.startswith("algo="))[5:]
        big = 2 if algo == "ppo" else 1
        from pathlib import Path

        Path(out).mkdir(parents=True)
        Path(out, "metrics.jsonl").write_text(
            json.dumps({"params/trained": 100 * big, "memory/peak_mb": 1000 * big, "time/step_s": 1.0 * big}) + "\n"
        )
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    res = run_lab("memory", "--steps", "3", "--model", "tiny-model")
    assert [c[3:5] for c in calls] == [["train", "algo=grpo"], ["train", "algo=ppo"]]
    for c in calls:
        assert "steps=3" in c and "model=tiny-model" in c and c[1:3] == ["-m", "grpolab.app.cli"]
    assert res["ratio"]["peak_mb"] == pytest.approx(0.5)
    assert res["verdict"].startswith("holds")
    with pytest.raises(SystemExit):
        main(["lab", "memory", "--steps", "0"])
