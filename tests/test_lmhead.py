"""The chunked LM head + log-softmax (grpolab.model.lmhead): same values and gradients as the plain head,
a worked example of its backward, and no full (positions x vocabulary) tensor kept for the backward."""

from __future__ import annotations

import math

import pytest
import torch
from e2e_helpers import padded_sequences

from grpolab.model.lmhead import chunked_token_logp, plain_head_weight, rows_per_chunk
from grpolab.model.logprobs import completion_logp, token_entropy, token_logp


def plain(h, w, y, T):
    logits = torch.nn.functional.linear(h, w)
    if T != 1.0:
        logits = logits / T
    return token_logp(logits, y), token_entropy(logits)


def case(seed=0, b=3, C=7, H=16, V=50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(b, C, H, generator=g).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.5).requires_grad_()
    y = torch.randint(0, V, (b, C), generator=g)
    upstream = torch.randn(b, C, generator=g)
    return h, w, y, upstream


def grads(fn, h, w, upstream):
    h.grad = w.grad = None
    logp, ent = fn()
    (logp * upstream).sum().backward()
    return logp.detach(), ent, h.grad.clone(), w.grad.clone()


def test_rows_per_chunk_holds_the_budget():
    assert rows_per_chunk(49152) == (1 << 24) // 49152 == 341  # 341 * 49152 fp32 logits = 64 MB
    assert rows_per_chunk(10, budget=25) == 2
    assert rows_per_chunk(10**9) == 1


@pytest.mark.parametrize("T", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, 21, 1000])  # 21 positions: chunks of 1, a remainder, exact, one chunk
def test_fp32_values_and_gradients_match_the_plain_head(T, chunk):
    h, w, y, up = case()
    ours = grads(lambda: chunked_token_logp(h, w, y, temperature=T, with_entropy=True, chunk=chunk), h, w, up)
    ref = grads(lambda: plain(h, w, y, T), h, w, up)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=2e-6, rtol=1e-5), (a - b).abs().max()


