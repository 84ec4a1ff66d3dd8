"""precision=auto (grpolab.model.precision): the per-phase rule, what is measured and what is left untouched."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from grpolab.engine.native import probe
from grpolab.engine.native.probe import decode_seconds
from grpolab.model import precision
from grpolab.model.precision import Precision, choose, faster

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_cache_and_a_bf16_cpu(tmp_path, monkeypatch):
    """Each test remembers answers in its own cache and sees a CPU where bf16 may pay (the facts and the
    pre-check are tested in test_cpu_bf16.py)."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "bf16_can_pay", lambda device: (True, "a bf16 CPU"))


def test_the_rule_keeps_bf16_only_when_it_is_at_least_ten_percent_faster():
    assert faster({"fp32": 1.0, "bf16": 0.9}) is torch.bfloat16  # x0.90: kept
    assert faster({"fp32": 1.0, "bf16": 0.91}) is None  # x0.91: fp32
    assert faster({"fp32": 2.0, "bf16": 3.5}) is None  # slower: fp32


def test_explicit_settings_are_taken_as_given(tiny_model):
    assert (choose("fp32", tiny_model, CPU).rollout, choose("fp32", tiny_model, CPU).update) == (None, None)
    bf = choose("bf16", tiny_model, CPU)
    assert (bf.rollout, bf.update) == (torch.bfloat16, torch.bfloat16)


def test_auto_on_a_small_model_is_fp32_without_measuring(tiny_model, monkeypatch):
    monkeypatch.setattr(precision, "measure", lambda *a, **k: pytest.fail("measured a tiny model"))
    p = choose("auto", tiny_model, CPU)
    assert (p.rollout, p.update) == (None, None) and "not measured" in p.reason


def test_auto_decides_each_phase_from_its_own_measurement(tiny_model, monkeypatch):
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    timings = iter([{"fp32": 1.0, "bf16": 0.6}, {"fp32": 1.0, "bf16": 1.4}])  # rollout, then update
    monkeypatch.setattr(precision, "time_both", lambda fn, reps=2, deadline=None, warmup=None: next(timings))
    p = choose("auto", tiny_model, CPU, rollout_probe=decode_seconds)
    assert (p.rollout, p.update) == (torch.bfloat16, None)
    assert "rollout bf16/fp32 time x0.60" in p.reason and "update bf16/fp32 time x1.40" in p.reason
    assert p.describe() == f"precision: rollout bf16, update fp32 ({p.reason})"


def test_measuring_leaves_the_rng_the_gradients_and_the_mode_as_they_were(tiny_model):
    tiny_model.train()
    rng = torch.get_rng_state()
    p = precision.measure(tiny_model, rollout_probe=decode_seconds)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(q.grad is None for q in tiny_model.parameters())
    assert tiny_model.training
    assert set(p.seconds) == {"rollout", "update"}
    assert all(t > 0 for phase in p.seconds.values() for t in phase.values())


def test_evaluation_measures_the_rollout_only(tiny_model):
    assert set(precision.measure(tiny_model, training=False, rollout_probe=decode_seconds).seconds) == {"rollout"}


def test_a_recorded_choice_wins_on_resume(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "measure", lambda *a, **k: pytest.fail("measured again on resume"))
    f = tmp_path / precision.FILE
    f.write_text(json.dumps(Precision(torch.bfloat16, None, "auto, measured").to_json()))
    p = choose("auto", tiny_model, CPU, recorded=f)
    assert (p.rollout, p.update) == (torch.bfloat16, None)
    assert choose("fp32", tiny_model, CPU, recorded=f).rollout is None  # an explicit setting still wins


