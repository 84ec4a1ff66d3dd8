"""grpolab report: the per-token values `grpolab train` saves, the page it writes at the end of a run,
`grpolab report` on one run, on two (overlaid) and on bad input, and the page in a real browser
(headless Chromium driven over the DevTools protocol on a pipe: plots visible, no console error, no
network request).

Runs are shared through module fixtures (tiny random model, a few seconds each on 2 cores).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from e2e_helpers import read_jsonl

from grpolab.algo.kl import kl_per_token
from grpolab.algo.presets import AlgoConfig
from grpolab.app.cli import main
from grpolab.batch import Batch, Rollout
from grpolab.training.token_credit import token_credit

SMALL = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=8",
    "micro_batch=4",
    "progress=false",
    "tensorboard=false",
    "save_every=0",
    "rewards=[{name: test_varied}, {name: format, weight: 0.5}]",
]


pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry


def train(model: Path, out: Path, *args: str) -> Path:
    assert main(["train", f"model={model}", f"out={out}", *SMALL, *args]) == 0
    return out


@pytest.fixture(scope="module")
def run_a(tiny_model_dir, tmp_path_factory) -> Path:
    """GRPO with its reference (beta 0.04), two epochs per rollout (ratios move), 6 tokens saved of 8."""
    return train(
        tiny_model_dir,
        tmp_path_factory.mktemp("report") / "grpo",
        "steps=3",
        "eval_size=4",
        "algo.mu=2",
        "lr=1e-3",
        "sample_tokens=6",
    )


@pytest.fixture(scope="module")
def run_b(tiny_model_dir, tmp_path_factory) -> Path:
    """Dr. GRPO without a report and without per-token values."""
    return train(
        tiny_model_dir,
        tmp_path_factory.mktemp("report") / "drgrpo",
        "steps=2",
        "eval_size=0",
        "algo=dr_grpo",
        "report=false",
        "sample_tokens=0",
    )


# -- the per-token values -------------------------------------------------------------------------


def toy_batch(adv: list[float], ref: bool) -> Batch:
    """Two groups of G = 2, 3 tokens each (row 1 has 2). Row 0: ratios 1.5, 1.1, 0.5; row 1: 0.5, 1.1.
    Group 1 has zero advantage: the update skipped it, its old/last log-probs and entropy are 0."""
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, 0.0], [0.0] * 3, [0.0] * 3])
    ratio = torch.tensor([[1.5, 1.1, 0.5], [0.5, 1.1, 1.0], [1.0] * 3, [1.0] * 3])
    rollout = Rollout(
        prompt_ids=torch.ones(4, 2, dtype=torch.long),
        prompt_mask=torch.ones(4, 2, dtype=torch.long),
        completion_ids=torch.arange(12).view(4, 3),
        completion_mask=mask,
        sample_logp=-mask,
        truncated=torch.tensor([False, False, True, True]),
        texts=list("abcd"),
        G=2,
    )
    batch = Batch(
        [SimpleNamespace(id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(2)],
        rollout,
        torch.tensor([1.0, 0.0, 0.5, 0.5]),
        {"math": [1.0, 0.0, 0.5, 0.5]},
    )
    batch.reward, batch.adv = batch.raw_reward.clone(), torch.tensor(adv)
    batch.old_logp, batch.last_logp = old, old + ratio.log()
    batch.entropy = torch.tensor([[0.3, 0.2, 0.1], [0.4, 0.5, 0.0], [0.0] * 3, [0.0] * 3])
    batch.ref_logp = torch.full((4, 3), -1.5) if ref else None
    return batch


TOK = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: f"<{ids[0]}>")


def algo(**kw) -> AlgoConfig:
    return dataclasses.replace(AlgoConfig(), **kw)


def test_token_values_of_a_computed_row_and_of_a_skipped_one():
    batch = toy_batch([1.0, -1.0, 0.0, 0.0], ref=False)
    recs = token_credit(batch, [0, 1, 2], TOK, algo(), max_tokens=10, computes_every_group=False)
    a, b, skipped = recs
    assert a["computed"] and a["n"] == 3 and a["shown"] == 3 and a["text"] == ["<0>", "<1>", "<2>"]
    assert a["adv"] == [1.0] * 3 and a["logp"] == [-1.0, -2.0, -0.5] and a["entropy"] == [0.3, 0.2, 0.1]
    assert a["ratio"] == pytest.approx([1.5, 1.1, 0.5], abs=1e-4)
    assert a["clip"] == [1, 0, 0]  # A > 0: only a ratio above 1 + eps_high is clipped
    assert b["clip"] == [-1, 0] and b["n"] == 2 and b["kl"] is None  # A < 0: only below 1 - eps_low; no ref
    assert skipped == {
        "n": 3,
        "shown": 3,
        "computed": False,
        "text": ["<6>", "<7>", "<8>"],
        "adv": [0.0] * 3,
        "logp": None,
        "ratio": None,
        "entropy": None,
        "kl": None,
        "clip": None,
    }


def test_token_values_are_bounded_and_carry_the_kl_to_the_reference():
    batch = toy_batch([1.0, -1.0, 0.0, 0.0], ref=True)  # KL in the loss: every group is computed
    recs = token_credit(batch, [0, 2], TOK, algo(kl_estimator="k3"), max_tokens=2, computes_every_group=False)
    assert [r["shown"] for r in recs] == [2, 2] and all(len(r["text"]) == 2 == len(r["adv"]) for r in recs)
    assert recs[1]["computed"]  # zero advantage, but the KL term needs the pass
    want = kl_per_token(batch.old_logp[:1, :2], batch.ref_logp[:1, :2], batch.rollout.completion_mask[:1, :2], "k3")
    assert recs[0]["kl"] == pytest.approx(want[0].tolist(), abs=1e-4)
    d = -1.5 - (-1.0)  # k3 = exp(ref - logp) - (ref - logp) - 1, by hand
    assert recs[0]["kl"][0] == pytest.approx(math.exp(d) - d - 1, abs=1e-4)


@pytest.mark.parametrize(
    "objective,row0,row1", [("pg", [0, 0, 0], [0, 0]), ("cispo", [1, 0, -1], [-1, 0]), ("gspo", [0, 0, 0], [-1, -1])]
)
def test_the_clip_decision_follows_the_objective(objective, row0, row1):
    batch = toy_batch([1.0, -1.0, 0.0, 0.0], ref=False)
    recs = token_credit(batch, [0, 1], TOK, algo(objective=objective), max_tokens=10, computes_every_group=False)
    assert [recs[0]["clip"], recs[1]["clip"]] == [row0, row1]
    if objective == "gspo":  # one sequence ratio for every token: exp(mean log ratio); row 1: 0.74 < 0.8
        s = math.exp((math.log(1.5) + math.log(1.1) + math.log(0.5)) / 3)
        assert recs[0]["ratio"] == pytest.approx([s] * 3, abs=1e-4)


def test_dual_clip_is_marked():
    batch = toy_batch([-1.0, -1.0, 0.0, 0.0], ref=False)
    batch.last_logp[0, 0] = batch.old_logp[0, 0] + math.log(4.0)  # ratio 4 > c = 3 with A < 0
    assert token_credit(batch, [0], TOK, algo(dual_clip=3.0), max_tokens=10, computes_every_group=False)[0]["clip"] == [
        2,
        0,
        -1,
    ]


def test_a_component_that_needs_every_group_marks_every_row_computed():
    """The rows come from the step's own rule (grpolab.training.update.computed_groups): a critic computes
    every group, also those whose advantages are all 0."""
    batch = toy_batch([1.0, -1.0, 0.0, 0.0], ref=False)
    recs = token_credit(batch, [0, 2], TOK, algo(), max_tokens=10, computes_every_group=True)
    assert [r["computed"] for r in recs] == [True, True] and recs[1]["clip"] == [0, 0, 0]


def test_a_newly_registered_objective_brings_its_own_clip_decision(monkeypatch):
    """register_objective: the credit view shows the new objective's decisions, token_credit unchanged."""
    from grpolab.algo import losses

    for name in ("OBJECTIVES", "CLIP_DECISIONS", "SEQUENCE_RATIO"):  # registered for this test only
        monkeypatch.setattr(losses, name, type(getattr(losses, name))(getattr(losses, name)))

    def clip_far(ratio, adv, algo):  # a made-up rule: clipped high wherever the ratio moved more than 0.3
        return ((ratio - 1).abs() > 0.3).long()

    losses.register_objective("far", losses.obj_pg, clip_far)
    batch = toy_batch([1.0, -1.0, 0.0, 0.0], ref=False)  # ratios row 0: 1.5, 1.1, 0.5; row 1: 0.5, 1.1
    recs = token_credit(batch, [0, 1], TOK, algo(objective="far"), max_tokens=10, computes_every_group=False)
    assert [recs[0]["clip"], recs[1]["clip"]] == [[1, 0, 1], [1, 0]]
    losses.register_objective("far_seq", losses.obj_pg, clip_far, sequence_ratio=True)  # one ratio per sequence
    rec = token_credit(batch, [0], TOK, algo(objective="far_seq"), max_tokens=10, computes_every_group=False)[0]
    s = math.exp((math.log(1.5) + math.log(1.1) + math.log(0.5)) / 3)  # 0.94: within 0.3 of 1
    assert rec["ratio"] == pytest.approx([s] * 3, abs=1e-4) and rec["clip"] == [0, 0, 0]