def test_bf16_autocast_gives_the_plain_heads_log_probs():
    # Same matmul dtype, logits rounded to bf16 as a plain lm_head(h) under autocast, then fp32 log-softmax:
    # equal log-probs and input gradients. The weight gradient is accumulated over chunks in fp32 (the plain
    # head's one bf16 product rounds it once more): agreement within 1% of its largest entry.
    h, w, y, up = case(1, V=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = grads(lambda: chunked_token_logp(h, w, y, with_entropy=True, chunk=5), h, w, up)
        ref = grads(lambda: plain(h, w, y, 1.0), h, w, up)
    assert ours[0].dtype == torch.float32
    assert torch.equal(ours[0], ref[0])
    assert torch.allclose(ours[1], ref[1], atol=1e-4)
    assert torch.equal(ours[2], ref[2])
    assert (ours[3] - ref[3]).abs().max() <= 0.01 * ref[3].abs().max()


def test_worked_backward():
    # one position, H = 1, w = [0, ln2, ln5]^T, h = 1: z = [0, ln 2, ln 5], p = [1/8, 2/8, 5/8]
    # d log pi(y=2) / dz = onehot(2) - p = [-1/8, -2/8, 3/8]
    # d/dh = sum_v dz_v w_v = -2/8 ln2 + 3/8 ln5 ; d/dw_v = dz_v * h
    h = torch.ones(1, 1, 1, requires_grad=True)
    w = torch.tensor([[0.0], [math.log(2)], [math.log(5)]], requires_grad=True)
    logp, _ = chunked_token_logp(h, w, torch.tensor([[2]]))
    assert logp.item() == pytest.approx(math.log(5 / 8), abs=1e-6)
    logp.sum().backward()
    assert h.grad.item() == pytest.approx(-2 / 8 * math.log(2) + 3 / 8 * math.log(5), abs=1e-6)
    assert w.grad.squeeze(-1).tolist() == pytest.approx([-1 / 8, -2 / 8, 3 / 8], abs=1e-6)


def test_no_full_logits_are_kept_for_the_backward():
    # Record every tensor autograd saves: the plain head keeps (M, V)-sized logits (and more); the chunked
    # one keeps h, w, the targets and one log-sum-exp per position.
    h, w, y, _ = case(2, b=4, C=16, V=400)
    M, V = 4 * 16, 400
    for fn, expect_full in (
        (lambda: plain(h, w, y, 1.0), True),
        (lambda: chunked_token_logp(h, w, y, chunk=8, keep_bytes=0), False),
    ):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            fn()[0].sum()
        assert (max(sizes) >= M * V) is expect_full, sizes


def test_completion_logp_on_the_tiny_model_equals_the_plain_head(tiny_model, monkeypatch):
    import grpolab.model.logprobs as lp_mod

    assert plain_head_weight(tiny_model) is tiny_model.lm_head.weight  # tied to the embeddings
    p_ids, p_mask, c_ids, c_mask = padded_sequences(
        tiny_model.config.vocab_size, (2, 5), (2, 6), 3, pad=(0, 2), cut=(1, 4)
    )
    ours = completion_logp(tiny_model, p_ids, p_mask, c_ids, c_mask, temperature=0.9, with_entropy=True)
    monkeypatch.setattr(lp_mod, "plain_head_weight", lambda model: None)
    ref = completion_logp(tiny_model, p_ids, p_mask, c_ids, c_mask, temperature=0.9, with_entropy=True)
    assert torch.allclose(ours[0], ref[0], atol=1e-5)
    assert torch.allclose(ours[1], ref[1], atol=1e-4)


def test_a_hooked_head_takes_the_plain_path_so_the_hook_sees_its_output(tiny_model):
    assert plain_head_weight(tiny_model) is not None
    handle = tiny_model.lm_head.register_forward_hook(lambda mod, inp, out: out)
    assert plain_head_weight(tiny_model) is None
    handle.remove()
    assert plain_head_weight(tiny_model) is not None


def test_a_head_with_a_bias_takes_the_plain_path(tiny_model):
    head = torch.nn.Linear(4, 9, bias=True)
    tiny_model.set_output_embeddings(head)
    assert plain_head_weight(tiny_model) is None


def test_kept_logits_give_the_recomputed_numbers_in_fp32():
    # Under the budget the forward keeps the (M, V) logits and the backward reads them instead of
    # recomputing: the same products on the same inputs, so bit for bit the same values and gradients.
    h, w, y, up = case(4, b=3, C=9, V=70)
    for T in (1.0, 0.7):
        kept = grads(lambda: chunked_token_logp(h, w, y, temperature=T, with_entropy=True, chunk=4), h, w, up)
        again = grads(
            lambda: chunked_token_logp(h, w, y, temperature=T, with_entropy=True, chunk=4, keep_bytes=0), h, w, up
        )
        for a, b in zip(kept, again):
            assert torch.equal(a, b)


def test_kept_logits_in_bf16_give_the_plain_heads_numbers():
    # bf16 with kept logits: the backward's products run once over every position, as a plain head's
    # backward does, so log-probs, input gradients and (within one bf16 rounding) weight gradients agree.
    h, w, y, up = case(5, V=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = grads(lambda: chunked_token_logp(h, w, y, with_entropy=True, chunk=5), h, w, up)
        ref = grads(lambda: plain(h, w, y, 1.0), h, w, up)
    assert torch.equal(ours[0], ref[0])
    assert torch.equal(ours[2], ref[2])
    assert (ours[3] - ref[3]).abs().max() <= 2**-7 * ref[3].abs().max()


def test_logits_are_kept_only_under_the_budget_and_only_for_a_backward():
    from grpolab.model.lmhead import keeps_logits

    assert keeps_logits(16 * 128, 49152, torch.bfloat16)  # 201 MB: setting (b) of the bench keeps them
    assert not keeps_logits(16 * 8 * 256, 151936, torch.bfloat16)  # 10 GB: recomputed
    assert keeps_logits(10, 5, torch.float32, budget=200) and not keeps_logits(10, 5, torch.float32, budget=199)
    h, w, y, _ = case(6, b=3, C=8, V=100)
    M, V = 24, 100  # (h is 24 x 16, w 100 x 16)
    for kwargs, expect_kept in (({}, True), ({"keep_bytes": M * V * 4 - 1}, False)):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            chunked_token_logp(h, w, y, chunk=4, **kwargs)[0].sum()
        assert (M * V in sizes) is expect_kept, sizes
    with torch.no_grad():  # no backward: nothing kept, nothing allocated for it
        logp, _ = chunked_token_logp(h, w, y, chunk=4)
    assert torch.allclose(logp, chunked_token_logp(h, w, y, chunk=4, keep_bytes=0)[0])


def test_a_second_backward_through_kept_logits_is_refused():
    # The backward writes dz over the kept bf16 logits; a second backward of the same pass would read
    # dz as logits, so autograd's version check must stop it with an error instead.
    h, w, y, _ = case(7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = chunked_token_logp(h, w, y, chunk=4)
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logp.sum().backward()


def test_the_entropy_over_a_real_vocabulary_is_within_pairwise_summation_rounding():
    """H_t sums V = 49,152 terms p_v (z_v - max z): added pairwise (torch's sum) the rounding grows as
    log2(V) eps relative to the terms' magnitude (|z| <= z_max), and the logits, K-term dot products, carry
    K eps z_max each (Higham's gamma_K), so against fp64:  |H - H_64| <= (K + log2 V) eps z_max. A dot product
    added in sequence (V eps) was 1e-4 off for entropies of 3.5, beyond this bound."""
    K, V = 8, 49152
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(4, 16, K, generator=g) * 2.0, torch.randn(V, K, generator=g) * 1.5
    y = torch.randint(0, V, (4, 16), generator=g)
    _, ent = chunked_token_logp(h, w, y, with_entropy=True)
    z64 = torch.nn.functional.linear(h.double(), w.double())
    lp64 = torch.log_softmax(z64, -1)
    h64 = -(lp64.exp() * lp64).sum(-1)
    bound = (K + math.log2(V)) * torch.finfo(torch.float32).eps * z64.abs().max().item()
    assert (ent.double() - h64).abs().max().item() <= bound
