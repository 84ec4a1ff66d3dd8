"""benchmarks/gpu.sh --dry-run: the whole GPU check on the CPU with 2-layer models, in seconds, so that
the script that only runs on a GPU machine cannot rot unseen. `--no-trl` keeps the bench part to
grpolab alone where TRL happens to be installed (it is not in the test install); TRL is then reported
as skipped, with the reason, as where it is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_limits import limit_s

ROOT = Path(__file__).resolve().parents[1]
PARTS = ["env", "matmul", "cuda_tests", "models", "train", "memory", "bench", "decode", "update"]
DRY_PROCESSES = 7  # gpu_check.py, pytest (cuda_tests), grpolab train, memory_plan.py, grpolab bench and its 2 workers


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-dry")
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    budget = limit_s(DRY_PROCESSES)  # the dry run's own bound: its parts share it (tests/child_limits.py)
    p = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run", "--no-trl", "--out", str(out)]
        + ["--budget-s", f"{budget:.0f}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget + 120,  # past its budget the script kills its part and writes its results
    )
    return p, out


def test_the_dry_run_exits_0_and_writes_the_json_and_the_log(dry):
    p, out = dry
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["dry_run"] is True
    assert list(res["parts"]) == PARTS
    for name, part in res["parts"].items():
        assert part["status"] in ("ok", "skipped"), (name, part)
        assert part["status"] == "ok" or part.get("reason"), (name, part)
    assert "=== summary" in p.stdout and res["summary"] and all(line in p.stdout for line in res["summary"])
    assert (out / "gpu_check.log").read_text().count("--- ") == len(PARTS)
    assert not any(
        p.is_dir() for p in out.iterdir()
    )  # model dirs never land in OUT (only small result files belong there)


def test_each_part_reports_its_numbers(dry):
    parts = json.loads((dry[1] / "gpu_check.json").read_text())["parts"]
    assert parts["env"]["cuda_available"] is False and parts["env"]["grpolab_bench"] in (True, False)
    assert parts["matmul"]["flops_per_s"] > 0
    tests = parts["cuda_tests"]
    assert "tests/test_cuda.py" in tests["files"] and tests["counts"].get("skipped", 0) >= 4  # no GPU here
    models = parts["models"]["models"]
    assert models["qwen"]["vocab_size"] > models["qwen"]["tokenizer_size"] == 49152  # like the real Qwen shape
    assert isinstance(parts["models"]["ids_above_the_tokenizer_decode_to"], str)
    train = parts["train"]
    assert train["steps_logged"] == 2 and train["s_per_step"] > 0 and train["rollout_tok_s"] > 0
    assert "device=cpu" in train["command"] and train["checkpoints"] == ["step-000002"]
    bench = parts["bench"]
    if bench["status"] == "ok":
        assert "--against none" in bench["command"] and bench["trl"]["status"] == "skipped" and bench["trl"]["reason"]
        assert bench["sides"]["grpolab"]["s_per_step"] > 0 and bench["sides"]["grpolab"]["update_mfu"] > 0
    else:
        assert "grpolab bench" in bench["reason"]
    memory = parts["memory"]  # benchmarks/memory_plan.py on the CPU: the plan against the allocator's peak
    row = memory["rows"][0]
    assert memory["measured"] == 1 and row["status"] == "ok" and row["device"] == "cpu"
    assert row["measured_peak"] > 0 and row["predicted_peak"] > 0 and row["measured"]["update"] > 0
    update = parts["update"]
    assert update["trained_tokens"] == 2 * 2 * 4 and update["mfu"] > 0
    decode = parts["decode"]["paths"]
    assert decode["grpolab"]["tok_s"] > 0 and decode["hf_static_eager"]["tok_s"] > 0
    assert decode["hf_static_compiled"]["status"] == "skipped" and "CUDA" in decode["hf_static_compiled"]["reason"]
