"""Policy objectives and aggregations: worked arithmetic, gradients, and the identities between methods."""

import dataclasses
import math

import pytest
import torch

from grpolab.algo.advantages import compute_advantages, group_std
from grpolab.algo.losses import AGGREGATIONS, OBJECTIVES, clip_decision, clip_ratio, policy_loss
from grpolab.algo.presets import AlgoConfig, resolve_algo

E = math.e


def cfg(**kw) -> AlgoConfig:
    return dataclasses.replace(AlgoConfig(beta=0.0), **kw)


def run(logp, old_logp, adv, mask, algo, **kw):
    """policy_loss over one batch (n_seq, n_tok from the batch itself), plus d loss / d logp."""
    logp = logp.clone().requires_grad_(True)
    kw.setdefault("n_seq", mask.shape[0])
    kw.setdefault("n_tok", int(mask.sum()))
    kw.setdefault("max_len", mask.shape[1])
    loss, info = policy_loss(logp, old_logp, adv, mask, algo, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, info


# Four one-token sequences: log-ratios +1, +1, -1, -1 (ratios e, e, 1/e, 1/e) and advantages +1, -1, +1, -1.
LR4 = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
ADV4 = torch.tensor([1.0, -1.0, 1.0, -1.0])
ONES4 = torch.ones(4, 1)


def test_clipped_worked_arithmetic():
    old = torch.zeros(4, 1)
    loss, grad, info = run(LR4.clone(), old, ADV4, ONES4, cfg(aggregation="token_mean"))
    # token 0: ratio = e,   A = +1 -> min(e, 1.2)      = 1.2   -> loss -1.2   (clipped high: no gradient)
    # token 1: ratio = e,   A = -1 -> min(-e, -1.2)    = -e    -> loss +e     (unclipped: pessimistic term)
    # token 2: ratio = 1/e, A = +1 -> min(1/e, 0.8)    = 1/e   -> loss -1/e   (unclipped)
    # token 3: ratio = 1/e, A = -1 -> min(-1/e, -0.8)  = -0.8  -> loss +0.8   (clipped low: no gradient)
    # token mean: (-1.2 + e - 1/e + 0.8) / 4 = 0.48760060
    assert loss == pytest.approx((-1.2 + E - 1 / E + 0.8) / 4, abs=1e-6)
    # d loss / d logp = -A * ratio / 4 where unclipped: token 1 -> e/4, token 2 -> -(1/e)/4.
    assert torch.allclose(grad.squeeze(1), torch.tensor([0.0, E / 4, -1 / E / 4, 0.0]), atol=1e-6)
    assert info["clip/frac"] == 0.5 and info["clip/high_frac"] == 0.25 and info["clip/low_frac"] == 0.25
    # ratio mean = (2e + 2/e) / 4 = cosh(1); approx_kl = mean((ratio - 1) - log ratio)
    assert info["ratio/mean"] == pytest.approx(math.cosh(1), abs=1e-6)
    assert info["approx_kl"] == pytest.approx(((E - 2) * 2 + (1 / E) * 2) / 4, abs=1e-6)


def test_clip_higher():
    # DAPO: eps_high = 0.28 -> ratio e with A = +1 is clipped at 1.28 instead of 1.2: loss -1.28.
    loss, _, _ = run(
        torch.tensor([[1.0]]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), cfg(eps_high=0.28)
    )
    assert loss == pytest.approx(-1.28)


def test_dual_clip():
    # A = -1, ratio = e^1.5 = 4.4817: the clipped surrogate gives loss 4.4817 (unbounded in the ratio);
    # dual clip c = 3 bounds it at -c A = 3, with no gradient.
    loss, grad, info = run(
        torch.tensor([[1.5]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), cfg(dual_clip=3.0)
    )
    assert loss == pytest.approx(3.0) and grad.item() == 0.0 and info["clip/dual_frac"] == 1.0
    # ratio e = 2.718 < c: dual clip inactive, loss e, gradient -A * ratio = e.
    loss, grad, info = run(
        torch.tensor([[1.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), cfg(dual_clip=3.0)
    )
    assert loss == pytest.approx(E) and grad.item() == pytest.approx(E) and info["clip/dual_frac"] == 0.0


def test_pg_worked_arithmetic():
    # Unclipped: loss = -ratio * A = [-e, +e, -1/e, +1/e], mean 0; gradient -A ratio / 4.
    loss, grad, info = run(LR4.clone(), torch.zeros(4, 1), ADV4, ONES4, cfg(objective="pg", aggregation="token_mean"))
    assert loss == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(grad.squeeze(1), torch.tensor([-E, E, -1 / E, 1 / E]) / 4, atol=1e-6)
    assert info["clip/frac"] == 0.0


def test_cispo_worked_arithmetic():
    # w = sg(clip(ratio, 0.8, 1.2)): [1.2, 1.2, 0.8, 0.8]; value -w A = [-1.2, 1.2, -0.8, 0.8], mean 0.
    # Gradient -w A / 4 on EVERY token -- CISPO never drops a token (compare the clipped zeros above).
    cispo = cfg(objective="cispo", aggregation="token_mean")
    loss, grad, info = run(LR4.clone(), torch.zeros(4, 1), ADV4, ONES4, cispo)
    assert loss == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(grad.squeeze(1), torch.tensor([-1.2, 1.2, -0.8, 0.8]) / 4, atol=1e-6)
    assert info["clip/frac"] == 1.0  # every weight was truncated
    # cispo preset: no lower bound (eps_low = 1), cap 1 + 3 = 4: ratio 1/e keeps its weight 0.368.
    preset = resolve_algo("cispo", {})
    _, grad, _ = run(torch.tensor([[-1.0]]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), preset)
    assert grad.item() == pytest.approx(-1 / E, abs=1e-6)


def test_gspo_worked_arithmetic():
    # Sequence 0: token log-ratios 0.2, 0.4 -> log s = 0.3, s = e^0.3 = 1.34986; A = +1 -> clipped at 1.2:
    #   every token's loss is -1.2, no gradient.
    # Sequence 1: same ratios, A = -1 -> min(-1.34986, -1.2) = -1.34986: loss +1.34986 per token;
    #   gradient of each token: -A * s / |y| = 1.34986 / 2, halved again by the mean over 2 sequences.
    lr = torch.tensor([[0.2, 0.4], [0.2, 0.4]])
    algo = cfg(objective="gspo", eps_low=0.2, eps_high=0.2)
    loss, grad, info = run(lr, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), algo)
    s = math.exp(0.3)
    assert loss == pytest.approx((-1.2 + s) / 2, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0], [s / 4, s / 4]]), atol=1e-6)
    assert info["clip/frac"] == 0.5 and info["ratio/mean"] == pytest.approx(s, abs=1e-6)


