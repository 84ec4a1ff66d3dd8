"""`grpolab chat` through a pseudo-terminal with a scripted conversation on the tiny model, and
`grpolab sample` on a run's checkpoint."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.app.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
CLI = "import sys; from grpolab.app.cli import main; sys.exit(main(sys.argv[1:]))"


class Terminal:
    """A child process on a pseudo-terminal: type lines, read until a marker appears."""

    def __init__(self, argv: list[str]):
        self.master, slave = pty.openpty()
        env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TERM": "dumb"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.buf = ""

    def read_until(self, marker: str, timeout: float = 120.0) -> str:
        """Everything up to and including the next `marker` (consumed)."""
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} within {timeout}s; got {self.buf!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk and self.proc.poll() is not None:
                    raise AssertionError(f"process exited ({self.proc.returncode}) before {marker!r}: {self.buf!r}")
                self.buf += chunk.decode("utf-8", "replace")
        head, _, self.buf = self.buf.partition(marker)
        return head + marker

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


def reply_of(text: str, typed: str) -> str:
    """The model's streamed reply from what the terminal showed after typing `typed`."""
    text = text.replace("\r\n", "\n")
    assert "model> " in text, text
    reply = text.split("model> ", 1)[1]
    assert reply.endswith("you> ")
    return reply[: -len("you> ")].rstrip("\n")


def greedy_reply(model_dir: Path, messages: list[dict], max_new_tokens: int) -> str:
    import torch

    from grpolab.engine.native.generate import eos_token_ids
    from grpolab.model.load import load_policy, load_tokenizer
    from grpolab.model.template import chat_prompts

    tok = load_tokenizer(model_dir)
    model = load_policy(model_dir, torch.device("cpu")).eval()
    (ids,) = chat_prompts(tok, [messages], None)
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_token_ids(model, tok)),
        pad_token_id=tok.pad_token_id,
    )
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def lively_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model made to say varied things (conftest.liven), saved as a model directory."""
    import torch
    from conftest import liven

    from grpolab.model.load import load_policy, load_tokenizer

    out = tmp_path_factory.mktemp("lively")
    liven(load_policy(tiny_model_dir, torch.device("cpu"))).save_pretrained(out)
    load_tokenizer(tiny_model_dir).save_pretrained(out)
    return out


def test_chat_scripted_conversation(lively_dir):
    tiny_model_dir = lively_dir
    term = Terminal(
        [sys.executable, "-c", CLI, "chat", str(tiny_model_dir), "--temperature", "0", "--max-new-tokens", "6"]
    )
    try:
        banner = term.read_until("you> ")
        assert "grpolab chat:" in banner and "/reset" in banner and "/quit" in banner
        term.type("Hello there")
        first = reply_of(term.read_until("you> "), "Hello there")
        term.type("And now?")
        second = reply_of(term.read_until("you> "), "And now?")
        term.type("/reset")
        assert "(conversation cleared)" in term.read_until("you> ")
        term.type("Hello there")
        again = reply_of(term.read_until("you> "), "Hello there")
        term.type("/nope")
        assert "unknown command '/nope'" in term.read_until("you> ")
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    # the reply streamed to the terminal is the model's greedy answer in its chat template
    want = greedy_reply(tiny_model_dir, [{"role": "user", "content": "Hello there"}], 6)
    assert first.strip() == want.strip() and first.strip()
    assert again == first  # /reset forgot the first exchange
    want2 = greedy_reply(
        tiny_model_dir,
        [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": want},
            {"role": "user", "content": "And now?"},
        ],
        6,
    )
    assert second.strip() == want2.strip()  # the second turn saw the whole conversation


def test_chat_ends_on_eof_and_refuses_a_bad_target(lively_dir, tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello there\n"))  # then end of input (Ctrl-D)
    assert main(["chat", str(lively_dir), "--temperature", "0", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    want = greedy_reply(lively_dir, [{"role": "user", "content": "Hello there"}], 6)
    assert out.startswith("grpolab chat: ") and f"model> {want}\n" in out.replace("you> ", "")
    assert main(["chat", str(tmp_path / "nothing")]) == 2
    assert "is not a local directory or .gguf file" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("steps: 1\n")
    assert main(["chat", str(tmp_path / "run")]) == 2
    assert "the run has no checkpoint yet" in capsys.readouterr().err
    assert main(["chat", str(lively_dir), "--max-new-tokens", "0"]) == 2


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("chat") / "run"
    assert (
        main(
            [
                "train",
                f"model={tiny_model_dir}",
                f"out={out}",
                "steps=1",
                "batch_size=4",
                "G=4",
                "max_new_tokens=4",
                "eval_size=0",
                "progress=false",
                "tensorboard=false",
            ]
        )
        == 0
    )
    return out


def test_sample_prints_k_samples_with_rewards(tiny_run, capsys):
    assert (
        main(
            [
                "sample",
                str(tiny_run),
                "--prompt",
                "What is 2 + 2?",
                "--answer",
                "4",
                "-k",
                "3",
                "--json",
                "max_new_tokens=5",
            ]
        )
        == 0
    )
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["sample"] for r in recs] == [0, 1, 2]
    for r in recs:
        assert set(r["rewards"]) == {"math"} and r["reward"] == r["rewards"]["math"]
        assert 1 <= r["length"] <= 5 and isinstance(r["completion"], str)
    assert main(["sample", str(tiny_run), "-k", "2"]) == 0  # the task's first held-out prompt
    text = capsys.readouterr().out
    assert text.startswith("prompt: ") and "\nanswer: " in text
    assert text.count("--- sample ") == 2 and "reward " in text and "math " in text


def test_sample_errors(tiny_run, capsys):
    assert main(["sample", str(tiny_run), "-k", "0"]) == 2
    assert "-k: must be >= 1" in capsys.readouterr().err
    assert main(["sample", str(tiny_run), "--index", "999"]) == 2
    assert "--index: must be in" in capsys.readouterr().err


def test_chat_env_runs_the_tool_calls_a_turn_writes(capsys):
    """--env: a tool call in the model's turn is run and its result printed and given back; a turn with no
    call ends the exchange; an environment that needs a task's fields is refused with the reason."""
    from grpolab.app.chat import _env_reply, _environment
    from grpolab.util.fields import ConfigError

    env = _environment("calculator_python")
    assert {t["function"]["name"] for t in env.tools} == {"calculator", "python"}
    added = _env_reply(
        env, 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "17 * 3"}}</tool_call>'
    )
    assert added == [{"role": "tool", "name": "calculator", "content": "51"}] or (
        len(added) == 1 and added[0]["role"] == "tool" and added[0]["content"] == "51"
    )
    assert "tool> 51" in capsys.readouterr().out
    assert _env_reply(env, "It is 51.") == []
    assert _env_reply(None, "anything") == []
    with pytest.raises(ConfigError, match="needs an example's fields"):
        _environment("guess_number")


def test_chat_with_env_shows_the_tools_and_talks(lively_dir):
    term = Terminal(
        [
            sys.executable,
            "-c",
            CLI,
            "chat",
            str(lively_dir),
            "--temperature",
            "0",
            "--max-new-tokens",
            "4",
            "--env",
            "calculator_python",
            "--max-turns",
            "2",
        ]
    )
    try:
        term.read_until("you> ")
        term.type("What is 17 * 3?")
        assert "model> " in term.read_until("you> ")
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
