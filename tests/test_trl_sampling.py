"""TRL's sampling and schedule options: top_k, min_p, repetition_penalty and generation_kwargs in the native
sampler (against transformers' own logits processors) and in vLLM's SamplingParams keywords; lr_scheduler
and warmup_ratio against transformers.get_scheduler; chat_template_kwargs in every rendering; the TR-DPO
reference update."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.algo.presets import AlgoConfig
from grpolab.engine.base import Sampling
from grpolab.engine.native.sampling import (
    Filters,
    apply_repetition_penalty,
    is_plain,
    sample_token,
    sampling_logp,
    seen_tokens,
)
from grpolab.engine.vllm_engine import vllm_sampling_kwargs
from grpolab.model.optim import SCHEDULES, build_scheduler
from grpolab.model.reference import FrozenCopy, mix_into
from grpolab.training.config import build_config, sampling_values
from grpolab.training.options import check_engine_kwargs, extra_generation_kwargs, lr_updates
from grpolab.training.update import sync_reference
from grpolab.util.fields import ConfigError


def logits_batch(seed: int = 0, B: int = 4, V: int = 50) -> torch.Tensor:
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 2.0


# --- the sampler's filters, against transformers' processors ----------------------------------------------


def test_repetition_penalty_arithmetic_is_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    z = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0]])
    ids = torch.tensor([[0, 1, 3]])  # tokens 0, 1, 3 already in the sequence
    seen = seen_tokens(ids, torch.ones_like(ids), 5)
    got = apply_repetition_penalty(z, seen, 1.5)
    # token 0: 2 / 1.5 = 1.333333; token 1: -1 * 1.5 = -1.5; token 3: -3 * 1.5 = -4.5; tokens 2, 4 unchanged
    assert torch.allclose(got, torch.tensor([[2 / 1.5, -1.5, 0.5, -4.5, 1.0]]))
    assert torch.allclose(got, RepetitionPenaltyLogitsProcessor(1.5)(ids, z.clone()))


def test_seen_tokens_skips_padding():
    ids, mask = torch.tensor([[7, 7, 2], [1, 3, 4]]), torch.tensor([[0, 0, 1], [1, 1, 1]])  # row 0 left-padded with 7
    seen = seen_tokens(ids, mask, 8)
    assert seen[0].nonzero().flatten().tolist() == [2] and seen[1].nonzero().flatten().tolist() == [1, 3, 4]


@pytest.mark.parametrize(
    "T,top_k,top_p,min_p,pen",
    [(1.0, 5, 1.0, 0.0, 1.0), (0.7, 0, 1.0, 0.1, 1.0), (1.3, 10, 0.8, 0.05, 1.2), (1.0, 0, 0.9, 0.0, 0.8)],
)
def test_sampling_distribution_is_transformers(T, top_k, top_p, min_p, pen):
    """sampling_logp = log_softmax of transformers' chain: repetition penalty, temperature, top-k, top-p, min-p
    (GenerationMixin._get_logits_processor's order), on the same logits and sequences."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    z = logits_batch(1)
    ids = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(2))
    chain = LogitsProcessorList(
        [RepetitionPenaltyLogitsProcessor(pen), TemperatureLogitsWarper(T)]
        + ([TopKLogitsWarper(top_k)] if top_k > 0 else [])
        + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
        + ([MinPLogitsWarper(min_p)] if min_p > 0 else [])
    )
    want = torch.log_softmax(chain(ids, z.clone()), -1)
    got = sampling_logp(z, T, top_p, Filters(top_k, min_p, pen), seen_tokens(ids, torch.ones_like(ids), 50))
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # the same tokens removed
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-5)


def test_top_k_1_is_greedy():
    z = logits_batch(3)
    tok, lp = sample_token(z, 1.0, 1.0, False, torch.Generator().manual_seed(0), Filters(top_k=1))
    assert torch.equal(tok, z.argmax(-1)) and torch.allclose(lp, torch.zeros(4))  # one token left: log-prob 0