# -- multi-turn: the environment's tokens in the stream, the conversation ---------------------------

# One group of G = 2 trajectories. Row 0 calls a tool and answers: model 4, environment 3 (the tool
# result with its template headers), model 2. Row 1 answers, gets "try again" and answers again: model
# 2, environment 1, model 2. The environment's positions hold exact zeros, as the passes leave them.
VOCAB = [
    "<tool_call>",
    "add(7,5)",
    "</tool_call>",
    "<|im_end|>",
    "\n<|im_start|>tool\n",
    "12",
    "<|im_end|>\n<|im_start|>assistant\n",
    "13",
    "\n<|im_start|>user\nNot right. Try again.<|im_end|>\n",
    "<pad>",
]
STREAM = [[0, 1, 2, 3, 4, 5, 6, 5, 3], [7, 3, 8, 5, 3, 9, 9, 9, 9]]
ENV = [[0, 0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0, 0]]
MODEL = [[1, 1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 1, 1, 0, 0, 0, 0]]
CONVERSATIONS = [
    [
        {"role": "assistant", "content": "<tool_call>add(7,5)</tool_call>"},
        {"role": "tool", "name": "add", "content": "12"},
        {"role": "assistant", "content": "12"},
    ],
    [
        {"role": "assistant", "content": "13"},
        {"role": "user", "content": "Not right. Try again."},
        {"role": "assistant", "content": "12"},
    ],
]
VTOK = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: VOCAB[ids[0]])