def test_gspo_gradient_is_the_sequence_ratio_gradient():
    # grad(-s_i A_i) with s_i = exp(mean_t log rho_it) = -A_i s_i (1/|y_i|) grad sum_t log pi -- on any lengths.
    torch.manual_seed(0)
    logp = torch.randn(3, 5) * 0.01
    old = torch.randn(3, 5) * 0.01
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([0.7, -1.3, 0.4])
    algo = cfg(objective="gspo", eps_low=0.5, eps_high=0.5)  # wide: nothing clipped
    _, grad, _ = run(logp, old, adv, mask, algo)
    x = logp.clone().requires_grad_(True)
    s = torch.exp(((x - old) * mask).sum(1) / mask.sum(1))  # (b,)
    (-(s * adv).mean()).backward()
    assert torch.allclose(grad, x.grad, atol=1e-7)


def test_aggregations_worked_arithmetic():
    # Sequence 0: one token (loss 2), its padding holds NaN and inf; sequence 1: three tokens 1, 2, 6.
    loss_tok = torch.tensor([[2.0, float("nan"), float("inf")], [1.0, 2.0, 6.0]])
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    kw = dict(n_seq=2, n_tok=4, max_len=4)
    # seq_mean: (2/1 + 9/3) / 2 = 2.5; token_mean: 11 / 4 = 2.75;
    # token_sum_norm: 11 / (2 * 4) = 1.375; seq_sum: 11 / 2 = 5.5.
    assert AGGREGATIONS["seq_mean"](loss_tok, mask, **kw).item() == pytest.approx(2.5)
    assert AGGREGATIONS["token_mean"](loss_tok, mask, **kw).item() == pytest.approx(2.75)
    assert AGGREGATIONS["token_sum_norm"](loss_tok, mask, **kw).item() == pytest.approx(1.375)
    assert AGGREGATIONS["seq_sum"](loss_tok, mask, **kw).item() == pytest.approx(5.5)


