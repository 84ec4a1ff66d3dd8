"""Environments written for other trainers run unchanged: TRL's environment_factory classes
and reward functions (tests/envs/trl_counter.py), TRL's tools= functions with rewards written as in its
examples/scripts/grpo_agent.py (tests/envs/trl_tools.py), OpenEnv-style (tests/envs/openenv_style.py) and
SkyRL-gym-style (tests/envs/skyrl_style.py) environments, each trained 2 steps on the tiny model
through the CLI and through grpolab.train with TRL's spellings, on TRL's conversational rows
({"prompt": [{"role": "user", ...}]}) and on plain strings.

The model is the tiny one scripted to write, at each turn, one of three turns (tests/env_helpers.py):
two tool calls in one turn (a sync tool that limits itself with signal.alarm, given an int for its float
argument, then an async tool), a call of an OpenEnv action, or the word "done". So tools really run,
trajectories differ, and each group's rewards vary.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl
from env_helpers import scripted_model

import grpolab
from grpolab.app.cli import main

ENVS = Path(__file__).resolve().parent / "envs"
TRL, TOOLS, OPENENV, SKYRL, CHECKS = (
    ENVS / f"{n}.py" for n in ("trl_counter", "trl_tools", "openenv_style", "skyrl_style", "checks")
)
COMMON = {
    "steps": 2,
    "batch_size": 4,
    "G": 2,
    "micro_batch": 4,
    "eval_size": 1,
    "progress": False,
    "report": False,
    "tensorboard": False,
    "lr": 1e-3,
    "algo.beta": 0.0,
}
ENV = {"max_turns": 2, "max_turn_tokens": 2, "max_model_tokens": 4}


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    return scripted_model(tiny_model_dir, tmp_path_factory.mktemp("scripted") / "model")


def module(path: Path):
    """A file imported as a notebook's code would be: a module no import path reaches again."""
    spec = importlib.util.spec_from_file_location(f"authored_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prompt(form: str, text: str):
    return [{"role": "user", "content": text}] if form == "messages" else text


# --------------------------------------------------------------------------- the cases
# each: env (CLI: env.* spec strings; API: the same names looked up in the file's module), rows(form) or
# None (no dataset: TRL's train_dataset=None), the reward functions (file, name), and checks on each step


def counter_rows(form, text="Count up."):
    return [{"prompt": prompt(form, text), "level": k} for k in range(10)]


def check_tools(m, steps):
    assert m["env/calls/increment"] > 0 and m["env/calls/peek"] > 0  # tool calls ran, several in a turn
    assert m.get("env/errors_exception", 0) == 0  # signal.alarm inside the tool: it ran on the main thread
    assert m["reward/level_seen/mean"] == 1.0  # reward functions got the instances, the columns and the prompts
    assert 0.0 <= m["reward/reward_func/mean"] <= 1.0 and m["reward/env/mean"] >= 0.0


def check_written_prompt(m, steps):
    assert m["reward/level_seen/mean"] == 1.0  # the prompt holds what reset wrote (a random task), for every trajectory


def check_tools_only(m, steps):
    assert m["env/calls/increment"] > 0 and m.get("env/errors_exception", 0) == 0  # signal.alarm on the main thread
    assert m["reward/structure_reward/mean"] > 0 and m["reward/argument_reward/mean"] > 0  # parsed tool_calls read
    assert "reward/env/mean" not in m  # plain tools give no reward of their own (TRL adds no column either)


CASES = {
    "trl_tools_only": dict(
        env={"tools": (TOOLS, "TOOLS"), "tool_thread": "main"},
        rows=lambda form: [{**r, "answer": "done"} for r in counter_rows(form)],
        rewards=[(TOOLS, "structure_reward"), (TOOLS, "argument_reward"), (TOOLS, "correctness_reward")],
        check=check_tools_only,
    ),
    "trl_tools": dict(
        env={"name": (TRL, "CounterEnv"), "tool_thread": "main"},
        rows=counter_rows,
        rewards=[(TRL, "reward_func"), (TRL, "level_seen")],
        check=check_tools,
    ),
    "trl_empty_prompt": dict(
        env={"name": (TRL, "CounterEnv"), "tool_thread": "main"},
        rows=lambda form: counter_rows(form, ""),
        rewards=[(TRL, "level_seen")],
        check=check_written_prompt,
    ),
    "trl_routed": dict(
        env={"factories": {"counter": (TRL, "CounterEnv"), "parity": (TRL, "ParityEnv")}, "tool_thread": "main"},
        rows=lambda form: [
            {"prompt": prompt(form, "Go."), "environment": ("counter", "parity")[k % 2], "level": k} for k in range(10)
        ],
        rewards=[(TRL, "routed_right"), (TRL, "level_seen")],
        check=lambda m, s: m["reward/routed_right/mean"] == m["reward/level_seen/mean"] == 1.0 or pytest.fail(str(m)),
    ),
    "openenv_text": dict(
        env={"name": (OPENENV, "WordGuessEnvironment")},
        rows=lambda form: counter_rows(form, "Play."),
        rewards=[(OPENENV, "steps_taken"), (CHECKS, "varied")],
        check=lambda m, s: (
            (1.0 <= m["reward/steps_taken/mean"] <= 2.0 and 0.0 <= m["reward/env/mean"] <= 2.0) or pytest.fail(str(m))
        ),
    ),
    "openenv_tool": dict(
        env={"name": (OPENENV, "GridEnvironment")},
        rows=lambda form: counter_rows(form, "Walk."),
        rewards=[(OPENENV, "steps_taken"), (CHECKS, "varied")],
        check=lambda m, s: (m["env/calls/MoveAction"] > 0 and m["reward/steps_taken/mean"] > 0) or pytest.fail(str(m)),
    ),
    "skyrl": dict(
        env={"name": (SKYRL, "OneWordEnv"), "options": {"max_turns": 2}},
        rows=lambda form: [
            {
                "prompt": prompt(form, "Say a word."),
                "env_class": "one_word",
                "reward_spec": {"method": "rule", "ground_truth": "done"},
                "extra_info": {"index": k},
            }
            for k in range(10)
        ],  # no answer column
        rewards=[(SKYRL, "turns_used"), (CHECKS, "system_first")],
        check=lambda m, s: (
            (1.0 <= m["reward/turns_used/mean"] <= 2.0 and m["reward/system_first/mean"] == 1.0) or pytest.fail(str(m))
        ),
    ),
}


def cli_args(case: dict, rows, tmp_path: Path) -> list[str]:
    args = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in COMMON.items()]
    args += [f"env.{k}={v}" for k, v in ENV.items()]
    for key, value in case["env"].items():
        if key in ("name", "tools"):  # a list of tool functions is an environment too
            args.append(f"env.name={value[0]}:{value[1]}")
        elif key == "factories":
            args += [f"env.factories.{k}={f}:{n}" for k, (f, n) in value.items()]
        elif key == "options":
            args += [f"env.options.{k}={v}" for k, v in value.items()]
        else:
            args.append(f"env.{key}={value}")
    args.append("rewards=[" + ", ".join(f"{{name: '{f}:{n}'}}" for f, n in case["rewards"]) + "]")
    if rows is None:
        return [*args, "task=env"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [*args, "task=dataset", f"task_args.path={path}", "task_args.eval_size=2"]


def api_kwargs(case: dict, rows) -> dict:
    mods = {p: module(p) for p in (TRL, TOOLS, OPENENV, SKYRL, CHECKS)}
    env = dict(ENV)
    kw: dict = {}
    for key, value in case["env"].items():
        if key == "name":
            kw["environment_factory"] = getattr(mods[value[0]], value[1])
        elif key == "tools":  # TRL's tools=[...] without an environment class
            kw["tools"] = getattr(mods[value[0]], value[1])
        elif key == "factories":
            kw["environment_factory"] = {k: getattr(mods[f], n) for k, (f, n) in value.items()}
        else:
            env[key] = value
    kw["reward_funcs"] = [getattr(mods[f], n) for f, n in case["rewards"]]
    if rows is not None:
        import datasets

        kw["train_dataset"] = datasets.Dataset.from_list(rows)
        kw["task_args"] = {"eval_size": 2}
    settings = {k: v for k, v in COMMON.items() if k not in ("steps", "algo.beta")}
    return {**settings, "max_steps": COMMON["steps"], "algo": {"beta": 0.0}, "env": env, **kw}


def run_case(name: str, form: str | None, entry: str, model: Path, tmp_path: Path) -> Path:
    case = CASES[name] if name in CASES else NO_DATA[name]
    rows = case["rows"](form) if case["rows"] else None
    out = tmp_path / "run"
    if entry == "cli":
        assert main(["train", f"model={model}", f"out={out}", *cli_args(case, rows, tmp_path)]) == 0
    else:
        grpolab.train(model=str(model), out=str(out), **api_kwargs(case, rows))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["update/skipped"] == 1.0 or (math.isfinite(m["loss/policy"]) and m["grad_norm"] > 0), m
        assert 1.0 <= m["env/turns_mean"] <= 2.0 and m["reward/errors"] == 0, m
        case["check"](m, metrics)
    assert any(m["update/seqs_computed"] > 0 for m in metrics), metrics  # the rewards varied: the policy moved
    assert (out / "checkpoints" / "step-000002").exists()
    return out


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("form", ["messages", "text"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_environment_written_for_another_trainer_trains_unchanged(name, form, entry, model, tmp_path):
    out = run_case(name, form, entry, model, tmp_path)
    if name == "trl_tools":  # the conversations reward functions read carry TRL's parsed tool_calls
        convs = [s["conversation"] for s in read_jsonl(out / "samples.jsonl")]
        calls = [m["tool_calls"] for c in convs for m in c if m["role"] == "assistant" and "tool_calls" in m]
        assert [
            {"type": "function", "function": {"name": "increment", "arguments": {"step": 1}}},
            {"type": "function", "function": {"name": "peek", "arguments": {}}},
        ] in calls
        tool_msgs = [m for c in convs for m in c if m["role"] == "tool"]
        assert {
            "role": "tool",
            "name": "peek",
            "content": "1.0",
        } in tool_msgs  # the async tool saw the sync one's effect


NO_DATA = {
    # TRL's routing rows carry no prompt column; TRL's train_dataset=None (task=env) has no rows at all
    "no_prompt_column": dict(
        env={"name": (TRL, "CounterEnv"), "tool_thread": "main"},
        rows=lambda form: [{"level": k} for k in range(10)],
        rewards=[(TRL, "level_seen")],
        check=check_written_prompt,
    ),
    "no_dataset": dict(
        env={"name": (TRL, "CounterEnv"), "tool_thread": "main"},
        rows=None,
        rewards=[(TRL, "level_seen"), (TRL, "reward_func")],
        check=check_written_prompt,
    ),
}


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("name", sorted(NO_DATA))
def test_the_environment_writes_the_prompt_without_a_prompt_column_or_a_dataset(name, entry, model, tmp_path):
    run_case(name, None, entry, model, tmp_path)


def test_a_tool_using_signal_alarm_fails_on_worker_threads_and_says_so(model, tmp_path):
    """The default env.tool_thread=worker runs every call on a daemon thread (with a timeout): signal.alarm
    raises there, and each such call is an error message to the model, counted; the async tool is unaffected."""
    case = {**CASES["trl_tools"], "env": {"name": (TRL, "CounterEnv")}}
    out = tmp_path / "run"
    assert main(["train", f"model={model}", f"out={out}", *cli_args(case, counter_rows("messages"), tmp_path)]) == 0
    for m in read_jsonl(out / "metrics.jsonl"):
        assert m["env/errors_exception"] == m["env/calls/increment"] > 0
    tool_msgs = [
        m for s in read_jsonl(out / "samples.jsonl") for m in s["conversation"] if m.get("name") == "increment"
    ]
    assert "signal only works in main thread" in tool_msgs[0]["content"]


@pytest.mark.parametrize(
    "setting,rows,message",
    [
        (
            ["env.name=calculator_python", "task=env"],
            None,
            "rewards: no reward source: the task has no default reward and the environment gives none",
        ),
        (
            ["env.name=calculator_python", f"rewards=[{{name: '{CHECKS}:varied'}}]"],
            [{"prompt": ""}] * 5,
            "empty prompt, and the environment's reset() returned no text for it",
        ),
        (
            [f"env.factories.counter={TRL}:CounterEnv", f"rewards=[{{name: '{CHECKS}:varied'}}]"],
            [{"prompt": "Go."}] * 5,
            "has `environment=None`, which is not among the environments of env.factories (counter)",
        ),
        (
            [f"env.name={CHECKS}:OwnGeneratorEnv", "task=env", f"rewards=[{{name: '{CHECKS}:varied'}}]"],
            None,
            "wrote different prompts for its 2 trajectories",
        ),
    ],
)
def test_what_an_environment_run_cannot_do_is_a_usage_error(setting, rows, message, model, tmp_path, capsys):
    """Exit 2 with the reason, nothing trained: no reward at all (TRL: "No reward source provided"), an
    empty prompt that reset does not fill, a routed row without its `environment` column, an environment
    whose random tasks differ within a group (a generator of its own, which grpolab cannot seed)."""
    args = [
        f"model={model}",
        f"out={tmp_path / 'run'}",
        "steps=1",
        "batch_size=4",
        "G=2",
        "eval_size=0",
        "progress=false",
        "report=false",
        *setting,
    ]
    if rows is not None:
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        args += ["task=dataset", f"task_args.path={tmp_path / 'rows.jsonl'}", "task_args.eval_size=1"]
    assert main(["train", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