def multi_turn_batch(ref: bool = True) -> Batch:
    model, env = torch.tensor(MODEL, dtype=torch.float), torch.tensor(ENV, dtype=torch.float)
    log_ratio = torch.tensor([[0.4, 0.1, -0.2, 0.0, 0, 0, 0, 0.3, 0.1], [-0.3, 0.1, 0, 0.2, 0.0, 0, 0, 0, 0]]) * model
    old = -torch.linspace(0.5, 2.0, 9).repeat(2, 1) * model  # (2, 9): 0 at the environment's tokens
    rollout = Rollout(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.tensor(STREAM),
        completion_mask=model,
        sample_logp=old,
        truncated=torch.tensor([False, False]),
        texts=["12", "12"],
        G=2,
        env_mask=env,
        conversations=[list(c) for c in CONVERSATIONS],
    )
    batch = Batch(
        [SimpleNamespace(id="p0", prompt="What is 7 + 5?", answer="12")],
        rollout,
        torch.tensor([1.0, 0.75]),
        {"env": [1.0, 0.75]},
    )
    batch.reward, batch.adv = batch.raw_reward.clone(), torch.tensor([0.7071, -0.7071])
    batch.old_logp, batch.last_logp = old, old + log_ratio
    batch.entropy = torch.full((2, 9), 0.25) * model
    batch.ref_logp = (old - 0.1) * model if ref else None
    return batch


