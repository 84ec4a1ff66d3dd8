"""Reward functions through the real command line on the tiny model: TRL's contract reaches them during
training (trainer_state, log_metric, log_extra, signal.alarm in the training thread), a tool's list result
reaches TRL's grpo_agent.py `query_reward` as a list, a function failing on every completion is named each
step and stops the run (exit 1, a checkpoint that verifies), and one asking for a keyword nothing provides is
refused before step 1 (exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import read_jsonl
from env_helpers import scripted_model

from grpolab.app.cli import main
from grpolab.training.checkpoint import verify_checkpoint

COMMON = [
    "batch_size=4",
    "G=2",
    "micro_batch=4",
    "eval_size=0",
    "progress=false",
    "report=false",
    "tensorboard=false",
    "lr=1e-3",
    "algo.beta=0.0",
    "max_new_tokens=4",
    "samples_per_step=4",
]

REWARDS = '''
import signal

def progress(completions, trainer_state, log_metric, log_extra, completion_ids, **kwargs):
    """Logs the step it is scored at and each completion's token count; bounds itself with signal.alarm."""
    signal.signal(signal.SIGALRM, lambda *a: None)
    signal.alarm(5)
    try:
        log_metric("my/global_step", trainer_state.global_step)
        log_metric("my/max_steps", trainer_state.max_steps)
        log_extra("n_ids", [len(ids) for ids in completion_ids])
        return [float(len(ids) % 3) for ids in completion_ids]
    finally:
        signal.alarm(0)

def broken(completions, **kwargs):
    return [kwargs["solution"] for _ in completions]   # the data has no `solution`: KeyError each time

def wants_solution(completions, solution, **kwargs):
    return [1.0 for _ in completions]
'''


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(REWARDS)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {k}+1?", "answer": str(k + 1)}) + "\n" for k in range(6)))
    return rewards, data


def test_contract_in_training_and_a_failing_function_stops_the_run(tiny_model_dir, tmp_path, files, capsys):
    rewards, data = files
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            *COMMON,
            "steps=6",
            "save_every=0",
            "max_reward_error_steps=2",
            "task=dataset",
            f"task_args.path={data}",
            f"rewards=[{{name: '{rewards}:progress'}}, {{name: '{rewards}:broken'}}]",
        ]
    )
    text = capsys.readouterr()
    said = " ".join((text.out + text.err).split())  # the console wraps long lines
    assert rc == 1, said
    assert (
        "step 1: reward 'broken' failed on every completion (1 step(s) in a row); first error: reward 'broken' "
        "raised KeyError: 'solution'" in said
    )
    assert "step 2: reward 'broken' failed on every completion for 2 steps in a row (max_reward_error_steps=2)" in said
    assert f"grpolab train --resume {out}" in said
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["reward/broken/error_frac"] for m in metrics] == [1.0, 1.0]
    assert [m["reward/progress/error_frac"] for m in metrics] == [0.0, 0.0] and all(
        m["reward/errors"] == 4 for m in metrics
    )
    assert [m["my/global_step"] for m in metrics] == [0.0, 1.0]  # TRL's: optimizer steps done when scored
    assert [m["my/max_steps"] for m in metrics] == [6.0, 6.0]
    samples = read_jsonl(out / "samples.jsonl")
    assert samples and all(s["extra"]["n_ids"] == s["length"] for s in samples)  # single-turn: ids = the model's tokens
    ckpt = out / "checkpoints" / "step-000002"
    assert ckpt.exists() and verify_checkpoint(ckpt) is None


def test_a_keyword_nothing_provides_is_refused_before_step_1(tiny_model_dir, tmp_path, files, capsys):
    rewards, data = files
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            *COMMON,
            "steps=2",
            "task=dataset",
            f"task_args.path={data}",
            f"rewards=[{{name: '{rewards}:wants_solution'}}]",
        ]
    )
    said = " ".join("".join(capsys.readouterr()).split())
    assert rc == 2, said
    assert "reward 'wants_solution' requires 'solution'" in said and "Available keywords: answer," in said
    assert not out.exists()


QUERY_CALL = (
    '<tool_call>{"name": "query_db", "arguments": {"sql_command": "SELECT * FROM t WHERE gene = 1"}}</tool_call>'
)

TOOLS = '''
def query_db(sql_command: str) -> list[tuple]:
    """
    Run a read-only SQL command.

    Args:
        sql_command: The SQL command to execute.

    Returns:
        A list of tuples containing the query results.
    """
    return [(1, "BRCA1")] if "where" in sql_command.lower() else []


def query_reward(completions, answer, **kwargs):
    """TRL's examples/scripts/grpo_agent.py query_reward, as written there."""
    rewards = []
    for completion, ans in zip(completions, answer, strict=False):
        reward = 0.0
        sql_queries = []
        tool_results = []
        for turn in completion:
            if turn.get("tool_calls"):
                for call in turn["tool_calls"]:
                    sql = call["function"]["arguments"].get("sql_command", "").lower()
                    sql_queries.append(sql)
            if turn.get("role") == "tool" and turn.get("content"):
                tool_results.append(turn["content"])
        if len(sql_queries) > 3:
            reward -= 1.5
        where_count = 0
        for q in sql_queries:
            if "limit 1" in q:
                reward -= 1.0
            if " where " not in q:
                reward -= 0.5
            else:
                where_count += 1
        reward += min(where_count, 3) * 0.4
        combined_results = []
        error_detected = False
        for res in tool_results:
            if isinstance(res, dict) and "error" in res:
                error_detected = True
            elif isinstance(res, list):
                combined_results.extend(res)
        if error_detected:
            reward -= 2.0
        elif len(sql_queries) == 0:
            reward -= 1.5
        else:
            has_hits = len(combined_results) > 0
            correct_answer = ans.lower()
            if (has_hits and correct_answer == "yes") or (not has_hits and correct_answer == "no"):
                reward += 2.0
            else:
                reward -= 1.5
        rewards.append(reward)
    return rewards
'''


def test_a_tools_list_result_reaches_query_reward_as_a_list(tiny_model_dir, tmp_path, capsys):
    """Every trajectory makes two WHERE queries that hit (the scripted model only writes the call):
    query_reward = 2 * 0.4 + 2.0 = 2.8, as in TRL, where the list reaches it as a list (JSON text would
    give 0.8 - 1.5 = -0.7). The model reads the JSON text; the reward and samples.jsonl the list."""
    model = scripted_model(tiny_model_dir, tmp_path / "model", turns=(QUERY_CALL,))
    tools = tmp_path / "agent.py"
    tools.write_text(TOOLS)
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"Does gene {k} interact?"}], "answer": "yes"}) + "\n"
            for k in range(4)
        )
    )
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={model}",
            f"out={out}",
            *COMMON,
            "steps=1",
            "task=dataset",
            f"task_args.path={data}",
            f"env.name={tools}:query_db",
            "env.max_turns=2",
            "env.max_turn_tokens=2",
            "env.max_model_tokens=4",
            f"rewards=[{{name: '{tools}:query_reward'}}]",
        ]
    )
    assert rc == 0, "".join(capsys.readouterr())
    (m,) = read_jsonl(out / "metrics.jsonl")
    assert m["reward/query_reward/mean"] == pytest.approx(2.8) and m["reward/errors"] == 0
    tool_msgs = [t for s in read_jsonl(out / "samples.jsonl") for t in s["conversation"] if t["role"] == "tool"]
    assert tool_msgs and all(t["content"] == [[1, "BRCA1"]] for t in tool_msgs)
