"""metrics.jsonl: append-only writing, NaN as null, truncation on resume, weighted means, TensorBoard."""

from __future__ import annotations

import json
import math

import pytest

from grpolab.training.metrics import JsonlWriter, MetricsLogger, read_jsonl, truncate_after_step, weighted_mean


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_jsonl_writer_appends_one_object_per_line_flushed(tmp_path):
    p = tmp_path / "m.jsonl"
    w = JsonlWriter(p)
    w.write({"step": 1, "reward/mean": 0.5, "text": "héllo"})
    # flushed after every record: visible before close (a killed run loses at most one line)
    assert [json.loads(x) for x in _lines(p)] == [{"step": 1, "reward/mean": 0.5, "text": "héllo"}]
    w.write({"step": 2, "reward/mean": 0.75})
    w.close()
    assert [json.loads(x)["step"] for x in _lines(p)] == [1, 2]
    assert "héllo" in p.read_text(encoding="utf-8")  # utf-8, not \\u escapes


def test_nan_and_inf_become_null(tmp_path):
    p = tmp_path / "m.jsonl"
    w = JsonlWriter(p)
    w.write({"step": 1, "entropy": float("nan"), "kl": float("inf"), "x": -float("inf"), "ok": 1.5, "n": 3})
    w.close()
    line = _lines(p)[0]
    assert "NaN" not in line and "Infinity" not in line
    rec = json.loads(line)  # strict JSON parsers accept it
    assert rec == {"step": 1, "entropy": None, "kl": None, "x": None, "ok": 1.5, "n": 3}


def test_nan_inside_nested_values_becomes_null(tmp_path):
    """samples.jsonl carries a dict of rewards per function: a NaN there must not print as `NaN`."""
    p = tmp_path / "s.jsonl"
    w = JsonlWriter(p)
    w.write({"step": 1, "rewards": {"format": 1.0, "math": float("nan")}, "xs": [1.0, float("inf")]})
    w.close()
    line = _lines(p)[0]
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line) == {"step": 1, "rewards": {"format": 1.0, "math": None}, "xs": [1.0, None]}


def test_truncate_after_step_keeps_earlier_steps_and_drops_a_cut_line(tmp_path):
    p = tmp_path / "m.jsonl"
    recs = [{"step": s, "v": s / 10} for s in range(1, 6)]
    # a crash cut the last line in the middle of a record
    p.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 6, "v": 0.', encoding="utf-8")
    truncate_after_step(p, 3)
    assert [json.loads(x)["step"] for x in _lines(p)] == [1, 2, 3]
    assert p.read_text().endswith("\n")
    assert not (tmp_path / "m.jsonl.tmp").exists()  # replaced atomically, nothing left over


def test_truncate_keeps_everything_up_to_the_step_and_drops_cut_lines_anywhere(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2\n{"step": 2}\n', encoding="utf-8")
    truncate_after_step(p, 10)
    assert [json.loads(x) for x in _lines(p)] == [{"step": 1}, {"step": 2}]


def test_resume_does_not_duplicate_steps(tmp_path):
    p = tmp_path / "metrics.jsonl"
    w = JsonlWriter(p)
    for s in range(1, 6):  # the run logged 5 steps, then crashed; the newest checkpoint is at step 3
        w.write({"step": s, "reward/mean": s * 0.1})
    w.close()
    with open(p, "a") as f:
        f.write('{"step": 6, "rew')  # and the crash cut a line
    w = JsonlWriter(p, keep_until_step=3)
    for s in range(4, 8):  # the resumed run redoes 4, 5 and continues
        w.write({"step": s, "reward/mean": s * 0.1})
    w.close()
    steps = [r["step"] for r in read_jsonl(p)]
    assert steps == [1, 2, 3, 4, 5, 6, 7]
    assert len(_lines(p)) == 7  # the cut line is gone too


def test_writer_without_resume_appends_and_handles_missing_file(tmp_path):
    p = tmp_path / "new.jsonl"
    JsonlWriter(p, keep_until_step=0).close()  # resume with nothing on disk: no error
    assert p.exists() and p.read_text() == ""
    w = JsonlWriter(p)
    w.write({"step": 1})
    w.close()
    w = JsonlWriter(p)
    w.write({"step": 2})
    w.close()
    assert [r["step"] for r in read_jsonl(p)] == [1, 2]


def test_keep_until_step_zero_empties_the_file(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n')
    JsonlWriter(p, keep_until_step=0).close()
    assert read_jsonl(p) == []


def test_read_jsonl_skips_cut_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "x"\n\n{"step": 3}\n')
    assert [r["step"] for r in read_jsonl(p)] == [1, 3]


def test_weighted_mean_worked_example():
    # loss: (1.0 * 10 + 4.0 * 30) / (10 + 30) = 130 / 40 = 3.25
    # clip/frac only in the first item: 0.5 * 10 / 10 = 0.5 (weights count only where the key appears)
    got = weighted_mean([({"loss": 1.0, "clip/frac": 0.5}, 10.0), ({"loss": 4.0}, 30.0)])
    assert got == {"loss": pytest.approx(3.25), "clip/frac": pytest.approx(0.5)}


def test_weighted_mean_edge_cases():
    assert weighted_mean([]) == {}
    assert weighted_mean([({"a": 2.0}, 0.0)]) == {}  # zero total weight: no number rather than 0/0
    import torch

    got = weighted_mean([({"a": torch.tensor(1.0)}, 1.0), ({"a": 3}, 3.0)])  # tensors and ints are fine
    assert got == {"a": pytest.approx(2.5)} and isinstance(got["a"], float)


def test_metrics_logger_writes_jsonl_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    log = MetricsLogger(tmp_path, ["tensorboard"])
    log.log({"step": 1, "reward/mean": 0.25, "entropy": float("nan"), "flag": True, "name": "x"})
    log.log({"step": 2, "reward/mean": 0.5})
    log.close()
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and recs[0]["entropy"] is None
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "reward/mean" in tags and "entropy" not in tags and "flag" not in tags
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]


def test_metrics_logger_resume_truncates(tmp_path):
    log = MetricsLogger(tmp_path, [])
    for s in (1, 2, 3):
        log.log({"step": s, "reward/mean": float(s)})
    log.close()
    log = MetricsLogger(tmp_path, [], resume_step=1)
    log.log({"step": 2, "reward/mean": 20.0})
    log.close()
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in recs] == [(1, 1.0), (2, 20.0)]
    assert not any(math.isnan(r["reward/mean"]) for r in recs)