def test_the_credit_stream_of_a_multi_turn_row_holds_the_environment_tokens_in_place():
    """n and the shown tokens are the whole stream (model + environment), not the model's count; the
    environment's tokens are marked (`env`) and carry no value at all."""
    batch = multi_turn_batch()
    a, b = token_credit(batch, [0, 1], VTOK, algo(), max_tokens=64, computes_every_group=False)
    assert a["n"] == 9 and a["shown"] == 9 and a["n_env"] == 3 and b["n"] == 5 and b["n_env"] == 1
    assert a["text"] == [VOCAB[x] for x in STREAM[0]] and b["text"][2].startswith("\n<|im_start|>user")
    assert a["env"] == [bool(e) for e in ENV[0]] and b["env"] == [False, False, True, False, False]
    for rec in (a, b):
        for key in ("adv", "logp", "ratio", "entropy", "kl", "clip"):
            got = rec[key]
            assert len(got) == rec["shown"], key
            assert all((v is None) == e for v, e in zip(got, rec["env"])), (key, got)  # null exactly there
    assert a["adv"] == [0.7071] * 4 + [None] * 3 + [0.7071] * 2
    assert a["ratio"][:4] == pytest.approx([math.exp(x) for x in (0.4, 0.1, -0.2, 0.0)], abs=1e-4)
    assert a["ratio"][7:] == pytest.approx([math.exp(0.3), math.exp(0.1)], abs=1e-4)  # after the tool result
    assert a["clip"][0] == 1 and b["clip"][0] == -1  # 1.49 > 1.2 with A > 0; 0.74 < 0.8 with A < 0
    want = kl_per_token(batch.old_logp[:1], batch.ref_logp[:1], batch.rollout.completion_mask[:1], "k3")[0]
    model_kl = want[torch.tensor(MODEL[0]) > 0].tolist()
    assert [k for k in a["kl"] if k is not None] == pytest.approx(model_kl, abs=1e-4)
    cut = token_credit(batch, [0], VTOK, algo(), max_tokens=5, computes_every_group=False)[0]
    assert cut["n"] == 9 and cut["shown"] == 5 and cut["env"] == [False] * 4 + [True]


def test_a_sequence_ratio_over_turns_averages_the_model_tokens_only():
    """GSPO's s_i = exp(mean of the model's log ratios): the environment's zeros do not dilute it."""
    batch = multi_turn_batch(ref=False)
    rec = token_credit(batch, [0], VTOK, algo(objective="gspo"), max_tokens=64, computes_every_group=False)[0]
    s = math.exp((0.4 + 0.1 - 0.2 + 0.0 + 0.3 + 0.1) / 6)
    assert [r for r in rec["ratio"] if r is not None] == pytest.approx([s] * 6, abs=1e-4)


FAKE_RUN = SimpleNamespace(
    cfg=SimpleNamespace(sample_tokens=64, algo=algo()),
    tokenizer=VTOK,
    advantage=SimpleNamespace(computes_every_group=False),
    pass_spec=SimpleNamespace(router=None),  # a dense model: no MoE router term
)


def test_multi_turn_sample_records_carry_the_conversation_and_the_stop():
    from grpolab.training.trainer import sample_records

    batch = multi_turn_batch()
    recs = sample_records(batch, 1, 2, run=FAKE_RUN)
    assert [r["conversation"] for r in recs] == CONVERSATIONS and all("stop" not in r for r in recs)
    assert [r["length"] for r in recs] == [6, 4]  # the model's tokens
    assert recs[0]["tokens"]["env"] == [bool(e) for e in ENV[0]]
    json.dumps(recs, allow_nan=False)  # what samples.jsonl gets
    batch.rollout.stops = ["answer", "max_turns"]  # a rollout that records why each trajectory ended
    assert [r["stop"] for r in sample_records(batch, 1, 2, run=FAKE_RUN)] == ["answer", "max_turns"]
    single = sample_records(toy_batch([1.0, -1.0, 0.0, 0.0], ref=False), 1, 2, run=FAKE_RUN)
    assert all("conversation" not in r and "stop" not in r and "env" not in r["tokens"] for r in single)


