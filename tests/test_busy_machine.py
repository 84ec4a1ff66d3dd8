"""benchmarks/busy_machine.py's bookkeeping: the runs' work is compared step by step (a difference names
the run and the step), variants parse with CORES replaced, and the load starts once the run has written
the step it waits for."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from e2e_helpers import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


bm = benchmark_script("busy_machine")


def _run(variant, busy, work):
    return {"variant": variant, "busy": busy, "work": work}


def test_same_work_is_every_run_equal_at_every_step():
    w = [[1633.0, 48.0], [1721.0, 16.0]]
    assert bm.work_differences([_run("before", 0, w), _run("default", 2, [list(x) for x in w])]) == []
    other = [[1633.0, 48.0], [1700.0, 16.0]]
    assert bm.work_differences([_run("before", 0, w), _run("default", 2, other)]) == ["default busy=2: step 2"]
    assert bm.work_differences([_run("before", 0, w), _run("default", 0, w[:1])]) == ["default busy=0: step count"]
    assert bm.work_of({"tokens/generated": 5.0, "update/seqs_computed": 8.0, "loss": 1.0}) == [5.0, 8.0]


def test_variants_parse_with_cores():
    v = bm.parse_variants("before:thread_wait=openmp,threads=CORES default:")
    assert v == {"before": ["thread_wait=openmp", f"threads={os.cpu_count() or 1}"], "default": []}


def test_the_load_starts_once_the_step_is_written(tmp_path, monkeypatch):
    """A stand-in run writes two metric rows 0.5 s apart; with from_step=1 the busy processes start only
    after the first row, and are gone when the run ends."""
    started_at = []

    class FakeLoad:
        def __init__(self, n, own_groups=True):
            started_at.append(bm.steps_written(tmp_path))

        def __enter__(self):
            return []

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(bm, "busy_processes", FakeLoad)
    row = json.dumps({"time/step_s": 1.0})
    code = (
        f"import time, pathlib; p = pathlib.Path({str(tmp_path / 'metrics.jsonl')!r}); time.sleep(0.3); "
        f"p.write_text({row!r} + '\\n'); time.sleep(0.5); p.write_text({row!r} + '\\n' + {row!r} + '\\n')"
    )
    res, cpu_s = bm.run_train([sys.executable, "-c", code], dict(os.environ), tmp_path, busy=2, from_step=1)
    assert res.returncode == 0 and 0 < cpu_s < 5  # the stand-in sleeps: little CPU of its own
    assert started_at == [1]
    assert bm.steps_written(tmp_path) == 2