def test_kl_in_loss_worked_arithmetic():
    # pi_theta = 0.5, pi_ref = 0.25 on the token: lr = log 0.25 - log 0.5 = -log 2.
    # k3 = e^lr - lr - 1 = 0.5 + 0.693147 - 1 = 0.193147; beta = 0.1 -> the loss gains 0.0193147.
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    zero_adv = torch.zeros(1)
    loss, grad, info = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1), ref_logp=ref)
    assert loss == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-6)
    assert info["kl"] == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert info["loss/kl"] == pytest.approx(0.1 * info["kl"])
    # d/dlogp beta * k3 = beta * (1 - e^lr) = 0.1 * 0.5: pushes logp down towards the reference.
    assert grad.item() == pytest.approx(0.05, abs=1e-6)
    # the beta keyword (an adaptive controller's value) overrides algo.beta
    loss, _, _ = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1), ref_logp=ref, beta=0.2)
    assert loss == pytest.approx(0.2 * (0.5 + math.log(2) - 1), abs=1e-6)
    # k1 = -lr = log 2; k2 = lr^2 / 2 = 0.240227
    _, _, info = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1, kl_estimator="k1"), ref_logp=ref)
    assert info["kl"] == pytest.approx(math.log(2), abs=1e-6)
    _, _, info = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1, kl_estimator="k2"), ref_logp=ref)
    assert info["kl"] == pytest.approx(math.log(2) ** 2 / 2, abs=1e-6)
    # in_reward: the KL is reported but not in the loss; no reference: no kl is measured
    loss, _, info = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1, kl_placement="in_reward"), ref_logp=ref)
    assert loss == 0.0 and info["kl"] > 0 and info["loss/kl"] == 0.0
    _, _, info = run(logp, logp, zero_adv, torch.ones(1, 1), cfg(beta=0.1))
    assert "kl" not in info and info["loss/kl"] == 0.0


def random_batch(b=6, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, T, generator=g) * 2  # (b, T)
    old = logp + torch.randn(b, T, generator=g) * 0.3  # ratios around 1, some outside the clip range
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])[:b]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (b, T) right-padded
    adv = torch.randn(b, generator=g)
    ref = logp + torch.randn(b, T, generator=g) * 0.2
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_micro_batches_add_up(objective, aggregation):
    # Summing the losses (and gradients) of two halves, each normalised by the WHOLE batch's n_seq / n_tok,
    # gives the whole batch's loss (gradient accumulation needs no rescaling).
    logp, old, adv, mask, ref = random_batch()
    algo = cfg(objective=objective, aggregation=aggregation, beta=0.05)
    kw = dict(n_seq=6, n_tok=int(mask.sum()), max_len=7)
    whole, g_whole, _ = run(logp, old, adv, mask, algo, ref_logp=ref, **kw)
    a, g_a, _ = run(logp[:3], old[:3], adv[:3], mask[:3], algo, ref_logp=ref[:3], **kw)
    b, g_b, _ = run(logp[3:], old[3:], adv[3:], mask[3:], algo, ref_logp=ref[3:], **kw)
    assert a + b == pytest.approx(whole, abs=1e-6)
    assert torch.allclose(torch.cat([g_a, g_b]), g_whole, atol=1e-7)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_on_policy_clipped_gradient_is_the_policy_gradient(aggregation):
    # ratio = 1 everywhere (old_logp = logp): clipping is inactive and the gradient is REINFORCE's,
    # -A grad log pi, aggregated the same way -- for the clipped surrogate, pg, GSPO and CISPO alike.
    logp, _, adv, mask, _ = random_batch()
    base = cfg(objective="pg", aggregation=aggregation)
    _, g_pg, _ = run(logp, logp, adv, mask, base)
    # REINFORCE written directly: loss = AGG(-A * logp)
    x = logp.clone().requires_grad_(True)
    AGGREGATIONS[aggregation](-adv[:, None] * x, mask, n_seq=6, n_tok=int(mask.sum()), max_len=7).backward()
    assert torch.allclose(g_pg, x.grad, atol=1e-7)
    for objective in ("clipped", "cispo"):
        _, g, info = run(logp, logp, adv, mask, dataclasses.replace(base, objective=objective))
        assert torch.allclose(g, g_pg, atol=1e-7) and info["clip/frac"] == 0.0 and info["ratio/mean"] == 1.0
    if aggregation == "seq_mean":  # GSPO's own aggregation: equal to the token-level one on-policy
        _, g, _ = run(logp, logp, adv, mask, dataclasses.replace(base, objective="gspo"))
        assert torch.allclose(g, g_pg, atol=1e-7)


