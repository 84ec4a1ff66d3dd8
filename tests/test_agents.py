"""Multi-turn rollouts (docs/agents.md): token in, token out on two chat templates; a template that is
not append-only refused; environment tokens carry no gradient; stop reasons; GAE over turns; and an
environment class written as a TRL user writes it, trained unchanged through the real CLI."""

from __future__ import annotations

import json

import pytest
import torch

from grpolab.algo.gae import gae
from grpolab.algo.losses import policy_loss
from grpolab.algo.presets import AlgoConfig
from grpolab.batch import Rollout
from grpolab.engine.native.turns import generate_turns
from grpolab.env.settings import EnvConfig
from grpolab.model.passes import PassSpec, slice_groups, slice_logp
from grpolab.model.template import addition_ids, append_only_problem, render
from grpolab.training.agents import load_environments
from grpolab.util.fields import ConfigError

# A Qwen2.5-style tool template (tools in the system message, tool results inside a user turn as
# <tool_response>, consecutive tool messages merged), on the same <|im_start|>/<|im_end|> tokens.
QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call functions.\\n<tools>' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.fixture(params=["bundled", "qwen_style"])
def template_tokenizer(request, tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    if request.param == "qwen_style":
        tok.chat_template = QWEN_STYLE
    return tok


def test_trajectory_ids_equal_the_templates_rendering_of_the_whole_conversation(template_tokenizer):
    """The stream grpolab trains on (prompt, then each model turn as the ids it sampled + EOS, then the
    environment's addition_ids) is the template's rendering of the whole conversation, token for token."""
    tok = template_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    convo = [{"role": "user", "content": "What is 17 + 25?"}]
    turns = [
        '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
        "It is 42.",
    ]
    replies = [[{"role": "tool", "content": "42"}, {"role": "tool", "content": "2"}]]
    stream = list(
        tok(render(tok, convo, add_generation_prompt=True, tools=TOOLS), add_special_tokens=False)["input_ids"]
    )
    for k, text in enumerate(turns):
        stream += list(tok(text, add_special_tokens=False)["input_ids"]) + [eos]  # the model's ids, kept as sampled
        convo.append({"role": "assistant", "content": text})
        if k < len(replies):
            stream += addition_ids(tok, convo, replies[k], TOOLS)
            convo += replies[k]
    whole = render(tok, convo, add_generation_prompt=False, tools=TOOLS)
    expected = list(tok(whole, add_special_tokens=False)["input_ids"])
    assert stream == expected[: len(stream)]
    assert tok.decode(expected[len(stream) :]).strip() == ""  # only the template's final newline is left


def test_a_template_that_rewrites_earlier_turns_is_refused_before_training(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    assert append_only_problem(tok) is None and append_only_problem(tok, TOOLS) is None
    # drops the content of past assistant turns (as reasoning templates drop past <think> blocks)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
        "(earlier){% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert "not append-only" in append_only_problem(tok)
    with pytest.raises(ConfigError, match="append"):
        load_environments(EnvConfig(name="retry_arithmetic"), tok, None)


class Scripted:
    """respond() of a test: after every turn the environment says 'again' until `ends_after` turns."""

    def __init__(self, tok, ends_after: int):
        self.tok, self.ends_after, self.turns = tok, ends_after, {}

    def __call__(self, rows, turn_ids, ended):
        out = []
        for r in rows:
            self.turns[r] = self.turns.get(r, 0) + 1
            done = self.turns[r] >= self.ends_after
            out.append(
                None
                if done
                else list(
                    self.tok("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
                        "input_ids"
                    ]
                )
            )
        return out


@pytest.mark.parametrize("lean", [True, False])
def test_turns_share_one_cache_and_stop_for_a_stated_reason(tiny_model, tiny_tokenizer, lean):
    tok = tiny_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = [
        list(
            tok(render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True), add_special_tokens=False)[
                "input_ids"
            ]
        )
    ]
    kw = dict(
        G=4,
        max_turn_tokens=6,
        max_model_tokens=40,
        max_env_tokens=200,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        eos_ids={eos},
        lean=lean,
    )
    # the tiny random model rarely samples EOS within 6 tokens: most turns end at the per-turn cap
    rollout, trajs = generate_turns(tiny_model, tok, prompt, Scripted(tok, 2), max_turns=3, **kw)
    assert {t.stop for t in trajs} <= {"budget", "answer", "max_turns", "env_tokens"}
    for t, cm, em, lp in zip(trajs, rollout.completion_mask, rollout.env_mask, rollout.sample_logp):
        n = len(t.ids)
        assert int(cm.sum() + em.sum()) == n and float((cm * em).sum()) == 0.0  # each token has one owner
        assert float(lp[em.bool()].abs().sum()) == 0.0  # no sampling log-prob for environment tokens
        assert int(cm.sum()) == sum(len(x) for x in t.turns) <= 40
    # with EOS forced by the scripted turn limit: turns of exactly one token each (EOS as the only token)
    forced = _eos_model(tiny_model, eos)
    rollout, trajs = generate_turns(forced, tok, prompt, Scripted(tok, 2), max_turns=3, **kw)
    assert [t.stop for t in trajs] == ["answer"] * 4 and all(len(t.turns) == 2 for t in trajs)
    rollout, trajs = generate_turns(forced, tok, prompt, Scripted(tok, 99), max_turns=3, **kw)
    assert [t.stop for t in trajs] == ["max_turns"] * 4 and all(len(t.turns) == 3 for t in trajs)
    kw["max_env_tokens"] = 5
    rollout, trajs = generate_turns(forced, tok, prompt, Scripted(tok, 99), max_turns=3, **kw)
    assert [t.stop for t in trajs] == ["env_tokens"] * 4


def _eos_model(model, eos: int):
    """The tiny model with its LM head biased so that every sampled token is EOS."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        m.lm_head.weight.zero_()
        m.lm_head.weight[eos] = 0.0
        bias = torch.full((m.lm_head.weight.shape[0],), -1e4)
        bias[eos] = 0.0
        m.lm_head.bias = torch.nn.Parameter(bias)
    return m


def _env_rollout(tiny_tokenizer, seed=0) -> Rollout:
    """Two groups of 2: model tokens, then 3 environment tokens, then model tokens again."""
    g = torch.Generator().manual_seed(seed)
    N, P, C = 4, 5, 9
    pm = torch.ones((N, P), dtype=torch.long)
    env = torch.zeros((N, C))
    env[:, 3:6] = 1
    cm = 1 - env
    cm[1, 8] = 0  # a shorter row
    return Rollout(
        torch.randint(5, 200, (N, P), generator=g),
        pm,
        torch.randint(5, 200, (N, C), generator=g),
        cm,
        torch.zeros((N, C)),
        torch.zeros(N, dtype=torch.bool),
        [""] * N,
        2,
        env,
    )


def test_environment_tokens_get_exactly_zero_gradient(tiny_model, tiny_tokenizer, monkeypatch):
    """The policy gradient is bitwise the same whatever the log-probs at environment positions are
    (scaled, shifted, even inf): they never reach the loss."""
    from grpolab.model import passes

    rollout = _env_rollout(tiny_tokenizer)
    real = passes.grouped_completion_logp

    def grads(scale: float, shift: float):
        def perturbed(*a, **k):
            logp, ent = real(*a, **k)
            env = (part.attention_mask - part.completion_mask).bool()  # (b, C') environment tokens
            return torch.where(env, logp * scale + shift, logp), ent

        monkeypatch.setattr(passes, "grouped_completion_logp", perturbed)
        tiny_model.zero_grad(set_to_none=True)
        logp, _ = slice_logp(PassSpec(torch.device("cpu")), tiny_model, part)
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
        loss, _ = policy_loss(
            logp,
            logp.detach(),
            adv,
            part.completion_mask,
            AlgoConfig(),
            n_seq=4,
            n_tok=int(part.completion_mask.sum()),
            max_len=9,
        )
        loss.backward()
        return [p.grad.clone() for p in tiny_model.parameters() if p.grad is not None]

    part = slice_groups(rollout, torch.arange(4), torch.device("cpu"))
    assert part.attention_mask is not None and int(part.present.sum()) > int(part.completion_mask.sum())
    base = grads(1.0, 0.0)
    for scale, shift in ((7.0, 0.0), (1.0, 3.0), (1.0, float("inf"))):
        other = grads(scale, shift)
        assert all(torch.equal(a, b) for a, b in zip(base, other)), (scale, shift)


def test_gae_runs_over_the_models_tokens_across_turns():
    """docs/algorithms.md, "PPO over turns": environment tokens are skipped; with gamma = lam = 1 every
    model token's advantage is r_final - V_t, in every turn."""
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1, 0]])
    r = torch.tensor([[0.0, 0, 0, 0, 0, 1, 0]])
    v = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 0.0]])
    adv, ret = gae(r, v, mask, 1.0, 1.0)
    assert torch.allclose(adv, torch.tensor([[0.9, 0.8, 0, 0, 0.7, 0.6, 0]]))
    assert float(ret[0, 2]) == 0.0 and float(ret[0, 0]) == pytest.approx(1.0)


