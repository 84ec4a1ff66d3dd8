"""Environments for tests/test_env_unicode.py and tests/test_env_budget.py, loaded by `env.name=<this file>:<Name>`:
the real calculator_python environment (or a TRL-style class) whose first step receives an attacker's turn
instead of the model's (a random tiny model never writes these calls); later turns are the model's own."""

import json
import shutil
from pathlib import Path
from typing import ClassVar

from grpolab.env import close_environment, load_environment


def chatty_copy(tiny_model_dir: Path, out: Path) -> Path:
    """A copy of the tiny model whose generation config counts every even token id as an end of turn (as in
    test_agents_e2e.py): its turns end, so the environment's reply is tokenised and the trajectory goes on."""
    shutil.copytree(tiny_model_dir, out)
    cfg = json.loads((out / "generation_config.json").read_text())
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    cfg["eos_token_id"] = sorted({cfg["eos_token_id"], *range(0, vocab, 2)})
    (out / "generation_config.json").write_text(json.dumps(cfg))
    return out


PYTHON_RAISES = '<tool_call>{"name": "python", "arguments": {"code": "raise ValueError(\'\\\\ud800\')"}}</tool_call>'
SURROGATE_NAME = '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>'
ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "say \\ud800 back"}}</tool_call>'


class EchoTools:
    """A TRL environment class whose tool echoes its argument."""

    def reset(self, **kwargs):
        return None

    def echo(self, text: str) -> str:
        """Echo a text.

        Args:
            text: What to echo.
        """
        return text


class Scripted:
    """A real environment whose first step gets the attacker's turn instead of the model's."""

    tools: ClassVar[list] = []
    inner_name = "calculator_python"
    turn = ""

    def __init__(self):
        self.inner = load_environment(self.inner_name, timeout_s=5.0, max_result_chars=2000)()
        self.tools = self.inner.tools
        self.steps = 0

    def reset(self, fields):
        self.steps = 0
        return self.inner.reset(fields)

    def step(self, turn_text):
        self.steps += 1
        return self.inner.step(self.turn if self.steps == 1 else turn_text)

    def reward(self):
        return None

    def close(self):
        close_environment(self.inner)


class PythonRaises(Scripted):
    turn = PYTHON_RAISES


class SurrogateName(Scripted):
    turn = SURROGATE_NAME


class Echo(Scripted):
    inner_name = __file__ + ":EchoTools"
    turn = ECHO


SLEEPY = "".join(
    '<tool_call>{"name": "python", "arguments": {"code": "import time\\ntime.sleep(10)"}}</tool_call>'
    for _ in range(16)
)


class SleepyPython(Scripted):
    """The liveness case of the tool budgets: one turn of 16 python calls that each sleep 10 s."""

    turn = SLEEPY