def test_clipped_tokens_contribute_no_gradient():
    # ratio = 1.5 (beyond 1 + eps) with A > 0, and ratio = 0.5 with A < 0: clipped, gradient exactly 0.
    # ratio = 1.5 with A < 0 and 0.5 with A > 0: not clipped (the pessimistic term is the unclipped one).
    logp = torch.zeros(4, 2)
    old = -torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.0], [1.5, 1.0], [0.5, 1.0]]))  # token 1 on-policy
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    _, g, info = run(logp, old, adv, torch.ones(4, 2), cfg(aggregation="token_mean"))
    assert g[0, 0] == 0.0 and g[1, 0] == 0.0
    # unclipped tokens: -A * ratio / n_tok
    assert g[2, 0].item() == pytest.approx(1.5 / 8) and g[3, 0].item() == pytest.approx(-0.5 / 8)
    assert torch.allclose(g[:, 1], -adv / 8)  # on-policy tokens untouched
    assert info["clip/frac"] == pytest.approx(2 / 8)


def test_clip_ratio_worked_arithmetic():
    """The one clip rule: clip(rho, 1 - eps_low, 1 + eps_high), and which tokens a bound changed."""
    rho = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0, 1.25])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0])
    algo = cfg(eps_low=0.2, eps_high=0.28)
    clipped, low, high = clip_ratio(rho, adv, algo)
    assert torch.allclose(clipped, torch.tensor([1.28, 1.28, 0.8, 0.8, 1.0, 1.25]))
    # the surrogate's term changes only where the clipped one is the smaller: A > 0 above, A < 0 below
    assert low.tolist() == [False, False, False, True, False, False]
    assert high.tolist() == [True, False, False, False, False, False]
    _, low, high = clip_ratio(rho, None, algo)  # CISPO's weight: truncated whatever the sign of A
    assert low.tolist() == [False, False, True, True, False, False]
    assert high.tolist() == [True, True, False, False, False, False]
    assert not clip_ratio(torch.tensor([1e-6]), None, cfg(eps_low=1.0))[1].item()  # eps_low >= 1: no lower bound
    # A float tie: rho one ulp above 1.2 and an A for which rho A and 1.2 A round to one number. The rule marks
    # the token; the min keeps the unclipped term and its gradient, so the metrics do not count it as clipped.
    from grpolab.algo.losses import _clipped_surrogate

    rho = torch.nextafter(torch.tensor([1.2]), torch.tensor([2.0])).requires_grad_(True)
    a = torch.tensor([0.8334450125694275])
    assert (rho * a).item() == (torch.tensor([1.2]) * a).item() and clip_ratio(rho, a, cfg())[2].item()
    loss, info = _clipped_surrogate(rho, a, cfg())
    (grad,) = torch.autograd.grad(loss.sum(), rho)
    assert grad.item() == -a.item() and not info["clip_high"].item()