TRL_ENV = '''
class AdditionEnv:
    """Written as a TRL user writes an environment_factory class (TRL 1.16 GRPOTrainer)."""

    def reset(self, **kwargs):
        self.calls = 0
        self.answer = kwargs["answer"]
        return "You may use the add tool."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return 0.1 * self.calls
'''


def test_a_trl_environment_class_trains_unchanged_through_the_cli(tmp_path, tiny_model_dir):
    from grpolab.app.cli import main

    envfile = tmp_path / "addition_env.py"
    envfile.write_text(TRL_ENV)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            "steps=2",
            "batch_size=8",
            "G=4",
            "micro_batch=4",
            "eval_size=2",
            "progress=false",
            "report=false",
            f"env.name={envfile}:AdditionEnv",
            "env.max_turns=2",
            "env.max_turn_tokens=6",
            "env.max_model_tokens=12",
            "rewards=[{name: format, weight: 0.5}]",
        ]
    )
    assert code == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for m in rows:
        assert 1.0 <= m["env/turns_mean"] <= 2.0
        assert m["completion/length_mean"] <= 12
        assert sum(m[f"env/stopped_{s}"] for s in ("answer", "max_turns", "budget", "env_tokens")) == pytest.approx(1.0)
        assert "reward/env/mean" in m
    assert (out / "checkpoints").exists()
