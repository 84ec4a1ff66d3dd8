"""NEFTune (neftune_alpha; TRL's neftune_noise_alpha): the noise is transformers' (the same draws from the same
seed), its magnitude is alpha / sqrt(L d) (a statistical check with its tolerance), and a run adds it in the
update's passes only: never in the rollout, the reference's pass or the evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.model import neftune
from grpolab.model.neftune import add_neftune_noise, neftune_magnitude, noisy_embeddings


def test_the_noise_is_transformers_draw_for_draw():
    """transformers' hook, on a module in training mode, against add_neftune_noise with L = the sequence's
    length: the same numbers from the same seed (float32 rounding of m aside)."""
    from transformers.integrations.neftune import neftune_post_forward_hook

    emb = torch.nn.Embedding(50, 24)
    emb.neftune_noise_alpha = 5.0
    ids = torch.randint(0, 50, (3, 7))
    clean = emb(ids).detach()
    torch.manual_seed(1)
    theirs = neftune_post_forward_hook(emb.train(), (ids,), clean)
    torch.manual_seed(1)
    ours = add_neftune_noise(clean, 5.0, 7)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-6) and not torch.equal(ours, clean)
    assert torch.equal(neftune_post_forward_hook(emb.eval(), (ids,), clean), clean)  # eval mode: none, as ours


def test_the_noise_is_uniform_with_bound_alpha_over_sqrt_l_d():
    """u ~ U(-m, m), m = alpha / sqrt(L d) = 8 / sqrt(256 x 1024) = 1/64. Over n = 2^20 draws: every |u| <= m
    exactly; E u = 0 within 5 standard errors (m / sqrt(3 n)); E u^2 = m^2 / 3 within 1% (its relative
    standard error is sqrt(0.8 / n) = 0.09%, so 1% is about 11 of them)."""
    torch.manual_seed(0)
    L, d, alpha = 256, 1024, 8.0
    m = neftune_magnitude(alpha, L, d)
    assert m == pytest.approx(1 / 64)
    u = add_neftune_noise(torch.zeros(4, L, d), alpha, L)  # (4, L, d): 2^20 draws
    n = u.numel()
    assert float(u.abs().max()) <= m
    assert abs(float(u.mean())) < 5 * m / math.sqrt(3 * n)
    assert float(u.pow(2).mean()) == pytest.approx(m * m / 3, rel=0.01)
    base = torch.randn(4, L, d)  # the noise does not depend on the embeddings it is added to
    torch.manual_seed(0)
    assert torch.allclose(add_neftune_noise(base, alpha, L) - base, u, atol=1e-6)


@torch.no_grad()
def test_the_context_noises_only_while_open_and_with_the_given_length(tiny_model):
    ids = torch.randint(0, 100, (2, 5))
    clean = tiny_model.get_input_embeddings()(ids)
    with noisy_embeddings(tiny_model, None, 5):
        assert torch.equal(tiny_model.get_input_embeddings()(ids), clean)  # off
    seen = []
    with noisy_embeddings(tiny_model, 5.0, 40):
        noised = tiny_model.get_input_embeddings()(ids)
        seen.append(float((noised - clean).abs().max()))
    assert 0 < seen[0] <= neftune_magnitude(5.0, 40, clean.shape[-1])  # L = 40, not the 5 of this call
    assert torch.equal(tiny_model.get_input_embeddings()(ids), clean)  # the hook is gone


def test_a_run_noises_the_update_passes_only(tiny_model_dir, tmp_path, monkeypatch, varied_reward):
    """A run with a reference (beta > 0), two parts per generation (a no-grad log pi_old pass of the policy
    before the updates), two epochs and an evaluation: every noised lookup is in a pass with gradients (the
    update's micro-batches: prompt and completions, two lookups each), none in the rollout, the reference's
    pass, the pre-update log pi_old pass or the evaluation; L is the pass's prompt + completion width."""
    from grpolab.app.cli import main

    calls = []
    real = neftune.add_neftune_noise

    def spy(embeds, alpha, length):
        calls.append((torch.is_grad_enabled(), alpha, length, embeds.shape[1]))
        return real(embeds, alpha, length)

    monkeypatch.setattr(neftune, "add_neftune_noise", spy)
    out = tmp_path / "run"
    settings = [
        "steps=1",
        "batch_size=8",
        "G=4",
        "micro_batch=4",
        "max_new_tokens=5",
        "eval_size=2",
        "algo.beta=0.04",
        "algo.mu=2",
        "algo.steps_per_generation=2",
        "top_p=0.9",  # a filtered sampler: log pi_old of the second part needs a no-grad pass
        "neftune_alpha=5",
        "progress=false",
        "tensorboard=false",
        "report=false",
        "rewards=[{name: test_varied}]",
    ]
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *settings]) == 0
    # 2 epochs x 2 parts x 1 micro-batch of one group, each pass two lookups (the prompt, the completions)
    assert len(calls) == 2 * 2 * 2
    assert all(grad and alpha == 5.0 for grad, alpha, _, _ in calls)
    for (_, _, length, prompt_width), (_, _, length2, completion_width) in zip(calls[::2], calls[1::2]):
        assert length == length2 == prompt_width + completion_width + 1  # the completions' pass skips the last
