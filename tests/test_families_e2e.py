"""A TRL script with `tools=[fn]` on a Qwen3-templated model runs under grpolab with only the import changed, and
under TRL 1.16: the tiny model (tests/conftest.py) carries Qwen3's released template (read from the installed
TRL) and is scripted to write, at each turn, a tool call or the answer (tests/env_helpers.py). TRL replaces the
template with its training version, grpolab with its own (grpolab.model.families, said on the run's line);
both render the prompt with the same token ids, and every trajectory both sides sampled has the same tokens
and the same mask of the model's own tokens (the tool reply and the headers around it masked out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
from env_helpers import scripted_model

ROOT = Path(__file__).resolve().parents[1]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

SCRIPT = """
import json, sys
from datasets import Dataset
IMPORT


def add(a: int, b: int) -> int:
    \"\"\"
    Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum.
    \"\"\"
    return a + b


def used_tool(completions, **kwargs):
    return [float(any(m.get("role") == "tool" for m in c)) for c in completions]


rows = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}]} for _ in range(8)]
args = GRPOConfig(
    output_dir=sys.argv[2], max_steps=1, per_device_train_batch_size=8, num_generations=4,
    max_completion_length=64, max_tool_calling_iterations=2, shuffle_dataset=False, use_cpu=True, bf16=False,
    report_to="none", save_strategy="no", logging_steps=1, seed=0,
)
trainer = GRPOTrainer(
    model=sys.argv[1], reward_funcs=used_tool, args=args, train_dataset=Dataset.from_list(rows), tools=[add]
)
CAPTURE
trainer.train()
"""

TRL_CAPTURE = """
seen = {"prompts": [], "trajectories": []}
inner = trainer._generate_and_score_completions
def captured(*a, **k):
    out = inner(*a, **k)
    tool = out.get("tool_mask", out["completion_mask"])
    for i in range(len(out["prompt_ids"])):
        seen["prompts"].append([t for t, m in zip(out["prompt_ids"][i].tolist(), out["prompt_mask"][i].tolist()) if m])
        kept = [(t, int(u)) for t, m, u in zip(out["completion_ids"][i].tolist(), out["completion_mask"][i].tolist(),
                                               tool[i].tolist()) if m]
        seen["trajectories"].append({"ids": [t for t, _ in kept], "model": [u for _, u in kept]})
    json.dump(seen, open(sys.argv[3], "w"))
    return out
trainer._generate_and_score_completions = captured
"""

GRPOLAB_CAPTURE = """
import grpolab.env.rollout as rollout
seen = {"prompts": []}
render = rollout.render
def captured(tok, messages, **kw):
    text = render(tok, messages, **kw)
    seen["prompts"].append(tok(text, add_special_tokens=False)["input_ids"])
    json.dump(seen, open(sys.argv[3], "w"))
    return text
rollout.render = captured
"""


def run_side(line: str, capture: str, model: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    code = SCRIPT.replace("IMPORT", line).replace("CAPTURE", capture)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"), "WANDB_MODE": "disabled"}
    seen = out.with_suffix(".json")
    done = subprocess.run(
        [sys.executable, "-c", code, str(model), str(out), str(seen)],
        capture_output=True,
        text=True,
        env=env,
        cwd=out.parent,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(seen.read_text())


def test_a_trl_tools_script_on_a_qwen3_template_runs_under_both_with_the_same_tokens(tiny_model_dir, tmp_path):
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    qwen3 = (files("trl") / "chat_templates" / "qwen3.jinja").read_text()
    model = scripted_model(tiny_model_dir, tmp_path / "model", (CALL, "5"), chat_template=qwen3)
    tok = AutoTokenizer.from_pretrained(model)
    _, trl = run_side("from trl import GRPOConfig, GRPOTrainer", TRL_CAPTURE, model, tmp_path / "trl")
    done, ours = run_side("from grpolab import GRPOConfig, GRPOTrainer", GRPOLAB_CAPTURE, model, tmp_path / "grpolab")
    assert "the model's is Qwen3's, which is not append-only" in done.stdout  # said on the run's line

    assert {tuple(p) for p in trl["prompts"]} == {tuple(p) for p in ours["prompts"]}  # one prompt, the same ids
    samples = [json.loads(r) for r in (tmp_path / "grpolab" / "samples.jsonl").read_text().splitlines()]
    mine = {
        tuple(s["tokens"]["text"]): tuple(int(a is not None) for a in s["tokens"]["adv"])
        for s in samples
        if s["tokens"]["shown"] == s["tokens"]["n"]
    }
    theirs = {
        tuple(tok.decode([x], skip_special_tokens=False) for x in t["ids"]): tuple(t["model"])
        for t in trl["trajectories"]
    }
    both = set(mine) & set(theirs)
    called = sorted((k for k in both if k[0] == CALL), key=len)
    assert called and ("5",) in both, (sorted(mine), sorted(theirs))
    for key in both:
        assert mine[key] == theirs[key]  # the model's tokens and the environment's, masked alike
    reply = called[0][1:-1]  # a call, its reply, the answer "5"
    assert (
        "".join(reply) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert mine[called[0]] == (1,) + (0,) * len(reply) + (1,)