@pytest.mark.parametrize("objective,dual", [("clipped", None), ("clipped", 3.0), ("gspo", None), ("cispo", None)])
def test_loss_metrics_and_credit_codes_read_one_clip_rule(objective, dual):
    """Off-policy random tokens: the objective's clip masks are clip_ratio's, the report's clip codes
    (clip_decision on the same ratios) mark the same tokens, and for the clipped surrogate a valid token with
    A != 0 gets no gradient exactly where it is marked clipped."""
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(32, 12, generator=g) * 3
    # token and sequence spread: token ratios and GSPO's sequence ratios fall outside the clip range
    old = logp + torch.randn(32, 12, generator=g) * 0.5 + torch.randn(32, 1, generator=g) * 0.5
    adv = torch.randn(32, 1, generator=g).expand(32, 12)
    mask = torch.ones(32, 12)
    algo = cfg(objective=objective, eps_low=0.2, eps_high=0.28, dual_clip=dual)
    x = logp.clone().requires_grad_(True)
    loss, info = OBJECTIVES[objective](x, old, adv, mask, algo)
    low, high, dual_mask = info["clip_low"], info["clip_high"], info["clip_dual"]
    assert 0 < low.sum() < low.numel() and 0 < high.sum() < high.numel()
    _, rule_low, rule_high = clip_ratio(info["ratio"], None if objective == "cispo" else adv, algo)
    assert torch.equal(low, rule_low) and torch.equal(high, rule_high)
    codes = clip_decision(info["ratio"].flatten(), adv.flatten(), algo).view(32, 12)
    assert torch.equal(codes == -1, low) and torch.equal(codes == 1, high) and torch.equal(codes == 2, dual_mask)
    if dual is not None:
        assert dual_mask.any()
    if objective == "clipped":
        (grad,) = torch.autograd.grad(loss.sum(), x)
        assert torch.equal(grad == 0, low | high | dual_mask)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"])
def test_g1_gives_zero_gradient_and_no_nan(name):
    # One sample per prompt: the group baseline is the sample itself -> A = 0 -> no policy gradient.
    algo = resolve_algo(name, {})
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    adv = compute_advantages(r, 1, algo)
    logp, old, _, mask, _ = random_batch()
    loss, g, info = run(logp, old, adv, mask, algo)
    assert torch.equal(adv, torch.zeros(6))
    assert loss == 0.0 and torch.equal(g, torch.zeros_like(g))
    assert all(math.isfinite(v) for v in info.values())


def test_gspo_with_equal_token_ratios_is_the_token_level_objective():
    # Every token ratio equal to r -> s_i = r, and GSPO's loss and gradient equal the clipped token objective's.
    logp, _, adv, mask, _ = random_batch()
    for r in (0.7, 0.95, 1.0, 1.1, 1.6):
        old = logp - math.log(r)  # (b, T) ratio r on every token
        tok = cfg(objective="clipped", aggregation="seq_mean")
        seq = cfg(objective="gspo", aggregation="seq_mean")
        l_tok, g_tok, i_tok = run(logp, old, adv, mask, tok)
        l_seq, g_seq, i_seq = run(logp, old, adv, mask, seq)
        assert l_seq == pytest.approx(l_tok, abs=1e-6)
        assert torch.allclose(g_seq, g_tok, atol=1e-6)
        assert i_seq["clip/frac"] == pytest.approx(i_tok["clip/frac"])


