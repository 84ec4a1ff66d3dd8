"""A prompt longer than the model's context is a usage error naming the row, before the rollout
allocates anything for it (a 1 MB prompt asked the prefill for terabytes at step 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_prompt_past_the_context_is_a_usage_error_naming_the_row(tmp_path, tiny_model_dir):
    data = tmp_path / "rows.jsonl"
    rows = [
        {"prompt": "What is 1 + 1? " + "word " * 3000, "answer": "2", "id": "huge"},
        {"prompt": "What is 2 + 2?", "answer": "4", "id": "small"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab.app.cli",
            "train",
            f"model={tiny_model_dir}",
            "task=dataset",
            f"task_args.path={data}",
            "task_args.eval_size=0",
            "eval_size=0",
            "steps=1",
            "G=2",
            "batch_size=4",
            "max_new_tokens=4",
            "progress=false",
            "tensorboard=false",
            f"out={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "prompt of example 'huge' has" in res.stderr and "context of 2048 tokens" in res.stderr
    assert "Traceback" not in res.stderr