def test_samples_jsonl_holds_bounded_per_token_values(run_a, run_b):
    recs = read_jsonl(run_a / "samples.jsonl")
    assert len(recs) == 3 * 4
    computed = [r["tokens"] for r in recs if r["tokens"]["computed"]]
    assert computed, "no written sample was computed by the update"
    for r in recs:
        t = r["tokens"]
        k = min(6, r["length"])  # sample_tokens=6 of at most max_new_tokens=8
        assert t["n"] == r["length"] and t["shown"] == k and len(t["text"]) == len(t["adv"]) == k
        assert all(isinstance(a, float) for a in t["adv"])
        for key in ("logp", "ratio", "entropy", "kl", "clip"):
            assert (t[key] is None) == (not t["computed"]) and (t[key] is None or len(t[key]) == k), key
    assert all(x <= 0 for t in computed for x in t["logp"]) and all(x >= 0 for t in computed for x in t["kl"])
    assert any(abs(x - 1) > 1e-4 for t in computed for x in t["ratio"])  # mu = 2: the last epoch moved
    assert any(t["shown"] < t["n"] for t in computed)  # the bound cut something
    assert all(c in (-1, 0, 1) for t in computed for c in t["clip"])
    assert all("tokens" not in r for r in read_jsonl(run_b / "samples.jsonl"))  # sample_tokens=0
    assert all("conversation" not in r and "env" not in r["tokens"] and "n_env" not in r["tokens"] for r in recs)
    per_step = (run_a / "samples.jsonl").stat().st_size / 3
    assert per_step < 4 * (1000 + 60 * 6), per_step  # the documented bound


# -- the page --------------------------------------------------------------------------------------


EXTERNAL = re.compile(
    r"""(?:src|href|action|poster)\s*=\s*(?!["']?(?:data:|#))|url\(\s*(?!["']?data:)|@import|<link\b""", re.IGNORECASE
)


def test_train_writes_a_self_contained_report(run_a, run_b):
    html = (run_a / "report.html").read_text()
    pngs = sorted(p.name for p in (run_a / "report_plots").glob("*.png"))
    for name in ("reward", "length", "eval", "kl", "entropy", "clip", "zero_std", "grad_norm", "lr", "time"):
        assert f"{name}.png" in pngs
    assert html.count('src="data:image/png;base64,') == len(pngs)
    assert not EXTERNAL.search(html), EXTERNAL.search(html)
    assert "Token-level credit" in html and 'class="tok' in html and "finished: 3 steps" in html
    assert 'alt="Reward (verifiers, before shaping): total, format, test_varied"' in html  # per verifier
    machine = json.loads((run_a / "machine.json").read_text())
    assert machine["device"] == "cpu" and machine["torch"] == torch.__version__
    assert not (run_b / "report.html").exists() and not (run_b / "report_plots").exists()  # report=false
    assert not any(p.startswith("env_") for p in pngs)  # single-turn: no environment panels
    assert 'class="tok env' not in html and 'class="conversation"' not in html and "<th>whose</th>" not in html


def test_a_comparison_overlays_the_runs(run_a, run_b, tmp_path, capsys):
    out = tmp_path / "cmp.html"
    assert main(["report", str(run_a), str(run_b), "-o", str(out)]) == 0
    html = out.read_text()
    assert "grpo vs drgrpo" in html and "Config differences" in html and "<th>algo.name</th>" in html
    alt = re.search(r'alt="(Reward[^"]*)"', html).group(1)
    assert "grpo: total" in alt and "drgrpo: total" in alt
    assert (tmp_path / "cmp_plots" / "reward.png").exists() and str(out) in capsys.readouterr().out
    assert "No token-level view: this run's samples.jsonl has no per-token values" in html  # run b


def test_not_a_run_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'}: not a grpolab run directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err


def test_a_run_in_progress_with_a_cut_line(run_a, tmp_path, capsys):
    """Up to the last complete line: a cut line inside is skipped and counted, the unfinished last one too."""
    run = tmp_path / "live"
    run.mkdir()
    for name in ("config.yaml", "samples.jsonl"):
        shutil.copy(run_a / name, run / name)
    lines = (run_a / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(f"{lines[0]}\n{lines[1][:40]}\n{lines[2]}\n{lines[2][:30]}")
    assert main(["report", str(run)]) == 0
    err, html = capsys.readouterr().err, (run / "report.html").read_text()
    assert "skipped 2 line(s)" in err and "metrics.jsonl:2" in err
    assert "in progress or stopped: 2 of 3 steps" in html
    assert "metrics.jsonl: 2 (line 2, 4 (incomplete last line))" in html
    assert "no held-out evaluation recorded" in html  # no summary.json yet


def test_aha_metrics_and_alerts_get_their_panels(tmp_path, capsys):
    """A run that logs the aha metrics (grpolab.training.diagnostics) gets its reflection and correlation panels, the
    correct/incorrect length split and its alerts; written here by hand, no training needed."""
    run = tmp_path / "aha"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 3\nmodel: m\n")
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "completion/length_mean": 9.0,
            "aha/length_correct": 5.0 + s,
            "aha/length_incorrect": 9.0,
            "aha/reflection_count": 2.0 * s,
            "aha/reflection_frac": s / 10,
            "aha/length_reward_corr": 0.1 * s,
            "aha/length_reward_corr_rolling": None if s == 1 else 0.2,
            "alert/entropy": float(s == 3),
            "alert/count": float(s == 3),
        }
        for s in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    alts = re.findall(r'alt="([^"]*)"', html)
    assert "Completion length: mean, aha/length_correct, aha/length_incorrect" in alts
    assert "Reflection phrases: aha/reflection_count" in alts
    assert "Completions with a reflection phrase: aha/reflection_frac" in alts
    assert "Length-reward correlation: aha/length_reward_corr, aha/length_reward_corr_rolling" in alts
    assert "<th>alerts (steps)</th><td>entropy: 3</td>" in html
    assert "No token-level view: this run has no samples yet" in html
    for r in rows:  # a metric that is null at every step: a note, not an empty plot
        r["aha/length_reward_corr"] = r["aha/length_reward_corr_rolling"] = None
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    assert "Length-reward correlation: logged, but null (not a finite number) at every step" in html
    assert 'alt="Length-reward correlation' not in html


