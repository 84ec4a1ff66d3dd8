"""Rollout engine on the tiny model: greedy equals HF generate, groups, sampling log-probs, EOS and
truncation, nucleus sampling, determinism, and the Rollout helpers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from grpolab.batch import Rollout, concat_rollouts
from grpolab.engine.native.generate import eos_token_ids, generate
from grpolab.engine.native.sampling import sample_token
from grpolab.model.cache import left_pad, positions
from grpolab.model.logprobs import completion_logp
from grpolab.model.template import chat_prompts

PROMPTS = ["What is 2+3?", "Hi", "Compute 17 * 23 and explain every step carefully.", "Name a colour.", "x"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' past_key_values rename notice
        yield


@pytest.fixture()
def prompt_ids(tiny_tokenizer):
    ids = chat_prompts(tiny_tokenizer, PROMPTS, None)
    assert len({len(x) for x in ids}) > 1  # different lengths: the batch is really left-padded
    return ids


def eos_hook(model, eos_id: int, p: float):
    """Make EOS have probability `p` at every position (at temperature 1), by a hook on the LM head.

    With S = sum of exp(logits) over the other tokens, setting z_eos = log S + log(p / (1 - p)) gives
    softmax(z)_eos = p. The hook also applies inside logprobs.completion_logp (same lm_head module).
    """

    def hook(mod, inp, out):
        others = out.clone()
        others[..., eos_id] = float("-inf")
        out = out.clone()
        out[..., eos_id] = torch.logsumexp(others, -1) + math.log(p / (1 - p))
        return out

    return model.lm_head.register_forward_hook(hook)


def hf_greedy(model, tok, ids, max_new_tokens):
    p, pm = left_pad(ids, tok.pad_token_id)
    out = model.generate(
        input_ids=p,
        attention_mask=pm,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return out[:, p.shape[1] :]


def check_masks(ro: Rollout, eos: set[int], max_new_tokens: int):
    """Invariants of every rollout: mask is a prefix of ones, it ends at the first EOS (EOS included) or
    at max_new_tokens (then truncated), and everything after is padding with log-prob 0."""
    N, C = ro.completion_ids.shape
    assert C <= max_new_tokens
    for i in range(N):
        m = ro.completion_mask[i]
        L = int(m.sum())
        assert L >= 1
        assert torch.equal(m[:L], torch.ones(L)) and torch.equal(m[L:], torch.zeros(C - L))
        toks = ro.completion_ids[i, :L].tolist()
        eos_at = [t for t, x in enumerate(toks) if x in eos]
        if ro.truncated[i]:
            assert L == max_new_tokens and not eos_at
        else:
            assert eos_at == [L - 1]  # the first (and only) EOS is the last real token
        assert torch.all(ro.sample_logp[i, L:] == 0)
        assert torch.all(ro.sample_logp[i, :L] <= 0)


# --- greedy decoding equals transformers' generate --------------------------------------------------


def test_greedy_equals_hf_generate(lively_model, tiny_tokenizer, prompt_ids):
    ro = generate(lively_model, tiny_tokenizer, prompt_ids, G=1, max_new_tokens=10, greedy=True)
    ref = hf_greedy(lively_model, tiny_tokenizer, prompt_ids, 10)
    assert ro.completion_ids.shape == ref.shape == (len(PROMPTS), 10)
    assert torch.equal(ro.completion_ids, ref)
    assert len({tuple(r) for r in ro.completion_ids.tolist()}) == len(PROMPTS)  # a meaningful comparison
    assert ro.truncated.all()


def test_greedy_equals_hf_generate_when_rows_finish_early(lively_model, tiny_tokenizer, prompt_ids):
    """Finished rows leave the KV cache mid-decode; the rows still running must be unaffected."""
    eos = tiny_tokenizer.eos_token_id
    eos_hook(lively_model, eos, 0.15)  # measured: rows end after 1, 3, 4, 5 tokens; one runs to the limit
    ro = generate(lively_model, tiny_tokenizer, prompt_ids, G=1, max_new_tokens=10, greedy=True)
    ref = hf_greedy(lively_model, tiny_tokenizer, prompt_ids, 10)
    lengths = ro.lengths.tolist()
    assert min(lengths) < max(lengths) == 10, lengths  # mixed: some finished, one did not
    C = ro.completion_ids.shape[1]
    assert torch.equal(ro.completion_ids, ref[:, :C])  # HF pads finished rows with pad (= EOS here)
    check_masks(ro, {eos}, 10)


def test_left_padded_batch_equals_each_prompt_alone(lively_model, tiny_tokenizer, prompt_ids):
    batch = generate(lively_model, tiny_tokenizer, prompt_ids, G=1, max_new_tokens=6, greedy=True)
    for i, ids in enumerate(prompt_ids[:3]):
        alone = generate(lively_model, tiny_tokenizer, [ids], G=1, max_new_tokens=6, greedy=True)
        assert alone.completion_ids[0].tolist() == batch.completion_ids[i].tolist()
        assert torch.allclose(alone.sample_logp[0], batch.sample_logp[i], atol=1e-4)


# --- groups -----------------------------------------------------------------------------------------


def test_G_copies_per_prompt_grouped_contiguously(lively_model, tiny_tokenizer, prompt_ids):
    G = 3
    ro = generate(
        lively_model, tiny_tokenizer, prompt_ids, G=G, max_new_tokens=5, generator=torch.Generator().manual_seed(0)
    )
    B = len(prompt_ids)
    assert ro.G == G and ro.completion_ids.shape[0] == B * G and len(ro.texts) == B * G
    P = ro.prompt_ids.shape[1]
    for b, ids in enumerate(prompt_ids[:3]):
        for j in range(G):
            row = b * G + j
            assert ro.prompt_ids[row, P - len(ids) :].tolist() == ids
            assert ro.prompt_mask[row].sum() == len(ids)
    # samples within a group differ (the groups are not G copies of one sample)
    first = ro.completion_ids[:G]
    assert len({tuple(r) for r in first.tolist()}) > 1


def test_greedy_group_copies_are_identical(lively_model, tiny_tokenizer, prompt_ids):
    ro = generate(lively_model, tiny_tokenizer, prompt_ids[:2], G=3, max_new_tokens=5, greedy=True)
    single = generate(lively_model, tiny_tokenizer, prompt_ids[:2], G=1, max_new_tokens=5, greedy=True)
    for b in range(2):
        for j in range(3):
            assert ro.completion_ids[b * 3 + j].tolist() == single.completion_ids[b].tolist()


# --- sampling log-probs -----------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sample_logp_equals_recomputed_logp(lively_model, tiny_tokenizer, prompt_ids, temperature):
    """The log-prob recorded while sampling = log_softmax(logits / T) at the sampled token, recomputed in
    one full fp32 pass by logprobs.completion_logp (this checks the KV cache, padding and positions)."""
    eos = tiny_tokenizer.eos_token_id
    eos_hook(lively_model, eos, 0.1)  # some rows finish early and leave the batch
    ro = generate(
        lively_model,
        tiny_tokenizer,
        prompt_ids[:3],
        G=4,
        max_new_tokens=8,
        temperature=temperature,
        generator=torch.Generator().manual_seed(1),
    )
    assert ro.truncated.any() and (~ro.truncated).any()
    with torch.no_grad():
        lp, _ = completion_logp(
            lively_model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, temperature=temperature
        )
    m = ro.completion_mask.bool()
    assert torch.allclose(ro.sample_logp[m], lp[m], atol=1e-4), (ro.sample_logp[m] - lp[m]).abs().max()
    check_masks(ro, {eos}, 8)


# --- EOS, masks, truncation -------------------------------------------------------------------------


def test_completion_mask_ends_at_eos_and_truncation_flags(lively_model, tiny_tokenizer, prompt_ids):
    eos = tiny_tokenizer.eos_token_id
    eos_hook(lively_model, eos, 0.2)
    ro = generate(
        lively_model, tiny_tokenizer, prompt_ids, G=4, max_new_tokens=6, generator=torch.Generator().manual_seed(0)
    )
    check_masks(ro, {eos}, 6)
    n_trunc = int(ro.truncated.sum())
    assert 0 < n_trunc < len(ro.truncated)  # both kinds present (P(no EOS in 6) = 0.8^6 = 0.26)
    # texts: the masked tokens decoded without special tokens (so without the EOS)
    for i, text in enumerate(ro.texts):
        L = int(ro.lengths[i])
        assert text == tiny_tokenizer.decode(ro.completion_ids[i, :L].tolist(), skip_special_tokens=True)
    # the width is the longest completion, no wider
    assert ro.completion_ids.shape[1] == int(ro.lengths.max())


def test_every_row_ends_at_once(lively_model, tiny_tokenizer, prompt_ids):
    eos = tiny_tokenizer.eos_token_id
    eos_hook(lively_model, eos, 1 - 1e-9)
    ro = generate(
        lively_model, tiny_tokenizer, prompt_ids, G=2, max_new_tokens=8, generator=torch.Generator().manual_seed(0)
    )
    assert ro.completion_ids.shape == (2 * len(PROMPTS), 1)
    assert (ro.completion_ids == eos).all() and (ro.completion_mask == 1).all()
    assert not ro.truncated.any()
    assert ro.texts == [""] * (2 * len(PROMPTS))


def test_extra_eos_ids_end_completions(lively_model, tiny_tokenizer, prompt_ids):
    """Any id in eos_ids ends a row: make token 198 ('\\n') the stop token."""
    eos_hook(lively_model, 198, 0.2)
    ro = generate(
        lively_model,
        tiny_tokenizer,
        prompt_ids[:3],
        G=3,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(0),
        eos_ids={tiny_tokenizer.eos_token_id, 198},
    )
    assert (~ro.truncated).any()
    check_masks(ro, {tiny_tokenizer.eos_token_id, 198}, 6)


def test_max_new_tokens_one(lively_model, tiny_tokenizer, prompt_ids):
    ro = generate(
        lively_model, tiny_tokenizer, prompt_ids, G=2, max_new_tokens=1, generator=torch.Generator().manual_seed(0)
    )
    assert ro.completion_ids.shape == (2 * len(PROMPTS), 1)
    check_masks(ro, {tiny_tokenizer.eos_token_id}, 1)


def test_generate_restores_training_mode_and_builds_no_graph(lively_model, tiny_tokenizer, prompt_ids):
    lively_model.train()
    ro = generate(
        lively_model, tiny_tokenizer, prompt_ids[:2], G=2, max_new_tokens=3, generator=torch.Generator().manual_seed(0)
    )
    assert lively_model.training
    assert not ro.sample_logp.requires_grad
    assert ro.completion_ids.dtype == torch.long and ro.completion_mask.dtype == torch.float32
    assert ro.truncated.dtype == torch.bool


# --- determinism ------------------------------------------------------------------------------------


def test_seeded_generator_is_deterministic(lively_model, tiny_tokenizer, prompt_ids):
    def run(seed):
        return generate(
            lively_model,
            tiny_tokenizer,
            prompt_ids[:3],
            G=2,
            max_new_tokens=5,
            temperature=1.0,
            top_p=1.0,
            generator=torch.Generator().manual_seed(seed),
        )

    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sample_logp, b.sample_logp)
    assert a.texts == b.texts
    assert not torch.equal(a.completion_ids, c.completion_ids)


# --- sample_token on handmade logits ----------------------------------------------------------------


def _logits(probs):
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def test_sample_token_nucleus_never_leaves_the_nucleus():
    # p = [0.5, 0.3, 0.15, 0.05]; top_p = 0.7: cumulative 0.5 < 0.7, 0.8 >= 0.7 -> nucleus {0, 1}
    # renormalised: 0.5 / 0.8 = 0.625, 0.3 / 0.8 = 0.375
    logits = _logits([0.5, 0.3, 0.15, 0.05]).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    tok, lp = sample_token(logits, 1.0, 0.7, False, g)
    assert set(tok.tolist()) == {0, 1}
    assert torch.allclose(lp[tok == 0], torch.tensor(math.log(0.625)), atol=1e-5)
    assert torch.allclose(lp[tok == 1], torch.tensor(math.log(0.375)), atol=1e-5)
    frac0 = float((tok == 0).float().mean())
    assert abs(frac0 - 0.625) < 0.04  # 4000 draws: std 0.008


def test_sample_token_nucleus_keeps_the_token_that_crosses_top_p():
    # top_p = 0.85: 0.5, 0.8 < 0.85, then 0.95 -> nucleus {0, 1, 2}, renormalised by 0.95
    logits = _logits([0.5, 0.3, 0.15, 0.05]).repeat(4000, 1)
    tok, lp = sample_token(logits, 1.0, 0.85, False, torch.Generator().manual_seed(1))
    assert set(tok.tolist()) == {0, 1, 2}
    assert torch.allclose(lp[tok == 2], torch.tensor(math.log(0.15 / 0.95)), atol=1e-5)
    # a tiny top_p keeps only the most likely token
    tok, lp = sample_token(logits[:100], 1.0, 0.01, False, torch.Generator().manual_seed(2))
    assert (tok == 0).all() and torch.allclose(lp, torch.zeros(100), atol=1e-6)


def test_sample_token_nucleus_per_row_on_shuffled_vocab():
    """Rows are independent and the nucleus follows the probabilities, not the token order."""
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    g = torch.Generator().manual_seed(3)
    probs = logits.softmax(-1)
    for _ in range(20):
        tok, _ = sample_token(logits, 1.0, 0.6, False, g)
        # the drawn token starts inside the top-0.6 mass: the tokens more likely than it hold < 0.6
        mass_above = (probs * (probs > probs.gather(-1, tok[:, None]))).sum(-1)  # (64,)
        assert (mass_above < 0.6 + 1e-6).all()


def test_sample_token_temperature_and_greedy():
    z = torch.tensor([[2.0, 1.0, 0.0]])
    # greedy: argmax, with the log-prob of the (T-scaled) distribution
    tok, lp = sample_token(z, 2.0, 1.0, True, None)
    assert tok.tolist() == [0]
    # T = 2: softmax([1, 0.5, 0]) -> logp_0 = 1 - log(e + e^0.5 + 1) = 1 - 1.7534 = -0.7534
    assert torch.allclose(lp, torch.tensor([1 - math.log(math.e + math.exp(0.5) + 1)]), atol=1e-5)
    # sampled log-probs equal log_softmax(z / T) at the drawn token
    zz = z.repeat(1000, 1)
    tok, lp = sample_token(zz, 0.5, 1.0, False, torch.Generator().manual_seed(0))
    assert torch.allclose(lp, torch.log_softmax(zz / 0.5, -1).gather(-1, tok[:, None]).squeeze(-1))
    # low temperature concentrates mass: p_0 at T = 0.5 is 0.867
    assert float((tok == 0).float().mean()) > 0.8


def test_sample_token_seeded_draws_repeat():
    z = torch.randn(8, 100)
    a = sample_token(z, 1.0, 0.9, False, torch.Generator().manual_seed(5))
    b = sample_token(z, 1.0, 0.9, False, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --- padding helpers --------------------------------------------------------------------------------


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions(mask).tolist() == [[0, 1, 2], [0, 0, 0]]
    # positions continue across a completion appended on the right
    full = torch.cat([mask, torch.tensor([[1, 1], [1, 0]])], 1)
    assert positions(full).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 1]]


def test_chat_prompts_use_the_template(tiny_tokenizer):
    [ids] = chat_prompts(tiny_tokenizer, ["2+3?"], None)
    text = tiny_tokenizer.decode(ids)
    assert "<|im_start|>user\n2+3?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    [ids] = chat_prompts(tiny_tokenizer, ["2+3?"], "Answer briefly.")
    text = tiny_tokenizer.decode(ids)
    assert "<|im_start|>system\nAnswer briefly.<|im_end|>" in text


def test_eos_token_ids_include_generation_config(tiny_model, tiny_tokenizer):
    assert eos_token_ids(tiny_model, tiny_tokenizer) == {tiny_tokenizer.eos_token_id}
    tiny_model.generation_config.eos_token_id = [tiny_tokenizer.eos_token_id, 0]
    assert eos_token_ids(tiny_model, tiny_tokenizer) == {tiny_tokenizer.eos_token_id, 0}


# --- Rollout.select and concat_rollouts -------------------------------------------------------------


def _rollout(P, C, lengths, G, pad=2, base=100):
    N = len(lengths)
    pids = torch.full((N, P), pad)
    pm = torch.zeros((N, P), dtype=torch.long)
    for i in range(N):
        pids[i, 1:] = base + i
        pm[i, 1:] = 1
    cids = torch.full((N, C), pad)
    cm = torch.zeros((N, C))
    lp = torch.zeros((N, C))
    for i, L in enumerate(lengths):
        cids[i, :L] = base + 10 + i
        cm[i, :L] = 1
        lp[i, :L] = -0.5 - i
    trunc = torch.tensor([L == C for L in lengths])
    return Rollout(pids, pm, cids, cm, lp, trunc, [f"t{base + i}" for i in range(N)], G)


def test_select_keeps_rows_consistent():
    ro = _rollout(4, 3, [3, 1, 2, 3], G=2)
    sub = ro.select(torch.tensor([2, 3]))
    assert sub.G == 2 and sub.texts == ["t102", "t103"]
    assert torch.equal(sub.completion_ids, ro.completion_ids[2:])
    assert torch.equal(sub.prompt_mask, ro.prompt_mask[2:])
    assert torch.equal(sub.sample_logp, ro.sample_logp[2:])
    assert sub.truncated.tolist() == [False, True]
    assert sub.lengths.tolist() == [2.0, 3.0]


def test_concat_rollouts_pads_prompts_left_and_completions_right():
    a = _rollout(P=3, C=2, lengths=[2, 2], G=2, base=100)  # both rows truncated: no pad in row 0
    b = _rollout(P=5, C=4, lengths=[1, 4], G=2, base=200)
    c = concat_rollouts([a, b])
    assert c.G == 2 and c.texts == ["t100", "t101", "t200", "t201"]
    assert c.prompt_ids.shape == (4, 5) and c.completion_ids.shape == (4, 4)
    # a's prompts moved right (left padding grew), its masks follow
    assert c.prompt_ids[0].tolist() == [2, 2, 2, 100, 100]
    assert c.prompt_mask[0].tolist() == [0, 0, 0, 1, 1]
    # a's completions got right padding with the pad id, mask 0 and log-prob 0
    assert c.completion_ids[0].tolist() == [110, 110, 2, 2]
    assert c.completion_mask[0].tolist() == [1, 1, 0, 0]
    assert c.sample_logp[0].tolist() == [-0.5, -0.5, 0.0, 0.0]
    assert torch.equal(c.completion_ids[2:], b.completion_ids)
    assert torch.equal(c.prompt_ids[2:], b.prompt_ids)
    assert c.truncated.tolist() == [True, True, False, True]
    assert c.lengths.tolist() == [2.0, 2.0, 1.0, 4.0]
    # an explicit pad id wins
    assert concat_rollouts([a, b], pad_id=0).completion_ids[0].tolist() == [110, 110, 0, 0]


def test_bf16_autocast_rollout(lively_model, tiny_tokenizer, prompt_ids):
    """precision=auto picks bf16 autocast on CPUs with bf16 instructions: the rollout stays well formed,
    its weights stay fp32, and its log-probs stay close to an fp32 recomputation."""
    eos = tiny_tokenizer.eos_token_id
    eos_hook(lively_model, eos, 0.15)
    ro = generate(
        lively_model,
        tiny_tokenizer,
        prompt_ids[:3],
        G=2,
        max_new_tokens=5,
        autocast_dtype=torch.bfloat16,
        generator=torch.Generator().manual_seed(0),
    )
    check_masks(ro, {eos}, 5)
    assert ro.sample_logp.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in lively_model.parameters())
    with torch.no_grad():
        lp, _ = completion_logp(lively_model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    m = ro.completion_mask.bool()
    assert (ro.sample_logp[m] - lp[m]).abs().max() < 0.5  # bf16 rounding, not a different distribution
