"""Per-token log-probs and entropy: worked small examples, and completion_logp against a plain forward pass."""

from __future__ import annotations

import math

import torch

from grpolab.model.cache import left_pad, positions
from grpolab.model.logprobs import backbone, completion_logp, token_entropy, token_logp


def test_token_logp_worked_example():
    # z = [0, ln 2, ln 5]: exp(z) = [1, 2, 5], logsumexp = ln 8
    # log pi(token 2) = ln 5 - ln 8 = ln(5/8) = -0.4700;  log pi(token 0) = ln(1/8) = -2.0794
    z = torch.tensor([[[0.0, math.log(2), math.log(5)], [0.0, math.log(2), math.log(5)]]])  # (1, 2, 3)
    lp = token_logp(z, torch.tensor([[2, 0]]))
    assert lp.shape == (1, 2)
    assert torch.allclose(lp, torch.tensor([[math.log(5 / 8), math.log(1 / 8)]]), atol=1e-6)


def test_token_logp_matches_log_softmax_and_is_fp32():
    torch.manual_seed(0)
    z = torch.randn(3, 5, 11) * 4
    y = torch.randint(0, 11, (3, 5))
    ref = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    assert torch.allclose(token_logp(z, y), ref, atol=1e-6)
    # bf16 logits are upcast before the logsumexp
    out = token_logp(z.bfloat16(), y)
    assert out.dtype == torch.float32
    ref16 = torch.log_softmax(z.bfloat16().float(), -1).gather(-1, y[..., None]).squeeze(-1)
    assert torch.allclose(out, ref16, atol=1e-5)


def test_token_logp_has_the_softmax_gradient():
    # d log pi(y) / d z_v = 1[v = y] - softmax(z)_v
    z = torch.tensor([[[1.0, 2.0, 3.0]]], requires_grad=True)
    token_logp(z, torch.tensor([[0]])).sum().backward()
    p = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), -1)
    assert torch.allclose(z.grad[0, 0], torch.tensor([1.0, 0.0, 0.0]) - p, atol=1e-6)


def test_token_entropy_worked_examples():
    # uniform over 4 tokens: H = ln 4 = 1.3863
    # probabilities [1/8, 2/8, 5/8] (z = [0, ln 2, ln 5]):
    #   H = -(1/8 ln 1/8 + 2/8 ln 2/8 + 5/8 ln 5/8) = 0.2599 + 0.3466 + 0.2938 = 0.9003
    # one token with all the mass (z = [0, -1000]): H = 0
    z = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])
    assert torch.allclose(token_entropy(z), torch.tensor([[math.log(4)]]), atol=1e-6)
    z = torch.tensor([[[0.0, math.log(2), math.log(5)]]])
    h = -sum(p * math.log(p) for p in (1 / 8, 2 / 8, 5 / 8))
    assert abs(h - 0.9003) < 1e-4
    assert torch.allclose(token_entropy(z), torch.tensor([[h]]), atol=1e-6)
    assert torch.allclose(token_entropy(torch.tensor([[[0.0, -1000.0]]])), torch.zeros(1, 1), atol=1e-6)


def test_token_entropy_matches_direct_computation():
    torch.manual_seed(1)
    z = torch.randn(2, 7, 13) * 3
    p = torch.softmax(z, -1)
    ref = -(p * torch.log_softmax(z, -1)).sum(-1)
    assert torch.allclose(token_entropy(z), ref, atol=1e-5)
    assert not token_entropy(z.requires_grad_()).requires_grad  # a metric, never a graph


def test_backbone_is_the_transformer_body(tiny_model):
    assert backbone(tiny_model) is tiny_model.model


def _batch(tok, prompts, completions):
    """Left-padded prompts and right-padded completions (mask 1 on real completion tokens)."""
    p_ids = [tok(p)["input_ids"] for p in prompts]
    c_ids = [tok(c)["input_ids"] for c in completions]
    pids, pm = left_pad(p_ids, tok.pad_token_id)
    C = max(len(c) for c in c_ids)
    cids = torch.full((len(c_ids), C), tok.pad_token_id)
    cm = torch.zeros((len(c_ids), C))
    for i, c in enumerate(c_ids):
        cids[i, : len(c)] = torch.tensor(c)
        cm[i, : len(c)] = 1
    return pids, pm, cids, cm