@pytest.fixture(scope="module")
def multi_turn_run(tmp_path_factory) -> Path:
    """A multi-turn run written by hand (no training): env/* metrics, and samples.jsonl records made by
    sample_records from a Batch with env_mask and conversations; row 0 of step 3 records its stop."""
    from grpolab.training.trainer import sample_records

    run = tmp_path_factory.mktemp("report") / "agent"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 3\nmodel: m\ntask: arithmetic\nenv:\n  name: calculator_python\n")
    rows = [
        {
            "step": s,
            "reward/mean": 0.5 + 0.1 * s,
            "completion/length_mean": 6.0,
            "env/turns_mean": 2.5 - 0.5 * s,
            "env/tool_calls_mean": 0.5 * s,
            "env/env_token_frac": 0.3,
            "env/stopped_answer": 0.75,
            "env/stopped_max_turns": 0.25,
            "env/stopped_budget": 0.0,
            "env/stopped_env_tokens": 0.0,
            "env/calls/add": float(s),
        }
        for s in (1, 2, 3)
    ]
    rows[1]["env/errors_timeout"] = 2.0  # counts are logged at the steps where they happened
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = []
    for step in (1, 2, 3):
        batch = multi_turn_batch()
        if step == 3:
            batch.rollout.stops = ["answer", "max_turns"]
        lines += [json.dumps(r) for r in sample_records(batch, step, 2, run=FAKE_RUN)]
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run)]) == 0
    return run


def test_a_multi_turn_page_greys_the_environment_tokens_and_shows_the_turns(multi_turn_run):
    html = (multi_turn_run / "report.html").read_text()
    assert not EXTERNAL.search(html)
    views = re.findall(r'<div class="credit" id="credit-0-\d+">(.*?)</details>', html, re.DOTALL)
    assert views, "no credit view"
    for view in views:
        env = re.findall(r'<span class="tok env"([^>]*)>', view)
        model = re.findall(r'<span class="tok(?: clip)?" style="background:([^"]*)"([^>]*)>', view)
        assert env and model
        assert all("data-" not in attrs and "style" not in attrs and "no credit" in attrs for attrs in env)
        assert all(bg.startswith("rgba(") and "data-adv=" in attrs for bg, attrs in model)  # coloured as today
        assert "the environment's (greyed, no credit)" in view and "<th>whose</th>" in view
    row0 = next(v for v in views if "add(7,5)" in v)
    assert len(re.findall(r'<span class="tok env"', row0)) == 3
    assert len(re.findall(r'class="tok(?: clip)?" style', row0)) == 6
    assert '<tr class="env"><td>4</td>' in row0 and "9 tokens after the prompt: 6 the model's, 3" in row0
    assert "Grey</span> tokens are the environment" in html
    samples = html.split('id="samples"')[1]
    assert samples.count('class="conversation"') == 6  # 2 per step, 3 steps
    for label in ("assistant · turn 1", "tool · add", "assistant · turn 2", "user"):
        assert f'<div class="role">{label}</div>' in samples, label
    assert '<div class="turn user"><div class="role">user</div><pre>Not right. Try again.</pre>' in samples
    assert "6 model tokens · 2 model turns · stopped: answer (ended by the environment" in samples
    assert "stopped: max_turns (at env.max_turns)" in samples
    assert samples.count("stopped:") == 2  # only step 3 recorded its stops