def test_gpu_and_torchrun_rules(tiny_model, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert choose("auto", tiny_model, torch.device("cuda")).update is torch.bfloat16
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    assert choose("auto", tiny_model, CPU, distributed=True).update is None


def test_the_rollout_probe_scales_its_steps_to_the_run_and_pays_the_set_up_once(tiny_model, monkeypatch):
    clock = iter([10.0, 11.0, 13.0])  # set-up (layout, prefill) 1 s, PROBE_STEPS decode steps 2 s
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    # t = t_setup + t_steps * tokens / PROBE_STEPS = 1 + 2 * 12 / 6
    assert decode_seconds(tiny_model, None, rows=2, tokens=2 * precision.PROBE_STEPS) == 5.0


def test_the_rollout_probe_takes_the_run_s_shape(tiny_model, monkeypatch):
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    seen = []
    monkeypatch.setattr(precision, "update_seconds", lambda m, dt, **kw: 1.0)
    choose("auto", tiny_model, CPU, rows=256, tokens=48, rollout_probe=lambda m, dt, **kw: seen.append(kw) or 1.0)
    shapes = [(kw["rows"], kw["tokens"]) for kw in seen]
    # a warm-up of each precision on one row (its first-call costs), then the timed calls at the run's shape
    assert shapes[:2] == [(1, precision.PROBE_STEPS)] * 2 and set(shapes[2:]) == {(precision.MAX_PROBE_ROWS, 48)}


def test_an_engine_with_its_own_kernels_sets_the_rollout_and_only_the_update_is_timed(tiny_model, monkeypatch):
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    monkeypatch.setattr(precision, "update_seconds", lambda m, dt, **kw: 0.5 if dt is torch.bfloat16 else 1.0)
    p = choose(
        "auto",
        tiny_model,
        CPU,
        engine_rollout=(torch.bfloat16, "the engine's rule"),
        rollout_probe=lambda *a, **k: pytest.fail("timed grpolab's decoder for vLLM"),
    )
    assert (p.rollout, p.update) == (torch.bfloat16, torch.bfloat16)
    assert set(p.seconds) == {"update"} and p.reason.endswith("; rollout: the engine's rule")
    assert "update bf16/fp32 time x0.50" in p.reason
    ev = choose("auto", tiny_model, CPU, training=False, engine_rollout=(None, "fp32 by rule"))
    assert (ev.rollout, ev.seconds) == (None, {}) and ev.reason == "auto; rollout: fp32 by rule"


def test_a_cpu_without_bf16_gets_fp32_from_the_cpu_and_nothing_is_timed(tiny_model, monkeypatch):
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    monkeypatch.setattr(precision, "bf16_can_pay", lambda device: (False, "this CPU has no bf16 instructions"))
    monkeypatch.setattr(precision, "measure", lambda *a, **k: pytest.fail("timed bf16 on a CPU without it"))
    p = choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, log=lambda s: pytest.fail(s))
    assert (p.rollout, p.update) == (None, None)
    assert p.reason == "auto, decided from the CPU: this CPU has no bf16 instructions"
    vllm = choose("auto", tiny_model, CPU, engine_rollout=(torch.bfloat16, "the engine's rule"))
    assert (vllm.rollout, vllm.update) == (torch.bfloat16, None) and vllm.reason.endswith(
        "; rollout: the engine's rule"
    )


def test_a_measured_answer_is_cached_per_machine_and_shape_and_read_back(tiny_model, monkeypatch, tmp_path):
    monkeypatch.setattr(precision, "SMALL_MODEL_PARAMS", 0)
    timings = itertools.cycle([{"fp32": 1.0, "bf16": 0.5}, {"fp32": 1.0, "bf16": 2.0}])  # rollout, update
    measured, told = [], []
    monkeypatch.setattr(
        precision, "time_both", lambda fn, reps=2, deadline=None, warmup=None: measured.append(1) or next(timings)
    )
    first = choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, rows=8, log=told.append)
    assert (first.rollout, first.update) == (torch.bfloat16, None) and len(measured) == 2
    assert told[0].startswith("precision=auto: timing bf16 against fp32 on the policy, the rollout and the update")
    assert len(told) == 2 and told[1].startswith("precision=auto: rollout bf16/fp32 time x0.50 (")  # then the update
    files = list((tmp_path / "cache" / "precision").glob("*.json"))
    assert len(files) == 1
    again = choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, rows=8, log=told.append)
    assert len(measured) == 2 and len(told) == 2  # read, not measured, nothing announced
    assert (again.rollout, again.update) == (first.rollout, first.update) and again.seconds == first.seconds
    assert again.reason.startswith("auto, cached: measured on this machine") and str(files[0]) in again.reason
    other = choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, rows=4)  # another rollout shape
    assert len(measured) == 4 and other.reason.startswith("auto, measured here")
    files[0].write_text("{not json")  # a damaged entry is measured again and rewritten
    choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, rows=8)
    assert len(measured) == 6 and json.loads(files[0].read_text())["precision"]["rollout"] == "bf16"
    choose("auto", tiny_model, CPU, rollout_probe=decode_seconds, rows=8, cache=False)
    assert len(measured) == 8


def test_the_probe_stops_repeating_at_its_deadline_and_at_a_hopeless_bf16_warm_up():
    calls = []

    def fn(seconds):
        def timed(dt):
            calls.append(precision.NAMES[dt])
            return seconds[precision.NAMES[dt]]

        return timed

    # past the deadline: the warm-ups and one pair, alternating (the first pair always runs)
    assert precision.time_both(fn({"fp32": 2.0, "bf16": 1.0}), reps=5, deadline=0.0) == {"fp32": 2.0, "bf16": 1.0}
    assert calls == ["fp32", "bf16", "fp32", "bf16"]
    calls.clear()
    # no deadline: the warm-ups and `reps` pairs
    precision.time_both(fn({"fp32": 2.0, "bf16": 1.0}), reps=3)
    assert calls == ["fp32", "bf16"] * 4
    calls.clear()
    # a warm-up of its own (smaller: it only pays the first call's costs), then the timed pairs
    warmed = []
    best = precision.time_both(fn({"fp32": 2.0, "bf16": 1.0}), reps=2, warmup=lambda dt: warmed.append(dt) or 0.1)
    assert warmed == [None, torch.bfloat16] and calls == ["fp32", "bf16"] * 2 and best == {"fp32": 2.0, "bf16": 1.0}
    calls.clear()
    # a bf16 warm-up over SLOW_WARMUP x fp32's: bf16 cannot pay, and the warm-ups are the answer
    slow = {"fp32": 1.0, "bf16": precision.SLOW_WARMUP * 1.0 + 0.1}
    assert precision.time_both(fn(slow), reps=3) == slow and calls == ["fp32", "bf16"]
    assert precision.faster(slow) is None
