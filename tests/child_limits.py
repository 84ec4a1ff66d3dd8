"""Time limits for tests that start Python processes, derived from the work and the machine's pace.

A fixed limit (say 180 s) holds on the machine it was tuned on and kills a healthy child on a slower or
busier one. Here the pace is measured: the seconds a child takes to start and import torch and
transformers now, on this machine, beside whatever else runs (`startup_seconds`, once per test session).
A test's children on the tiny model do less work than that start-up each (measured on a 2-core
machine: the GPU script's dry run, 7 processes, took 2.3 start-ups each), so a limit of

    limit = processes x PACE_FACTOR x startup_seconds()

leaves them room for their work and for the load to grow during the test, and scales with the machine.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

PACE_FACTOR = 10  # start-ups of time per child: its own start-up, its work, and the load changing meanwhile
FLOOR_S = 60.0  # never less per child: a measurement taken in an idle moment


@functools.cache
def startup_seconds() -> float:
    """Seconds `python -c "import torch, transformers"` takes on this machine now (measured once)."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, transformers; from transformers import AutoModelForCausalLM"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def limit_s(processes: int) -> float:
    """Seconds for a test's `processes` Python children: processes x max(FLOOR_S, PACE_FACTOR x start-up)."""
    return processes * max(FLOOR_S, PACE_FACTOR * startup_seconds())