def test_a_multi_turn_page_plots_the_environment_metrics_beside_reward_and_length(multi_turn_run):
    html = (multi_turn_run / "report.html").read_text()
    alts = re.findall(r'alt="([^"]*)"', html)
    assert alts[:4] == [
        "Reward (verifiers, before shaping): total",
        "Completion length: mean",
        "Turns and tool calls per trajectory: model turns, tool calls",
        (
            "Environment tokens and stop reasons: environment tokens, stopped_answer, stopped_budget, "
            "stopped_env_tokens, stopped_max_turns"
        ),
    ]
    assert "Environment errors by kind: timeout" in alts and "Calls per tool: add" in alts
    pngs = {p.name for p in (multi_turn_run / "report_plots").glob("*.png")}
    assert {"env_turns.png", "env_shares.png", "env_errors.png", "env_calls.png"} <= pngs
    from grpolab.app.report.load import load_run

    run = load_run(multi_turn_run)
    assert run.series("env/errors_timeout") == ([2], [2.0])
    assert run.series("env/errors_timeout", fill=0.0) == ([1, 2, 3], [0.0, 2.0, 0.0])  # the panel's line


def test_without_matplotlib_the_report_says_what_to_install(run_a, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["report", str(run_a), "-o", str(tmp_path / "r.html")]) == 1
    assert "pip install 'grpolab[report]'" in capsys.readouterr().err and not (tmp_path / "r.html").exists()


def test_a_failing_report_never_fails_the_run(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from grpolab.app.report import plots

    def broken():
        raise plots.MissingPlotting("no plotting here")

    monkeypatch.setattr(plots, "_matplotlib", broken)
    out = train(tiny_model_dir, tmp_path / "run", "steps=1", "eval_size=0")
    assert (out / "summary.json").exists() and not (out / "report.html").exists()
    assert "report.html not written: no plotting here" in capsys.readouterr().out


# -- in a real browser -----------------------------------------------------------------------------


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: it reads
    commands on fd 3 and writes on fd 4, NUL-separated JSON), one page target, every event kept."""

    def __init__(self, exe: str, profile: Path):
        import fcntl

        # close-on-exec, and above 9 so that they cannot be 3 or 4; pass_fds hands only to_r and from_w
        # to the child, where bash moves them onto the descriptors chromium reads (3) and writes (4)
        def high(fd: int) -> int:
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(fd)
            return moved

        to_r, to_w = map(high, os.pipe())
        from_r, from_w = map(high, os.pipe())
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.log = (profile.parent / "chromium.log").open("wb")  # closed in close()
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-', "bash", exe, *flags],
            pass_fds=(to_r, from_w),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(to_r)
        os.close(from_w)
        self.out, self.inbox, self.events, self.next_id = os.fdopen(to_w, "wb"), queue.Queue(), [], 0
        threading.Thread(target=self._read, args=(os.fdopen(from_r, "rb"),), daemon=True).start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)

    def _read(self, f):
        buf = b""
        while chunk := f.read1(65536):
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for m in msgs:
                self.inbox.put(json.loads(m))
        self.inbox.put(None)

    def _next(self, timeout: float = 60) -> dict:
        msg = self.inbox.get(timeout=timeout)
        if msg is None:
            raise RuntimeError(f"chromium closed the pipe: {(Path(self.log.name)).read_text()[-2000:]}")
        if "id" not in msg:
            self.events.append(msg)
        return msg

    def send(self, method: str, session: bool = False, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.out.write(json.dumps(msg).encode() + b"\0")
        self.out.flush()
        while True:
            reply = self._next()
            if reply.get("id") == self.next_id:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]

    def open(self, url: str, width: int = 1340) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self._next()

    def js(self, expr: str):
        res = self.send("Runtime.evaluate", session=True, expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res
        return res["result"].get("value")

    def screenshot(self):
        from PIL import Image

        height = min(int(self.js("document.documentElement.scrollHeight")), 16000)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=self.js("window.innerWidth"),
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = self.send("Page.captureScreenshot", session=True, format="png")["data"]
        return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")

    def problems(self, page_url: str) -> tuple[list[str], list[str]]:
        """(console errors and exceptions, requests to anything but the page itself and data: URLs)."""
        errors, requests = [], []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("exception", {}).get("description", "exception"))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(p["entry"]["text"])
            elif m == "Network.requestWillBeSent":
                url = p["request"]["url"]
                if url != page_url and not url.startswith("data:"):
                    requests.append(url)
        return errors, requests

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session only
            self.proc.wait()
        self.log.close()


def drawn(image, rect: dict) -> float:
    """Fraction of the pixels inside rect that are not the white background."""
    box = image.crop(
        (int(rect["x"]) + 2, int(rect["y"]) + 2, int(rect["x"] + rect["w"]) - 2, int(rect["y"] + rect["h"]) - 2)
    )
    import numpy as np

    px = np.asarray(box)  # (h, w, 3)
    return float((px.min(axis=-1) < 235).mean()) if px.size else 0.0


RECTS = """JSON.stringify([...document.querySelectorAll('img.plot')].map(i => { const r = i.getBoundingClientRect();
  return {alt: i.alt, x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height, ok: i.complete && i.naturalWidth > 0}; }))"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(
            "chromium is not installed and could not be installed here (make test installs Debian's "
            "chromium with apt-get when it is missing and apt-get is available as root)"
        )
    b = Chromium(exe, tmp_path_factory.mktemp("chromium") / "profile")
    yield b
    b.close()