def test_dr_grpo_is_grpo_times_group_std_for_equal_lengths():
    # All lengths = max_len = L. Dr. GRPO: A = r - mean, loss sum / (n_seq * L); GRPO: A = (r - mean)/(std + eps),
    # loss mean over each sequence's L tokens, then over n_seq. Per sequence the gradients differ by (std_G + eps).
    B, Gs, L = 3, 4, 5
    torch.manual_seed(1)
    r = torch.rand(B * Gs)
    logp = -torch.rand(B * Gs, L)
    mask = torch.ones(B * Gs, L)
    grpo, dr = resolve_algo("grpo", {"beta": 0.0}), resolve_algo("dr_grpo", {})
    l_g, g_g, _ = run(logp, logp, compute_advantages(r, Gs, grpo), mask, grpo, max_len=L)
    l_d, g_d, _ = run(logp, logp, compute_advantages(r, Gs, dr), mask, dr, max_len=L)
    scale = (group_std(r, Gs) + dr.adv_eps)[:, None]  # (N, 1)
    assert torch.allclose(g_d, g_g * scale, atol=1e-6)
    # With one group the whole loss scales: loss_dr = (std + eps) * loss_grpo.
    l_g1, _, _ = run(logp[:Gs], logp[:Gs], compute_advantages(r[:Gs], Gs, grpo), mask[:Gs], grpo, max_len=L)
    l_d1, _, _ = run(logp[:Gs], logp[:Gs], compute_advantages(r[:Gs], Gs, dr), mask[:Gs], dr, max_len=L)
    assert l_d1 == pytest.approx(l_g1 * scale[0].item(), abs=1e-6)


def test_token_mean_equals_seq_mean_for_equal_lengths():
    torch.manual_seed(2)
    logp, old, adv = -torch.rand(5, 4), -torch.rand(5, 4), torch.randn(5)
    mask = torch.ones(5, 4)
    l_t, g_t, _ = run(logp, old, adv, mask, resolve_algo("dapo", {}))
    l_s, g_s, _ = run(logp, old, adv, mask, resolve_algo("dapo", {"aggregation": "seq_mean"}))
    assert l_t == pytest.approx(l_s, abs=1e-6) and torch.allclose(g_t, g_s, atol=1e-7)
    # ... and differ when lengths differ (the DAPO paper's point: long answers weigh more per sequence).
    mask[0, 1:] = 0
    l_t, _, _ = run(logp, old, adv, mask, resolve_algo("dapo", {}))
    l_s, _, _ = run(logp, old, adv, mask, resolve_algo("dapo", {"aggregation": "seq_mean"}))
    assert l_t != pytest.approx(l_s, abs=1e-4)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_garbage_padding_never_leaks(objective):
    # Padding log-probs of -inf / NaN (a masked softmax) and huge log-ratios: finite loss, zero gradient
    # on padding, finite metrics.
    logp, old, adv, mask, ref = random_batch()
    logp = torch.where(mask > 0, logp, torch.tensor(float("-inf")))
    old = torch.where(mask > 0, old, torch.tensor(float("nan")))
    ref = torch.where(mask > 0, ref, torch.tensor(float("nan")))
    old[0, 0] = logp[0, 0] - 500.0  # a ratio of e^500 on a real token
    loss, g, info = run(logp, old, adv, mask, cfg(objective=objective, beta=0.1), ref_logp=ref)
    assert math.isfinite(loss) and torch.isfinite(g).all()
    assert torch.equal(g[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert all(math.isfinite(v) for v in info.values())


def test_low_precision_logp_and_metrics_are_floats():
    logp, old, adv, mask, ref = random_batch()
    loss, info = policy_loss(
        logp.bfloat16().requires_grad_(True),
        old.bfloat16(),
        adv,
        mask,
        cfg(beta=0.1),
        ref_logp=ref.bfloat16(),
        n_seq=6,
        n_tok=int(mask.sum()),
        max_len=7,
    )
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    for key in ("clip/frac", "ratio/mean", "kl", "loss/policy", "approx_kl"):
        assert type(info[key]) is float


def test_empty_micro_batch():
    mask = torch.zeros(2, 3)
    loss, g, info = run(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), mask, cfg(), n_seq=4, n_tok=10)
    assert loss == 0.0 and torch.equal(g, torch.zeros(2, 3)) and info["ratio/mean"] == 0.0


def test_per_token_advantages():
    # PPO: adv (b, T). Token-level arithmetic: on-policy, gradient -A_t / n_tok.
    adv = torch.tensor([[1.0, -2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, g, _ = run(torch.zeros(1, 3), torch.zeros(1, 3), adv, mask, cfg(aggregation="token_mean"))
    assert loss == pytest.approx((-1.0 + 2.0) / 2)
    assert torch.allclose(g, torch.tensor([[-0.5, 1.0, 0.0]]))