def _reference_logp(model, pids, pm, cids, cm, temperature=1.0, with_logits=False):
    """log_softmax(model(ids).logits / T) at the completion positions, straight from transformers (and
    those logits / T, (b, C, V), with with_logits=True)."""
    ids = torch.cat([pids, cids], 1)
    mask = torch.cat([pm, cm.long()], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits.float()
    P = pids.shape[1]
    z = logits[:, P - 1 : -1] / temperature  # (b, C, V): logits at t predict t+1
    lp = torch.log_softmax(z, -1)
    return (lp.gather(-1, cids[..., None]).squeeze(-1), lp) + ((z,) if with_logits else ())


def fp32_tolerance(model, logits: torch.Tensor) -> float:
    """How far two fp32 computations of the same log-probs or entropies (different kernels, vector widths:
    AVX2 adds 8 lanes where AVX-512 adds 16) may differ, relative to the largest logit |z|: each logit
    is a dot product over the hidden size K, rounded to within K eps |z| (Higham's gamma_K), and the
    log-sum-exp and the entropy add V terms pairwise (log2 V eps):  tol = (K + log2 V) eps max|z|.
    For the lively tiny model (K = 32, V = 49,152, max|z| about 27) that is 1.5e-4."""
    K, V = model.config.hidden_size, logits.shape[-1]
    return (K + math.log2(V)) * torch.finfo(torch.float32).eps * logits.abs().max().item()


def test_completion_logp_equals_full_forward_left_padded(lively_model, tiny_tokenizer):
    tok = tiny_tokenizer
    pids, pm, cids, cm = _batch(
        tok,
        ["What is 2+3?", "Hi", "A much longer prompt, with several more tokens."],
        ["5", "Hello there, friend", "ok then"],
    )
    assert (pm == 0).any() and (cm == 0).any()  # both kinds of padding present
    with torch.no_grad():
        lp, ent = completion_logp(lively_model, pids, pm, cids, cm, with_entropy=True)
        ref, ref_full, logits = _reference_logp(lively_model, pids, pm, cids, cm, with_logits=True)
    assert lp.shape == ent.shape == cids.shape
    m = cm.bool()
    tol = fp32_tolerance(lively_model, logits[m])
    assert (lp[m] - ref[m]).abs().max() <= tol
    ref_ent = -(ref_full.exp() * ref_full).sum(-1)
    assert (ent[m] - ref_ent[m]).abs().max() <= tol


def test_completion_logp_temperature(lively_model, tiny_tokenizer):
    pids, pm, cids, cm = _batch(tiny_tokenizer, ["Hi", "What is 2+3?"], ["yes", "5 it is"])
    with torch.no_grad():
        lp, _ = completion_logp(lively_model, pids, pm, cids, cm, temperature=0.7)
        ref, _, z = _reference_logp(lively_model, pids, pm, cids, cm, temperature=0.7, with_logits=True)
    m = cm.bool()
    assert (lp[m] - ref[m]).abs().max() <= fp32_tolerance(lively_model, z[m])


def test_completion_logp_does_not_depend_on_padding(lively_model, tiny_tokenizer):
    """A row's log-probs are the same alone and inside a padded batch."""
    tok = tiny_tokenizer
    batch = _batch(tok, ["Hi", "A much longer prompt, with several more tokens."], ["Hello there, friend", "ok"])
    alone = _batch(tok, ["Hi"], ["Hello there, friend"])
    with torch.no_grad():
        lp_b, _ = completion_logp(lively_model, *batch)
        lp_a, _ = completion_logp(lively_model, *alone)
    L = int(alone[3].sum())
    assert torch.allclose(lp_b[0, :L], lp_a[0, :L], atol=1e-5)


def test_completion_logp_gradient_flows(tiny_model, tiny_tokenizer):
    # Several tokens on each side: a one-token prompt predicting a one-token completion attends to one
    # key only, where the exact gradient of the queries is 0 (sdpa's kernel gave 1e-8 of rounding there).
    pids, pm, cids, cm = _batch(tiny_tokenizer, ["Hi there, how are you?"], ["Hello, I am fine"])
    lp, ent = completion_logp(tiny_model, pids, pm, cids, cm)
    assert ent is None and lp.requires_grad
    (lp * cm).sum().backward()
    assert tiny_model.model.embed_tokens.weight.grad is not None
    assert tiny_model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
