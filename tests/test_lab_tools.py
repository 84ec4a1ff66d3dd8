"""grpolab lab tools: the tokenizer and its tool template, the pre-training texts, the calculators as the
trainer loads them, the reading of trajectories, the wrong setting of the ablation, and the whole
miniature's machinery on a model pre-trained for a few steps (seconds; the direction of the result
is measured by the full run, docs/lab.md)."""

import json
from types import SimpleNamespace

import pytest
import torch

from grpolab.app.lab import tools, tools_results
from grpolab.batch import Rollout
from grpolab.engine.base import Sampling
from grpolab.env import load_environment, parse_tool_calls
from grpolab.env.calls import ToolCall
from grpolab.model.template import addition_text, append_only_problem

TRACE_PROMPT = "347+589="
TRACE = '<tool_call>{"name":"add","arguments":{"a":347,"b":589}}</tool_call><eos><tool_response>936</tool_response>936'


def test_tokenizer_renders_tool_conversations_append_only_and_round_trips():
    tok = tools.tool_tokenizer()
    assert append_only_problem(tok, None, None) is None  # the multi-turn trainer's own check passes
    ids = tok(TRACE_PROMPT + TRACE, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == TRACE_PROMPT + TRACE
    assert ids.count(tok.eos_token_id) == 1  # "<eos>" in a text is the EOS token
    for word in tools.WORDS[:4]:
        assert tok.convert_tokens_to_ids(word) in ids  # one token each
    assert len(ids) == 44
    history = [{"role": "user", "content": TRACE_PROMPT}, {"role": "assistant", "content": tools.call_text(347, 589)}]
    assert (
        addition_text(tok, history, [{"role": "tool", "name": "add", "content": "936"}])
        == "<tool_response>936</tool_response>"
    )  # what the environment adds after the model's EOS


def test_corpus_texts():
    prompt, completion = tools.text(347, 589, "tool")
    assert (prompt, completion) == (TRACE_PROMPT, TRACE)
    call_turn = completion.split("<eos>")[0]
    assert parse_tool_calls(call_turn) == [ToolCall("add", {"a": 347, "b": 589}, call_turn[11:-12])]
    assert tools.text(3, 5, "direct") == ("3+5=", "8")  # one-digit sums: direct and right
    assert [tools.estimate(t) for t in (936, 935, 934, 940, 1995)] == ["940", "940", "930", "940", "2000"]
    texts = tools.corpus(tools.MIX, 4000, 0)
    worked = [c for p, c in texts if p.endswith("?")]
    assert 0.45 < len(worked) / len(texts) < 0.55 and all(c.startswith("<tool_call>") for c in worked)
    hard = [c for p, c in texts if p.endswith("=") and len(p) > 5]
    easy = [c for p, c in texts if p.endswith("=") and len(p) <= 5]
    assert 0.55 < len(hard) / (len(hard) + len(easy)) < 0.65
    for part in (hard, easy):
        assert 0.15 < sum(c.startswith("<tool_call>") for c in part) / len(part) < 0.25
    traces = worked + [c for c in hard if c.startswith("<tool_call>")]
    reads = [c.split("</tool_response>")[1] == c.split("<tool_response>")[1].split("<")[0] for c in traces]
    assert 0.72 < sum(reads) / len(reads) < 0.82  # 3/4 copy it; the rest write the estimate (right 1/10)


def test_problems_hold_out_their_eval_rows(tmp_path):
    train, held = tools.write_problems(tmp_path, "mixed", 0, n_train=400, n_eval=32)
    rows = [json.loads(x) for x in train.read_text().splitlines()]
    ev = [json.loads(x) for x in held.read_text().splitlines()]
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in ev}
    assert {r["kind"] for r in ev} == {"easy", "hard"} and all(int(r["answer"]) == r["a"] + r["b"] for r in rows)


def test_calculators_through_the_environment_loader():
    call = tools.call_text(347, 589)
    good = load_environment("grpolab.app.lab.tools_env:Calculator")()
    good.reset({"prompt": TRACE_PROMPT, "answer": "936", "kind": "hard", "a": 347, "b": 589})
    reply = good.step(call)
    assert reply.messages == [{"role": "tool", "name": "add", "content": "936"}] and not reply.done
    assert good.step("936").done and good.reward() is None
    broken = load_environment("grpolab.app.lab.tools_env:BrokenCalculator")()
    broken.reset({})
    off = [int(broken.step(tools.call_text(a, 589)).messages[0]["content"]) - (a + 589) for a in range(100, 140)]
    assert sum(d == 0 for d in off) <= 1 and len(set(off)) > 30  # unrelated to the sum
    costly = load_environment("grpolab.app.lab.tools_env:CostlyCalculator", options={"cost": 0.1})()
    costly.reset({})
    costly.step(call)
    costly.step(call)
    assert costly.reward() == pytest.approx(-0.2)
    costly.reset({})
    assert costly.reward() == 0.0


def test_classify_trajectories():
    tool = {"role": "tool", "name": "add", "content": "936"}
    call = {"role": "assistant", "content": tools.call_text(347, 589)}
    assert tools_results.classify([call, tool, {"role": "assistant", "content": "936"}]) == {
        "called": True,
        "uses": True,
        "turns": 2,
    }
    assert tools_results.classify([call, tool, {"role": "assistant", "content": "935"}])["uses"] is False
    assert tools_results.classify([{"role": "assistant", "content": "936"}]) == {
        "called": False,
        "uses": False,
        "turns": 1,
    }
    assert tools_results.classify([call, tool, call, tool, call])["uses"] is False  # cut while calling: no answer