def test_min_p_never_draws_below_its_threshold_and_keeps_the_proportions():
    """20,000 draws from one row: no token with q_v < min_p * max q is ever drawn, and the kept tokens'
    frequencies match q renormalised over them within 5 standard errors."""
    z = torch.tensor([[3.0, 2.5, 2.0, 0.0, -1.0, 1.0]]).repeat(20000, 1)
    q = torch.softmax(z[0], -1)
    keep = q >= 0.2 * q.max()  # min_p = 0.2: tokens 0, 1, 2 (q ratio to the max: 1, 0.61, 0.37; then 0.05, 0.02, 0.14)
    assert keep.tolist() == [True, True, True, False, False, False]
    tok, lp = sample_token(z, 1.0, 1.0, False, torch.Generator().manual_seed(4), Filters(min_p=0.2))
    counts = torch.bincount(tok, minlength=6).float()
    assert counts[~keep].sum() == 0
    p = torch.where(keep, q, torch.zeros_like(q)) / q[keep].sum()
    se = torch.sqrt(p * (1 - p) / 20000)
    assert torch.all((counts / 20000 - p).abs() <= 5 * se + 1e-9)
    assert torch.allclose(lp, torch.log(p)[tok], atol=1e-5)  # the recorded log-prob is the filtered one's


def test_plain_means_no_filter():
    assert is_plain(1.0) and is_plain(1.0, Filters(top_k=-1))
    assert not is_plain(0.9) and not is_plain(1.0, Filters(top_k=5))
    assert not is_plain(1.0, Filters(min_p=0.1)) and not is_plain(1.0, Filters(repetition_penalty=1.1))


def test_native_generate_repetition_penalty_is_transformers_generate(lively_model, tiny_tokenizer):
    """Greedy with repetition_penalty 2 and top_k 3 on the tiny model: the same tokens as transformers'
    model.generate with the same settings (the penalty covers prompt and completion so far)."""
    from grpolab.engine.native.generate import generate

    tiny_model = lively_model
    prompt = tiny_tokenizer("one two three four")["input_ids"]
    r = generate(
        tiny_model,
        tiny_tokenizer,
        [prompt],
        G=1,
        max_new_tokens=10,
        greedy=True,
        eos_ids=set(),
        lean=False,
        filters=Filters(top_k=3, repetition_penalty=2.0),
    )
    ids = torch.tensor([prompt])
    hf = tiny_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        repetition_penalty=2.0,
        max_new_tokens=10,
        min_new_tokens=10,
        top_k=None,
        top_p=None,
        temperature=None,
        pad_token_id=0,
    )
    assert r.completion_ids[0].tolist() == hf[0, len(prompt) :].tolist()
    plain = generate(
        tiny_model, tiny_tokenizer, [prompt], G=1, max_new_tokens=10, greedy=True, eos_ids=set(), lean=False
    )
    assert plain.completion_ids[0].tolist() != r.completion_ids[0].tolist()  # the penalty changed the greedy path


def test_native_top_k_1_sampling_equals_greedy(lively_model, tiny_tokenizer):
    from grpolab.engine.native.generate import generate

    tiny_model = lively_model
    prompts = [tiny_tokenizer("a b c")["input_ids"], tiny_tokenizer("hello there friend")["input_ids"]]
    greedy = generate(tiny_model, tiny_tokenizer, prompts, G=2, max_new_tokens=6, greedy=True, eos_ids=set())
    sampled = generate(
        tiny_model,
        tiny_tokenizer,
        prompts,
        G=2,
        max_new_tokens=6,
        greedy=False,
        eos_ids=set(),
        generator=torch.Generator().manual_seed(0),
        filters=Filters(top_k=1),
    )
    assert torch.equal(greedy.completion_ids, sampled.completion_ids)
    assert torch.allclose(sampled.sample_logp, torch.zeros_like(sampled.sample_logp))