def test_the_browser_check_catches_errors_requests_and_blank_plots(browser, tmp_path):
    """The checks below can fail: a page with a console error, an external image and a blank plot."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (300, 150), "white").save(buf, format="PNG")
    blank = base64.b64encode(buf.getvalue()).decode()
    page = tmp_path / "bad.html"
    page.write_text(
        f'<html><body><img class="plot" src="data:image/png;base64,{blank}">'
        '<img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script></body></html>'
    )
    browser.open(page.as_uri())
    rects = json.loads(browser.js(RECTS))
    errors, requests = browser.problems(page.as_uri())
    assert any("boom" in e for e in errors) and requests == ["http://127.0.0.1:9/x.png"]
    assert drawn(browser.screenshot(), rects[0]) < 0.01


def test_the_report_in_a_real_browser(run_a, browser, tmp_path):
    page = run_a / "report.html"
    browser.open(page.as_uri())
    rects = json.loads(browser.js(RECTS))
    assert len(rects) == len(list((run_a / "report_plots").glob("*.png"))) >= 10
    assert all(r["ok"] and r["w"] > 300 and r["h"] > 150 for r in rects), rects
    shot = browser.screenshot()
    shot.save(tmp_path / "report.png")  # to look at: pytest --basetemp=DIR keeps it
    for r in rects:
        assert drawn(shot, r) > 0.03, (r["alt"], drawn(shot, r))  # axes, curves and text are there
    tokens = browser.js("document.querySelectorAll('.creditview .tok').length")
    assert tokens > 0
    before = browser.js("getComputedStyle(document.querySelector('.tok:not(.skip)')).backgroundColor")
    browser.js("document.querySelector('.modes button[data-mode=entropy]').click()")
    after = browser.js("getComputedStyle(document.querySelector('.tok:not(.skip)')).backgroundColor")
    assert before != after  # the colour switch works (its script ran without an error)
    errors, requests = browser.problems(page.as_uri())
    assert errors == [] and requests == []


def test_a_multi_turn_page_in_a_real_browser(multi_turn_run, browser):
    """The environment's tokens stay grey when the colour switch repaints the model's."""
    page = multi_turn_run / "report.html"
    browser.open(page.as_uri())
    grey = "getComputedStyle(document.querySelector('.creditview .tok.env')).backgroundColor"
    model = "getComputedStyle(document.querySelector('.creditview .tok:not(.env)')).backgroundColor"
    env_before, model_before = browser.js(grey), browser.js(model)
    browser.js("document.querySelector('.modes button[data-mode=entropy]').click()")
    assert browser.js(grey) == env_before == "rgb(234, 238, 242)" and browser.js(model) != model_before
    assert browser.js("document.querySelectorAll('.conversation .turn').length") == 18
    errors, requests = browser.problems(page.as_uri())
    assert errors == [] and requests == []