def _trace_rollout(tok, G=2):
    """Two identical trajectories of the trace: model tokens, then the tool's, then the model's answer."""
    p = tok(TRACE_PROMPT, add_special_tokens=False)["input_ids"]
    turn1 = tok(tools.call_text(347, 589), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    env = tok("<tool_response>936</tool_response>", add_special_tokens=False)["input_ids"]
    turn2 = tok("936", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = turn1 + env + turn2
    model = [1.0] * len(turn1) + [0.0] * len(env) + [1.0] * len(turn2)
    N = G
    return Rollout(
        prompt_ids=torch.tensor([p] * N),
        prompt_mask=torch.ones((N, len(p)), dtype=torch.long),
        completion_ids=torch.tensor([ids] * N),
        completion_mask=torch.tensor([model] * N),
        sample_logp=torch.full((N, len(ids)), -0.5) * torch.tensor([model] * N),
        truncated=torch.zeros(N, dtype=torch.bool),
        texts=["936"] * N,
        G=G,
        env_mask=1.0 - torch.tensor([model] * N),
    ), len(env)


@pytest.mark.parametrize("wrong", [False, True])
def test_instrumented_rollouts_and_the_wrong_setting(monkeypatch, wrong):
    from grpolab.app.lab import tinychar
    from grpolab.training import step as step_module

    tok = tools.tool_tokenizer()
    run = SimpleNamespace(
        policy=tinychar.tiny_llama(tok, hidden=32, layers=1), tokenizer=tok, cfg=SimpleNamespace(temperature=1.0)
    )
    rollout, n_env = _trace_rollout(tok)
    cmask, smp = rollout.completion_mask.clone(), rollout.sample_logp.clone()
    monkeypatch.setattr(step_module, "agent_rollout", lambda run, ex, **kw: (rollout, [None, None], {"env/x": 1.0}))
    with tools.instrumented(env_tokens_in_loss=wrong):
        out, _, info = step_module.agent_rollout(run, [], G=2)
        _, _, held_info = step_module.agent_rollout(run, [], G=2, sampling=Sampling(4, greedy=True))  # evaluation
    assert step_module.agent_rollout is not None and "lab/result_logp" not in held_info
    assert info["lab/model_tokens_mean"] == float(cmask.sum(-1).mean())
    assert info["lab/result_logp"] < 0  # the 3 result digits under the policy
    env = cmask == 0
    if not wrong:
        assert (
            out.env_mask is not None and torch.equal(out.completion_mask, cmask) and "lab/env_token_share" not in info
        )
        return
    assert out.env_mask is None and bool((out.completion_mask == 1).all())  # every token now reads as the model's
    assert info["lab/env_token_share"] == pytest.approx(n_env / cmask.shape[1])
    assert torch.equal(out.sample_logp[~env], smp[~env])  # the model's own tokens: as sampled
    assert bool((out.sample_logp[env] < 0).all())  # the environment's: the policy's log-probs, ratio 1


def test_the_wrong_setting_is_undone_after_the_arm():
    from grpolab.training import step as step_module

    before = step_module.agent_rollout
    with pytest.raises(RuntimeError), tools.instrumented(env_tokens_in_loss=True):
        assert step_module.agent_rollout is not before
        raise RuntimeError
    assert step_module.agent_rollout is before


def test_quick_miniature_machinery(tmp_path, monkeypatch):
    """Every arm through the real trainer, on a model pre-trained for 20 steps (its own cache): the tables,
    tools.json, tools.png and the main run's report are written; the numbers mean nothing at this size."""
    from grpolab.app.cli import main
    from grpolab.app.lab import last_result
    from grpolab.util.fileio import read_jsonl

    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    argv = [
        "lab",
        "tools",
        "--ablate",
        "--pretrain-steps",
        "20",
        "--steps",
        "2",
        "--blocks",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    res = last_result
    assert set(res["arms"]) == set(tools.ARMS)
    assert res["verdict"].startswith(("holds here", "does not hold here")) and res["ablation_verdict"].startswith(
        "ablation"
    )
    saved = json.loads((tmp_path / "out" / "tools.json").read_text())
    assert saved["verdict"] == res["verdict"] and len(saved["per_step"]["calc"]) == 2
    assert (tmp_path / "out" / "calc" / "report.html").exists()
    rec = read_jsonl(tmp_path / "out" / "calc" / "metrics.jsonl")[0]
    for k in ("env/tool_calls_mean", "env/turns_mean", "reward/math/mean", "lab/model_tokens_mean"):
        assert k in rec
    cfg = (tmp_path / "out" / "cost_per_call" / "config.yaml").read_text()
    assert "CostlyCalculator" in cfg and "cost: 0.1" in cfg
    assert list((tmp_path / "cache" / "lab").glob("tools-*/pretrain.json"))


def test_bad_budgets_are_usage_errors():
    from grpolab.app.cli import main

    for argv in (
        ["lab", "tools", "--steps", "0"],
        ["lab", "tools", "--pretrain-steps", "0"],
        ["lab", "tools", "--blocks", "0"],
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