# --- configuration and the engines --------------------------------------------------------------------------


def test_generation_kwargs_override_and_route():
    cfg = build_config(None, ["top_k=5", "generation_kwargs={top_k: 7, min_p: 0.1, presence_penalty: 0.5}"])
    v = sampling_values(cfg)
    assert (v["top_k"], v["min_p"], v["repetition_penalty"]) == (7, 0.1, 1.0)  # generation_kwargs win (TRL)
    assert extra_generation_kwargs(cfg) == {"presence_penalty": 0.5}
    check_engine_kwargs(cfg, "vllm")
    with pytest.raises(ConfigError, match=r"^generation_kwargs\.presence_penalty: the native rollout engine"):
        check_engine_kwargs(cfg, "native")
    check_engine_kwargs(build_config(None, ["generation_kwargs={top_p: 0.9}"]), "native")


@pytest.mark.parametrize(
    "override,key",
    [
        ("top_k=-2", "top_k"),
        ("min_p=1.0", "min_p"),
        ("repetition_penalty=0", "repetition_penalty"),
        ("generation_kwargs={temperature: 0}", "generation_kwargs.temperature"),
        ("lr_scheduler=reduce_lr_on_plateau", "lr_scheduler"),
        ("warmup_ratio=1.5", "warmup_ratio"),
        ("algo.steps_per_generation=3", "algo.steps_per_generation"),
        ("algo.sync_ref_model_alpha=0", "algo.sync_ref_model_alpha"),
        ("algo.sapo_temperature_neg=0", "algo.sapo_temperature_neg"),
    ],
)
def test_bad_values_name_their_key(override, key):
    """(default batch_size 32 and G 8: 4 prompt groups, which 3 updates cannot share equally)"""
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.")):
        build_config(None, [override])


def test_sync_ref_model_needs_a_reference():
    with pytest.raises(ConfigError, match=r"^algo\.sync_ref_model: beta is 0"):
        build_config(None, ["algo=dapo", "algo.sync_ref_model=true"])
    assert build_config(None, ["algo=grpo", "algo.sync_ref_model=true"]).algo.sync_ref_model  # beta 0.04


def test_vllm_sampling_keywords():
    s = Sampling(16, 0.8, 0.9, top_k=5, min_p=0.05, repetition_penalty=1.2, extra={"presence_penalty": 0.3, "top_k": 9})
    kw = vllm_sampling_kwargs(s, max_tokens=16, n=4, seed=7, eos_ids={2})
    assert (kw["temperature"], kw["top_p"], kw["min_p"], kw["repetition_penalty"]) == (0.8, 0.9, 0.05, 1.2)
    assert kw["top_k"] == 9 and kw["presence_penalty"] == 0.3  # generation_kwargs go on top
    assert (kw["n"], kw["max_tokens"], kw["seed"], kw["stop_token_ids"], kw["logprobs"]) == (4, 16, 7, [2], 0)
    g = vllm_sampling_kwargs(dataclasses.replace(s, greedy=True, extra={}), max_tokens=16, n=1, seed=0, eos_ids=set())
    assert (g["temperature"], g["top_k"], g["top_p"], g["min_p"], g["repetition_penalty"]) == (0.0, 0, 1.0, 0.0, 1.2)
    assert Sampling(8, top_k=-1).filters == Filters(-1, 0.0, 1.0)


# --- chat_template_kwargs ------------------------------------------------------------------------------------


def test_chat_template_kwargs_reach_the_template(tiny_tokenizer):
    import copy

    from grpolab.model.template import chat_prompts, render, set_template_kwargs

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
        "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    )
    plain = tok.decode(chat_prompts(tok, ["hi"], None)[0])
    set_template_kwargs(tok, {"enable_thinking": False})
    assert tok.decode(chat_prompts(tok, ["hi"], None)[0]) == "[no-think]" + plain == "[no-think]hi|"
    assert render(tok, [{"role": "user", "content": "x"}], add_generation_prompt=True) == "[no-think]x|"
    cfg = build_config(None, ["chat_template_kwargs.enable_thinking=false"])
    assert cfg.chat_template_kwargs == {"enable_thinking": False}


