"""The Python API (grpolab.train / grpolab.evaluate) on the tiny model: config as a dataclass, a dict or
a recipe with the CLI's validation; reward functions passed as Python callables (the registry is left
as it was); rows in memory as a dataset; output printed once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_helpers import read_jsonl

import grpolab
from grpolab.app.cli import main
from grpolab.rewards import REWARDS

SMALL = dict(
    batch_size=8, G=4, max_new_tokens=8, micro_batch=4, eval_size=4, tensorboard=False, save_every=0, samples_per_step=2
)
ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": f"What is {i} + 1?"},
        ],
        "answer": str(i + 1),
        "level": i % 2,
    }
    for i in range(12)
]

MODULE = '''
seen = []

def varied(completions, prompts, answer, level, **kwargs):
    """TRL-style: varies within a group even for a random model."""
    seen.append({"n": len(completions), "chat": isinstance(completions[0], list), "answer": answer[0],
                 "level": level[0], "prompt_is_chat": isinstance(prompts[0], list)})
    return [(sum(map(ord, c[0]["content"])) % 5) / 4 for c in completions]
'''


@pytest.fixture(scope="module")
def api_run(tiny_model_dir, tmp_path_factory):
    """One 2-step run through grpolab.train: an importable TRL function, a closure (registered for the
    call), chat-message rows in memory, progress on (plain lines: not a terminal)."""
    root = tmp_path_factory.mktemp("api")
    (root / "api_user_rewards.py").write_text(MODULE)
    sys.path.insert(0, str(root))
    try:
        import api_user_rewards

        calls = []

        def closure(completion, example):  # grpolab's per-sample form, not importable
            calls.append(completion)
            return 0.5

        before = dict(REWARDS)
        import contextlib
        import io

        buf = io.StringIO()
        from rich.console import Console

        with contextlib.redirect_stdout(buf):
            summary = grpolab.train(
                {"model": str(tiny_model_dir), "seed": 3},
                steps=2,
                out=str(root / "run"),
                rewards=[api_user_rewards.varied, {"name": closure, "weight": 0.5}],
                dataset=ROWS,
                console=Console(file=buf, width=120),
                **SMALL,
            )
        assert dict(REWARDS) == before
        yield {
            "root": root,
            "summary": summary,
            "out": root / "run",
            "module": api_user_rewards,
            "closure_calls": calls,
            "stdout": buf.getvalue(),
        }
    finally:
        sys.path.remove(str(root))


def test_import_grpolab_is_cheap():
    code = (
        "import sys, grpolab; assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
        "grpolab.train; grpolab.evaluate; grpolab.Config; assert 'torch' not in sys.modules; print('ok')"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src})
    assert out.stdout.strip() == "ok", out.stderr
    assert {"train", "evaluate", "Config", "ConfigError"} <= set(dir(grpolab))
    with pytest.raises(AttributeError):
        grpolab.no_such_thing  # noqa: B018


def test_train_returns_the_summary_and_writes_the_run(api_run):
    s, out = api_run["summary"], api_run["out"]
    assert s["steps"] == 2 and s["out"] == str(out)
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0 <= m["reward/varied/mean"] <= 1 and m["reward/closure/mean"] == 0.5
        assert m["reward/errors"] == 0
    assert (out / "checkpoints" / "step-000002" / "model.safetensors").exists()


def test_trl_function_saw_chat_completions_and_columns(api_run):
    seen = api_run["module"].seen
    # 2 steps x 2 groups of G=4, plus the 2 held-out rows (a fifth of 12) before and after, one each
    assert sorted(x["n"] for x in seen) == [1] * 4 + [4] * 4
    assert all(x["chat"] and x["prompt_is_chat"] for x in seen)
    assert {x["answer"] for x in seen} <= {r["answer"] for r in ROWS} and {x["level"] for x in seen} <= {0, 1}
    assert len(api_run["closure_calls"]) == 2 * 8 + 4


def test_config_names_importable_rewards_and_the_written_rows(api_run):
    cfg = yaml.safe_load((api_run["out"] / "config.yaml").read_text())
    assert cfg["rewards"][0] == {"name": "api_user_rewards:varied"}  # resumable by import path
    assert cfg["rewards"][1] == {"name": "closure", "weight": 0.5}  # registered for the call only
    assert cfg["task"] == "dataset" and cfg["task_args"]["path"] == str(api_run["out"] / "dataset.jsonl")
    assert [
        r
        for _, r in grpolab.util.fileio.iter_jsonl(
            (api_run["out"] / "dataset.jsonl").read_text().splitlines(), "x", strict=True
        )
    ] == ROWS


def test_progress_and_summary_printed_once(api_run):
    text = api_run["stdout"]
    assert text.count("step    1 ") == 1 and text.count("step    2 ") == 1
    assert text.count("grpolab run summary") == 1
    assert text.count("evaluating 2 held-out prompts before training") == 1
    assert text.count("evaluating 2 held-out prompts after training") == 1


def test_the_runs_tail_says_what_it_does_before_the_summary(api_run):
    """After the last step a run writes its checkpoint, evaluates the held-out prompts again and draws its
    report (on the default model seconds each, some 19 s together where nothing was printed): each says so
    as it starts, in that order, before the summary."""
    text = api_run["stdout"]
    marks = [
        "step    2 ",
        "saving the checkpoint of step 2, the last...",
        "evaluating 2 held-out prompts after training (greedy)...",
        "report.html (the run's plots)...",
        "grpolab run summary",
    ]
    at = [text.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), (at, text[-3000:])


def test_evaluate_a_run(api_run):
    sys.path.insert(0, str(api_run["root"]))
    try:
        res = grpolab.evaluate(str(api_run["out"]), rewards=[api_run["module"].varied], eval_size=2)
    finally:
        sys.path.remove(str(api_run["root"]))
    assert res["n"] == 2 and res["main_reward"] == "varied" and 0 <= res["accuracy"] <= 1


def test_config_forms_give_the_same_config(tmp_path):
    from grpolab.app.api import build
    from grpolab.training.config import build_config

    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps: 3\ntask: countdown\nalgo: dapo\n")
    want = build_config({"steps": 3, "task": "countdown", "algo": "dapo"}, ["algo.beta=0.01"])
    for config in (
        str(recipe),
        recipe,
        {"steps": 3, "task": "countdown", "algo": "dapo"},
        build_config({"steps": 3, "task": "countdown", "algo": "dapo"}),
    ):
        cfg, rows = build(config, overrides=["algo.beta=0.01"])
        assert cfg == want and rows is None
    cfg, _ = build("dapo", steps=4, task_args={"digits": 2}, algo="rloo")
    assert cfg.steps == 4 and cfg.task_args == {"digits": 2} and cfg.algo.name == "rloo"
    cfg, _ = build(None, dataset="data.jsonl", task_args={"prompt_column": "q"})
    assert cfg.task == "dataset" and cfg.task_args == {"prompt_column": "q", "path": "data.jsonl"}


@pytest.mark.parametrize(
    "kwargs,args",
    [
        ({"G": 3}, ["G=3"]),
        ({"stepz": 3}, ["stepz=3"]),
        ({"algo": {"beta": "high"}}, ["algo.beta=high"]),
        ({"task": "nope"}, ["task=nope"]),
    ],
)
def test_errors_are_the_clis(kwargs, args, capsys, tmp_path):
    with pytest.raises(grpolab.ConfigError) as e:
        grpolab.train(out=str(tmp_path / "x"), **kwargs)
    assert main(["train", f"out={tmp_path / 'x'}", *args]) == 2
    assert capsys.readouterr().err.strip() == f"grpolab: error: {e.value}"
    assert not (tmp_path / "x").exists()


def test_bad_rewards_and_datasets_are_config_errors(tmp_path):
    before = dict(REWARDS)
    with pytest.raises(grpolab.ConfigError, match=r"rewards\[0\]: expected a name, a spec dict or a function"):
        grpolab.train(out=str(tmp_path / "x"), rewards=[3])
    with pytest.raises(grpolab.ConfigError, match="dataset: expected a path, a datasets.Dataset or a non-empty list"):
        grpolab.train(out=str(tmp_path / "x"), dataset=[1, 2])
    with pytest.raises(grpolab.ConfigError, match="dataset: reads data with task=dataset"):
        grpolab.train(out=str(tmp_path / "x"), dataset="d.jsonl", task="qa")
    assert dict(REWARDS) == before


def test_rows_are_not_written_into_an_existing_run(api_run):
    with pytest.raises(grpolab.ConfigError, match="already holds a run"):
        grpolab.train(out=str(api_run["out"]), dataset=[{"prompt": "x", "answer": "1"}])
    assert len((api_run["out"] / "dataset.jsonl").read_text().splitlines()) == len(ROWS)


def test_resume_through_the_api(api_run, tmp_path):
    import shutil

    out = tmp_path / "resumed"
    shutil.copytree(api_run["out"], out)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    cfg["task_args"]["path"] = str(out / "dataset.jsonl")
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    sys.path.insert(0, str(api_run["root"]))
    try:
        from grpolab.app.api import build
        from grpolab.rewards import build_rewards

        c, _ = build(resume=out)
        # the closure was registered only for its call: the name recorded for it is unknown now
        with pytest.raises(grpolab.ConfigError, match="unknown reward 'closure'"):
            build_rewards(c.rewards)
        c, _ = build(resume=out, steps=3)
        assert c.steps == 3 and c.out == str(out) and c.task == "dataset"
        summary = grpolab.train(
            resume=out,
            steps=3,
            progress=False,
            rewards=[api_run["module"].varied, {"name": lambda c, ex: 0.5, "label": "closure", "weight": 0.5}],
        )
        assert summary["steps"] == 3
        assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
        assert read_jsonl(out / "metrics.jsonl")[-1]["reward/closure/mean"] == 0.5
    finally:
        sys.path.remove(str(api_run["root"]))


def readme_section(title: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    body = re.split(rf"^#+ {re.escape(title)}\n", text, maxsplit=1, flags=re.M)[1]
    return body.split("\n### ", 1)[0].split("\n## ", 1)[0]


def test_readme_your_own_reward_runs_as_written(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The README's "Your own reward" example, from an empty directory: my_rewards.py, the Python script,
    the command line (split as the shell does), and loading the checkpoint in plain transformers, in
    this process (each subprocess would import torch again). One substitution: the tiny test model
    instead of the bundled one (the bundled model takes minutes per step on a small CPU; the README
    gives the numbers it printed there)."""
    import re
    import runpy
    import shlex

    section = readme_section("Your own reward")
    py = re.findall(r"```python\n(.*?)```", section, re.S)
    (sh,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    files, script = py[0], py[1]
    assert files.startswith("# my_rewards.py") and script.startswith("# train_mine.py")
    (tmp_path / "my_rewards.py").write_text(files)
    marker = 'out="runs/own-reward",'
    assert script.count(marker) == 1
    (tmp_path / "train_mine.py").write_text(script.replace(marker, f"{marker} model={str(tiny_model_dir)!r},"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    before = dict(REWARDS)
    runpy.run_path("train_mine.py", run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"^reward \d\.\d{3} -> \d\.\d{3}$", out, re.M), out
    assert out.count("grpolab run summary") == 1
    argv = shlex.split(sh.replace("\\\n", " "))
    assert argv[0] == "grpolab"
    assert main(argv[1:] + [f"model={tiny_model_dir}"]) == 0
    assert dict(REWARDS) == before
    for run in ("runs/own-reward", "runs/own-reward-cli"):
        metrics = read_jsonl(tmp_path / run / "metrics.jsonl")
        assert len(metrics) == 2 and all("reward/brevity/mean" in m and "reward/math/mean" in m for m in metrics)
    cfg = yaml.safe_load((tmp_path / "runs/own-reward/config.yaml").read_text())
    assert cfg["rewards"][1] == {"name": "my_rewards:brevity", "weight": 0.2}
    # the checkpoint loads in plain transformers with the README's lines
    checkpoint = next(
        b
        for b in re.findall(r"```python\n(.*?)```", readme_section("What a run leaves"), re.S)
        if "from_pretrained" in b
    )
    ns: dict = {}
    exec(checkpoint, ns)
    assert type(ns["model"]).__name__ == "LlamaForCausalLM" and ns["tokenizer"].eos_token == "<|im_end|>"
