"""Dataset rows and environment prompts that are not valid Unicode (lone surrogates from JSON's
"\\ud800" escape, bytes that are not UTF-8) are repaired when loaded, so no run crashes on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from grpolab.env import load_environment
from grpolab.tasks import build_task

SRC = Path(__file__).resolve().parents[1] / "src"
SKYRL = Path(__file__).resolve().parent / "envs" / "skyrl_style.py"
# a lone surrogate in prompt, answer and id (JSON escapes), then a row with bytes that are not UTF-8
ROWS_BYTES = (
    b'{"prompt": "What is 2 + 2? \\ud800", "answer": "4\\udfff", "id": "r\\ud83d"}\n'
    b'{"prompt": "What is 3 + 3? \xff\xfe", "answer": "6", "id": "b\xc3"}\n'
    b'{"prompt": "What is 1 + 1? \\ud83d\\ude00", "answer": "2", "id": "ok"}\n'
)


def _strict(s: str) -> str:
    s.encode("utf-8")  # raises on a lone surrogate
    return s


def test_rows_are_valid_unicode_after_loading(tmp_path):
    for fmt, data in (("jsonl", ROWS_BYTES), ("csv", b"prompt,answer,id\nWhat is 3 + 3? \xff,6,b\xc3\n")):
        path = tmp_path / f"d.{fmt}"
        path.write_bytes(data)
        t = build_task("dataset", 0, {"path": str(path), "eval_size": 0})
        examples = t._train + t.eval_set()
        assert examples
        for e in examples:
            _strict(e.prompt), _strict(e.answer), _strict(e.id)
            json.dumps(e.meta, ensure_ascii=False).encode("utf-8")
        prompts = {e.prompt for e in examples}
        if fmt == "jsonl":
            assert prompts == {"What is 2 + 2? \ufffd", "What is 3 + 3? \ufffd\ufffd", "What is 1 + 1? \U0001f600"}
            assert {e.answer for e in examples} == {"4\ufffd", "6", "2"}
        else:
            assert prompts == {"What is 3 + 3? \ufffd"}


def test_a_skyrl_init_returning_a_lone_surrogate_gives_valid_messages():
    import importlib.util

    spec = importlib.util.spec_from_file_location("skyrl_style_unicode", SKYRL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Surrogate(mod.BaseTextEnv):
        def __init__(self, env_config, extras):
            super().__init__()

        def init(self, prompt):
            return [{"role": "user", "content": "bad \ud800 text"}], {"k": "\udfff"}

        def step(self, action):
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}

    env = load_environment(Surrogate)()
    msgs = env.reset({"prompt": "p"})
    assert msgs == [{"role": "user", "content": "bad \ufffd text"}]


def test_a_run_on_rows_with_invalid_text_trains_and_writes_utf8(tmp_path, tiny_model_dir):
    """`grpolab train` on the rows above: it crashed in the tokenizer or writing samples.jsonl."""
    data = tmp_path / "rows.jsonl"
    data.write_bytes(ROWS_BYTES)
    out = tmp_path / "run"
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
            "steps=1",
            "G=2",
            "batch_size=2",
            "max_new_tokens=4",
            "eval_size=0",
            "progress=false",
            "tensorboard=false",
            "samples_per_step=2",
            f"out={out}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    text = (out / "samples.jsonl").read_bytes().decode("utf-8")  # strict
    recs = [json.loads(line) for line in text.splitlines()]
    assert recs and all(_strict(json.dumps(r, ensure_ascii=False)) for r in recs)