# --- learning-rate schedules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["linear", "cosine", "constant", "constant_with_warmup"])
def test_schedules_are_transformers(name):
    """20 steps x mu 2 x steps_per_generation 2 = 80 updates, warmup_ratio 0.1 -> ceil(8.0) = 8 warm-up
    updates: the learning rate of every update equals transformers.get_scheduler's."""
    from transformers import get_scheduler

    cfg = build_config(
        None,
        ["steps=20", "algo.mu=2", "algo.steps_per_generation=2", "warmup_ratio=0.1", f"lr_scheduler={name}", "lr=1e-3"],
    )
    assert lr_updates(cfg) == {"warmup": 8, "total": 80}

    def lrs(make):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        sched = make(opt)
        out = []
        for _ in range(85):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    ours = lrs(lambda o: build_scheduler(o, cfg.lr_scheduler, **lr_updates(cfg)))
    theirs = lrs(lambda o: get_scheduler(name, o, num_warmup_steps=8, num_training_steps=80))
    assert ours == pytest.approx(theirs, abs=1e-12)
    if name == "linear":  # i / W, then (N - i) / (N - W): update 4 at half the peak, update 44 at half
        assert ours[4] == pytest.approx(5e-4) and ours[44] == pytest.approx(5e-4) and ours[80] == 0.0


def test_warmup_constant_is_the_default_and_keeps_its_numbers():
    cfg = build_config(None, ["steps=5", "warmup_steps=2", "algo.mu=2"])
    assert cfg.lr_scheduler == "warmup_constant" and lr_updates(cfg) == {"warmup": 4, "total": 10}
    # update i runs at min(1, (i + 1) / 4): 0.25, 0.5, 0.75, 1, 1, ...
    assert [SCHEDULES["warmup_constant"](i, 4, 10) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


# --- TR-DPO reference update --------------------------------------------------------------------------------


def test_mix_into_arithmetic():
    ref, pol = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[1.0, -2.0]]))
        pol.weight.copy_(torch.tensor([[3.0, 2.0]]))
    mix_into(ref, pol, 0.25)
    # 0.25 * [3, 2] + 0.75 * [1, -2] = [0.75 + 0.75, 0.5 - 1.5] = [1.5, -1.0]
    assert ref.weight.tolist() == [[1.5, -1.0]]
    assert pol.weight.tolist() == [[3.0, 2.0]]  # the policy is untouched


def test_sync_reference_every_n_updates():
    policy = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(1.0)
    ref = FrozenCopy(policy)
    with torch.no_grad():
        policy.weight.fill_(3.0)
    algo = dataclasses.replace(
        AlgoConfig(beta=0.1), sync_ref_model=True, sync_ref_model_alpha=0.5, sync_ref_model_steps=2
    )
    run = SimpleNamespace(
        cfg=SimpleNamespace(algo=algo), ref=ref, policy=policy, scheduler=SimpleNamespace(last_epoch=1)
    )
    assert sync_reference(run) == 0 and ref.frozen.weight.item() == 1.0  # update 1: not a multiple of 2
    run.scheduler.last_epoch = 2
    assert sync_reference(run) == 1 and ref.frozen.weight.item() == 2.0  # 0.5 * 3 + 0.5 * 1
    run.scheduler.last_epoch = 4
    assert sync_reference(run) == 1 and ref.frozen.weight.item() == 2.5  # 0.5 * 3 + 0.5 * 2
    restored = FrozenCopy(policy)
    restored.load_state_dict(ref.state_dict())  # what a checkpoint's reference.pt brings back
    assert restored.frozen.weight.item() == 2.5
    assert not math.isnan(ref.frozen.weight.item())
