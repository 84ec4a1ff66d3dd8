"""The README's table of what fits on one GPU, made by `grpolab plan` (one call per model and card).

    .venv/bin/python benchmarks/plan_table.py [--models qwen2.5-0.5b ...] [--extra KEY=VALUE ...]

Each cell is `grpolab plan model=M G=8 batch_size=64 max_new_tokens=1024 --prompt-tokens 256 --memory
CARD --json` (the GRPO defaults otherwise: beta 0.04, so a reference; micro_batch 16; bf16 on a GPU):
"fits" with the peak and the estimated step time when the settings as given fit, else the first
change `grpolab plan` lists that fits, else "no" with the peak of the nearest thing tried.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"]
CARDS = [("24GB", "24 GB (RTX 4090)"), ("32GB", "32 GB (RTX 5090)"), ("80GB", "80 GB (A100 80GB)")]
SETTING = ["G=8", "batch_size=64", "max_new_tokens=1024"]


def plan_json(model: str, memory: str, extra: list[str]) -> dict:
    from grpolab.app.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["plan", f"model={model}", *SETTING, *extra, "--prompt-tokens", "256", "--memory", memory, "--json"])
    assert rc == 0, rc
    return json.loads(buf.getvalue())


def cell(p: dict) -> str:
    gb = 1 << 30
    if p["fits"]:
        return f"fits: {p['peak_bytes'] / gb:.1f} GB, ~{p['step_seconds']:.0f} s/step"
    if p["fitting"]:
        f = p["fitting"][0]
        return f"`{' '.join(f['changes'])}`: {f['peak_bytes'] / gb:.1f} GB, ~{f['step_seconds']:.0f} s/step"
    return f"no (full: {p['peak_bytes'] / gb:.0f} GB)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--extra", nargs="*", default=[])
    a = ap.parse_args()
    print("| model | " + " | ".join(label for _, label in CARDS) + " |")
    print("|---|" + "---|" * len(CARDS))
    for m in a.models:
        print(f"| {m} | " + " | ".join(cell(plan_json(m, mem, a.extra)) for mem, _ in CARDS) + " |")


if __name__ == "__main__":
    main()
