"""OpenEnv's own MCP environments (openenv-core, the test extra): their real tools are listed and called
(echo_env's shape), one with no tool is refused with the reason, and instances are pooled and reset for
each trajectory like TRL's, so an environment that walks through its own questions on reset() serves the
next one each step (in training too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl
from env_helpers import scripted_model

pytest.importorskip("openenv.core.env_server.mcp_environment", reason="openenv-core (the test extra)")

from grpolab.app.cli import main  # noqa: E402
from grpolab.env import load_environment  # noqa: E402
from grpolab.env.base import EnvironmentShapeError  # noqa: E402

MCP = Path(__file__).resolve().parent / "envs" / "openenv_mcp.py"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_an_mcp_environment_offers_its_real_tools_and_calls_them():
    factory = load_environment(f"{MCP}:EchoEnvironment")
    assert factory.kind == "openenv"
    env = factory()
    names = [t["function"]["name"] for t in env.tools]
    assert names == ["echo_message", "echo_with_length", "split_words"]  # not one parameterless `Action`
    assert env.tools[0]["function"]["description"] == "Echo back the provided message."
    assert env.tools[0]["function"]["parameters"]["required"] == ["message"]
    assert json.loads(env.reset({"id": "a"}))["echoed_message"] == "Echo environment ready!"
    reply = env.step(
        call("echo_message", message="hi there")
        + call("echo_with_length", message="hi there")
        + call("split_words", message="hi there")
        + call("nope")
        + call("echo_message", text="x")
    )
    contents = [m["content"] for m in reply.messages]
    assert contents[0] == "hi there" and json.loads(contents[1]) == {"message": "hi there", "length": 8}
    assert json.loads(contents[2]) == ["hi", "there"] and reply.values == {2: ["hi", "there"]}  # the list, for rewards
    assert "unknown tool 'nope'" in contents[3] and "bad arguments for tool 'echo_message'" in contents[4]
    assert reply.calls == {"echo_message": 2, "echo_with_length": 1, "split_words": 1}
    assert reply.events == {"unknown_tool": 1, "bad_arguments": 1} and not reply.done
    assert env.user_env.state.step_count == 3  # three CallToolActions since reset (the listing came before it)
    assert env.step("no call").done


def test_an_mcp_environment_without_tools_is_refused_with_the_reason():
    with pytest.raises(EnvironmentShapeError, match="NoToolsEnvironment is an MCP environment but listed no tools"):
        load_environment(f"{MCP}:NoToolsEnvironment")


def test_openenv_instances_are_pooled_and_reset_advances():
    """Two trajectories at once need two instances; afterwards both are reused (reset), never remade, and the
    tool listing is not repeated for a reused instance."""
    factory = load_environment(f"{MCP}:QuizEnvironment")
    first = [factory(), factory()]
    insts = {id(e.user_env) for e in first}
    questions = [e.reset({"id": str(k)}) for k, e in enumerate(first)]
    for e in first:
        e.close()
    second = [factory(), factory()]
    assert {id(e.user_env) for e in second} == insts  # the same two objects
    assert questions == ["What is 1+1?", "What is 1+1?"]  # the observation's only string field
    assert [e.reset({"id": "x"}) for e in second] == ["What is 2+2?", "What is 2+2?"]  # each advanced
    reply = second[0].step(call("submit", answer=["2", "4", "6"][second[0].user_env.index % 3]))
    assert reply.done and second[0].reward() == 1.0 and reply.messages[0]["content"] == "correct"


QUIZ_TURN = call("submit", answer="4")


def test_a_dataset_advancing_environment_serves_its_next_question_each_step(tiny_model_dir, tmp_path, capsys):
    """In training, the pooled instances advance on every reset: step k's trajectories are served question k
    (TRL's pool behaves the same); `questions_seen` reads the instances' index."""
    model = scripted_model(tiny_model_dir, tmp_path / "model", turns=(QUIZ_TURN,))
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={model}",
            f"out={out}",
            "steps=3",
            "batch_size=2",
            "G=2",
            "micro_batch=2",
            "eval_size=0",
            "progress=false",
            "report=false",
            "tensorboard=false",
            "algo.beta=0.0",
            "task=env",
            f"env.name={MCP}:QuizEnvironment",
            "env.max_turns=1",
            "env.max_turn_tokens=2",
            "env.max_model_tokens=2",
            f"rewards=[{{name: '{MCP}:questions_seen'}}]",
            "samples_per_step=2",
        ]
    )
    assert rc == 0, "".join(capsys.readouterr())
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["reward/questions_seen/mean"] for m in metrics] == [0.0, 1.0, 2.0]
    assert [m["reward/env/mean"] for m in metrics] == [0.0, 1.0, 0.0]  # "4" answers question 2 (2+2) only
