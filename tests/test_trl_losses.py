"""TRL 1.16's loss options in grpolab's loss: sapo, vespo (objectives), luspo (gspo + seq_sum), the entropy
bonus and the masking of truncated completions. Worked arithmetic on small tensors, and the same tensors
through TRL's own GRPOTrainer._compute_loss (its code, run on a stand-in trainer whose policy pass returns
the given log-probs): the same loss and the same gradient."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpolab.algo.losses import policy_loss, vespo_weight
from grpolab.algo.presets import AlgoConfig, resolve_algo
from grpolab.batch import Rollout
from grpolab.training.update import generation_parts, loss_mask


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def grpolab_loss(logp, old_logp, adv, mask, algo, entropy=None, **kw):
    """policy_loss over one batch (n_seq, n_tok from the batch) and d loss / d logp (and d / d entropy)."""
    logp = logp.clone().requires_grad_(True)
    ent = entropy.clone().requires_grad_(True) if entropy is not None else None
    kw.setdefault("n_seq", mask.shape[0])
    kw.setdefault("n_tok", int(mask.sum()))
    kw.setdefault("max_len", mask.shape[1])
    loss, info = policy_loss(logp, old_logp, adv, mask, algo, entropy=ent, **kw)
    grads = torch.autograd.grad(loss, [logp] + ([ent] if ent is not None else []), allow_unused=True)
    return loss.item(), grads, info


# --- TRL's own loss code on a stand-in trainer --------------------------------------------------------------


def trl_stand_in(loss_type: str, max_len: int, entropy_coef: float = 0.0, **args) -> SimpleNamespace:
    """A stand-in for TRL 1.16's GRPOTrainer on which its own _compute_loss runs as it is: one process, no
    gradient accumulation, no vLLM, TRL's __init__ settings read from a real GRPOConfig(**args)."""
    trl_trainer = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is in the test extra")
    from trl import GRPOConfig

    config = GRPOConfig(
        output_dir="/tmp/unused",
        loss_type=loss_type,
        report_to=[],
        use_cpu=True,
        bf16=False,
        entropy_coef=entropy_coef,
        **{"importance_sampling_level": "sequence" if loss_type == "luspo" else "token", **args},
    )
    config.steps_per_generation = 1  # one process, one accumulation step: the generation batch is this one
    accel = SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        unwrap_model=lambda m: m,
        pad_across_processes=lambda x, dim=0, pad_index=0: x,
    )
    me = SimpleNamespace(
        args=config,
        loss_type=loss_type,
        beta=config.beta,
        epsilon_low=config.epsilon,
        epsilon_high=config.epsilon_high if config.epsilon_high is not None else config.epsilon,
        importance_sampling_level=config.importance_sampling_level,
        top_entropy_quantile=config.top_entropy_quantile,
        off_policy_mask_threshold=config.off_policy_mask_threshold,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accel,
        _metrics={"train": defaultdict(list)},
        max_completion_length=max_len,
        aux_loss_enabled=False,
        entropy_coef=config.entropy_coef,
        use_adaptive_entropy=config.use_adaptive_entropy,
        _entropy_bonus_enabled=config.entropy_coef != 0.0 or config.use_adaptive_entropy,
        _last_world_entropy=float("inf"),
        _entropy_window_stats=None,
        get_gamma_weights=trl_trainer.GRPOTrainer.get_gamma_weights,
        get_off_policy_mask=trl_trainer.GRPOTrainer.get_off_policy_mask,
    )
    me.get_high_entropy_mask = lambda *a: trl_trainer.GRPOTrainer.get_high_entropy_mask(me, *a)
    return me


def trl_compute(me: SimpleNamespace, logp, old_logp, adv, mask, *, entropies=None, sampler_logp=None):
    """One call of TRL's _compute_loss on the stand-in, its policy pass (_get_per_token_logps_and_entropies)
    returning `logp` (with grad) and `entropies`; sampler_logp: vLLM's sampling_per_token_logps. Returns
    (loss, d/d logp, d/d entropies or None)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logp = logp.clone().requires_grad_(True)
    ent = (entropies if entropies is not None else torch.zeros_like(logp)).clone().requires_grad_(True)
    me._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    n = mask.shape[0]
    inputs = {
        "prompt_ids": torch.zeros((n, 1), dtype=torch.long),
        "prompt_mask": torch.ones((n, 1), dtype=torch.long),
        "completion_ids": torch.zeros(mask.shape, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": mask.sum(),
    }
    if sampler_logp is not None:
        inputs["sampling_per_token_logps"] = sampler_logp
    loss = GRPOTrainer._compute_loss(me, None, inputs)
    g_logp, g_ent = torch.autograd.grad(loss, [logp, ent], allow_unused=True)
    return loss.item(), g_logp, g_ent


def trl_loss(loss_type: str, logp, old_logp, adv, mask, *, entropies=None, entropy_coef=0.0, **args):
    """GRPOTrainer._compute_loss of TRL 1.16 (trl/trainer/grpo_trainer.py), run as it is on a stand-in for
    the trainer (trl_stand_in, trl_compute). Returns (loss, d/d logp, d/d entropies or None)."""
    me = trl_stand_in(loss_type, mask.shape[1], entropy_coef, **args)
    return trl_compute(me, logp, old_logp, adv, mask, entropies=entropies)


# Three sequences of up to 3 tokens (the third has 2), off-policy log-ratios, advantages +1.5, -0.5, +0.7.
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.2, -0.3, -2.2], [-0.7, -1.1, 0.0]])
LOGP = OLD + torch.tensor([[0.3, -0.2, 0.1], [0.05, 0.4, -0.3], [-0.25, 0.15, 0.0]])
ADV = torch.tensor([1.5, -0.5, 0.7])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


# --- SAPO ----------------------------------------------------------------------------------------------------


def test_sapo_worked_arithmetic():
    algo = resolve_algo("sapo")
    assert (algo.objective, algo.aggregation, algo.sapo_temperature_pos, algo.sapo_temperature_neg) == (
        "sapo",
        "seq_mean",
        1.0,
        1.05,
    )
    logp, old = torch.log(torch.tensor([[1.5], [0.5]])), torch.zeros(2, 1)
    loss, (grad,), info = grpolab_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), algo)
    # token 0: ratio 1.5, A = +1, tau = 1    -> f = 4 sigmoid(0.5) / 1           = 2.489837 -> loss -2.489837
    # token 1: ratio 0.5, A = -1, tau = 1.05 -> f = 4 sigmoid(1.05 (-0.5)) / 1.05 = 1.415938 -> loss +1.415938
    # seq_mean over two one-token sequences: (-2.489837 + 1.415938) / 2 = -0.536950
    f0, f1 = 4 * sig(0.5), 4 * sig(-0.525) / 1.05
    assert f0 == pytest.approx(2.489837, abs=1e-6) and f1 == pytest.approx(1.415938, abs=1e-6)
    assert loss == pytest.approx((-f0 + f1) / 2, abs=1e-6)
    # d loss / d logp = -A * 4 s (1 - s) * ratio / 2 (the gate's slope times d ratio / d logp = ratio)
    # token 0: -1 * 4 * 0.622459 * 0.377541 * 1.5 / 2 = -0.705009;  token 1: +4 s (1 - s) * 0.5 / 2, s = sigmoid(-0.525)
    s0, s1 = sig(0.5), sig(-0.525)
    assert torch.allclose(
        grad.squeeze(1), torch.tensor([-4 * s0 * (1 - s0) * 1.5 / 2, 4 * s1 * (1 - s1) * 0.5 / 2]), atol=1e-6
    )
    assert info["clip/frac"] == 0.0  # a soft gate clips nothing


def test_sapo_on_policy_is_the_policy_gradient():
    """At ratio 1 the gate's slope is 4 sigmoid(0) (1 - sigmoid(0)) = 1 whatever tau: the gradient is -A / |y|."""
    algo = dataclasses.replace(resolve_algo("sapo"), sapo_temperature_pos=3.0, sapo_temperature_neg=0.5)
    _, (grad,), _ = grpolab_loss(OLD, OLD, ADV, MASK, algo)
    lengths = MASK.sum(1, keepdim=True)
    assert torch.allclose(grad, -ADV[:, None] * MASK / lengths / 3, atol=1e-6)


def test_sapo_equals_trl():
    algo = resolve_algo("sapo")
    ours, (g_ours,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    theirs, g_theirs, _ = trl_loss("sapo", LOGP, OLD, ADV, MASK)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)


# --- VESPO ---------------------------------------------------------------------------------------------------


def test_vespo_weight_worked_arithmetic():
    algo = resolve_algo("vespo")
    assert (algo.vespo_k_pos, algo.vespo_lambda_pos, algo.vespo_k_neg, algo.vespo_lambda_neg) == (2.0, 3.0, 3.0, 2.0)
    # w = prod of the token ratios = exp(sum of log-ratios): seq 0 exp(0.3 - 0.2 + 0.1) = exp(0.2), A >= 0:
    #   phi = exp(3 + 2 * 0.2 - 3 e^0.2) = exp(3.4 - 3.664208) = exp(-0.264208) = 0.767814
    # seq 1: exp(0.05 + 0.4 - 0.3) = exp(0.15), A < 0: phi = exp(2 + 3 * 0.15 - 2 e^0.15) = exp(2.45 - 2.323668) = 1.134658
    # seq 2: exp(-0.25 + 0.15) = exp(-0.1) (the padded third token does not count), A >= 0:
    #   phi = exp(3 - 0.2 - 3 e^-0.1) = exp(2.8 - 2.714512) = 1.089248
    phi = vespo_weight(LOGP - OLD, ADV, MASK, algo)
    want = [
        math.exp(3 + 2 * 0.2 - 3 * math.exp(0.2)),
        math.exp(2 + 3 * 0.15 - 2 * math.exp(0.15)),
        math.exp(3 - 2 * 0.1 - 3 * math.exp(-0.1)),
    ]
    assert want == pytest.approx([0.767814, 1.134658, 1.089248], abs=1e-6)
    assert torch.allclose(phi, torch.tensor(want), atol=1e-5)
    assert vespo_weight(torch.zeros(3, 3), ADV, MASK, algo).tolist() == pytest.approx([1.0, 1.0, 1.0])  # phi(1) = 1


def test_vespo_loss_and_gradient():
    algo = resolve_algo("vespo")
    loss, (grad,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    phi = vespo_weight(LOGP - OLD, ADV, MASK, algo)  # (3,)
    # value -phi_i A_i on each token, token mean over 8 tokens; gradient -phi_i A_i / 8 on each valid token
    assert loss == pytest.approx(float(-(phi * ADV * MASK.sum(1)).sum() / 8), abs=1e-6)
    assert torch.allclose(grad, -(phi * ADV)[:, None] * MASK / 8, atol=1e-6)


def test_vespo_folds_the_sampler_weight_into_w():
    """With another engine's samples, the correction weight c enters w (log w += sum log c), as TRL folds
    vLLM's ratio in; the loss is not multiplied by c."""
    algo = resolve_algo("vespo")
    c = torch.full((3, 3), 1.5)
    _, (grad,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo, token_weight=c)
    phi = vespo_weight(LOGP - OLD + math.log(1.5), ADV, MASK, algo)
    assert torch.allclose(grad, -(phi * ADV)[:, None] * MASK / 8, atol=1e-6)


def test_vespo_gradient_equals_trl():
    """TRL's per-token value is -phi A log pi, grpolab's -phi A (as for cispo): the gradients are equal, and
    TRL's value is its formula's on these tensors."""
    algo = resolve_algo("vespo")
    ours, (g_ours,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    theirs, g_theirs, _ = trl_loss("vespo", LOGP, OLD, ADV, MASK)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)
    phi = vespo_weight(LOGP - OLD, ADV, MASK, algo)
    trl_value = float((-(phi * ADV)[:, None] * LOGP * MASK).sum() / 8)
    assert theirs == pytest.approx(trl_value, abs=1e-6)


# --- LUSPO ---------------------------------------------------------------------------------------------------


def test_luspo_is_gspo_times_the_length():
    """LUSPO = GSPO's per-sequence loss times |y_i|, mean over sequences."""
    luspo = resolve_algo("luspo")
    assert (luspo.objective, luspo.aggregation) == ("gspo", "seq_sum")
    gspo = dataclasses.replace(luspo, aggregation="seq_mean")
    lengths = MASK.sum(1)
    for i in range(3):  # one sequence at a time: luspo = |y_i| * gspo
        l_u, _, _ = grpolab_loss(LOGP[i : i + 1], OLD[i : i + 1], ADV[i : i + 1], MASK[i : i + 1], luspo)
        l_g, _, _ = grpolab_loss(LOGP[i : i + 1], OLD[i : i + 1], ADV[i : i + 1], MASK[i : i + 1], gspo)
        assert l_u == pytest.approx(float(lengths[i]) * l_g, abs=1e-6)


@pytest.mark.parametrize("eps", [0.2, 3e-4])
def test_luspo_equals_trl(eps):
    algo = dataclasses.replace(resolve_algo("luspo"), eps_low=eps, eps_high=eps)
    ours, (g_ours,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    theirs, g_theirs, _ = trl_loss("luspo", LOGP, OLD, ADV, MASK, epsilon=eps)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)


# --- CISPO with the sequence's ratio ---------------------------------------------------------------------------


def cispo_seq_algo(epsilon_high: float) -> AlgoConfig:
    """grpolab's algo for TRL's loss_type="cispo", importance_sampling_level="sequence", through the mapping."""
    from grpolab.app.trl_compat.fields import _loss_type

    out = _loss_type("cispo", {"epsilon": 0.2, "epsilon_high": epsilon_high, "importance_sampling_level": "sequence"})
    assert out["algo.objective"] == "cispo_seq"
    return dataclasses.replace(
        resolve_algo("cispo"),
        objective=out["algo.objective"],
        aggregation=out["algo.aggregation"],
        eps_low=out["algo.eps_low"],
        eps_high=out["algo.eps_high"],
    )


def test_cispo_seq_worked_arithmetic():
    """Sequence ratios s = exp(mean log rho): 1.0689 (0.2 / 3), 1.0513 (0.15 / 3), 0.9512 (-0.1 / 2); with TRL's
    epsilon_high 1.06 the first weight is capped at 1.06, the others are their ratios; token mean over 8 tokens:
    the gradient -w_i A_i / 8 on every valid token of sequence i."""
    algo = cispo_seq_algo(1.06)
    _, (grad,), metrics = grpolab_loss(LOGP, OLD, ADV, MASK, algo)
    w = torch.tensor([1.06, math.exp(0.05), math.exp(-0.05)])
    assert torch.allclose(grad, -(w * ADV)[:, None] * MASK / 8, atol=1e-6)
    # the ratio shown is each sequence's on its tokens: (3 s_1 + 3 s_2 + 2 s_3) / 8
    shown = (3 * math.exp(0.2 / 3) + 3 * math.exp(0.05) + 2 * math.exp(-0.05)) / 8
    assert metrics["ratio/mean"] == pytest.approx(shown, abs=1e-6)
    assert metrics["clip/high_frac"] == pytest.approx(3 / 8)  # the first sequence's three tokens


def test_cispo_seq_gradient_equals_trl():
    """TRL 1.16 accepts cispo at the sequence level (with a warning) and weighs every token of a sequence by
    sg(min(s_i, epsilon_high)): the same gradient as grpolab's (the values differ by the convention of
    obj_cispo, -w A log pi against -w A)."""
    for eps_high in (1.06, 5.0, 0.2):
        ours, (g_ours,), _ = grpolab_loss(LOGP, OLD, ADV, MASK, cispo_seq_algo(eps_high))
        _, g_theirs, _ = trl_loss(
            "cispo", LOGP, OLD, ADV, MASK, epsilon_high=eps_high, importance_sampling_level="sequence"
        )
        assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6), eps_high
    token, (g_token,), _ = grpolab_loss(
        LOGP, OLD, ADV, MASK, dataclasses.replace(cispo_seq_algo(1.06), objective="cispo")
    )
    assert not torch.allclose(g_token, g_ours)  # the sequence's weight is not the token's


# --- entropy bonus -------------------------------------------------------------------------------------------


def test_entropy_bonus_worked_arithmetic():
    ent = torch.tensor([[2.0, 1.0, 3.0], [0.5, 0.5, 0.5], [1.0, 4.0, 9.0]])  # the 9 is padding
    base = dataclasses.replace(AlgoConfig(beta=0.0), aggregation="token_mean")
    with_bonus = dataclasses.replace(base, entropy_coef=0.1)
    l0, _, _ = grpolab_loss(LOGP, OLD, ADV, MASK, base)
    l1, (_, g_ent), info = grpolab_loss(LOGP, OLD, ADV, MASK, with_bonus, entropy=ent)
    # mean entropy over the 8 valid tokens: (2 + 1 + 3 + 0.5 * 3 + 1 + 4) / 8 = 12.5 / 8 = 1.5625
    # loss = policy - 0.1 * 1.5625 = policy - 0.15625; d loss / d H = -0.1 / 8 on valid tokens
    assert l1 == pytest.approx(l0 - 0.15625, abs=1e-6)
    assert torch.allclose(g_ent, -0.1 / 8 * MASK)
    assert info["loss/entropy"] == pytest.approx(0.15625)


def test_entropy_bonus_needs_the_entropy():
    with pytest.raises(ValueError, match="entropy_coef"):
        policy_loss(LOGP, OLD, ADV, MASK, AlgoConfig(entropy_coef=0.1), n_seq=3, n_tok=8, max_len=3)


@pytest.mark.parametrize("loss_type,preset", [("dapo", "dapo"), ("grpo", "grpo"), ("sapo", "sapo")])
def test_entropy_bonus_equals_trl(loss_type, preset):
    ent = torch.tensor([[2.0, 1.0, 3.0], [0.5, 0.5, 0.5], [1.0, 4.0, 0.0]])
    algo = dataclasses.replace(resolve_algo(preset), beta=0.0, entropy_coef=0.05, eps_high=0.2)
    ours, (g_ours, e_ours), _ = grpolab_loss(LOGP, OLD, ADV, MASK, algo, entropy=ent)
    theirs, g_theirs, e_theirs = trl_loss(loss_type, LOGP, OLD, ADV, MASK, entropies=ent, entropy_coef=0.05)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert torch.allclose(g_ours * MASK, g_theirs * MASK, atol=1e-6)
    assert torch.allclose(e_ours * MASK, e_theirs * MASK, atol=1e-7)


def test_entropy_gradient_through_the_chunked_head():
    """The chunked LM head's entropy carries its gradient: d(sum_t c_t H_t + sum_t g_t log p(y_t)) / d(h, W)
    equals the plain softmax's, in fp32."""
    from grpolab.model.lmhead import chunked_token_logp

    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 8, generator=g, dtype=torch.float64).float()
    w = torch.randn(11, 8, generator=g).float()
    y = torch.randint(0, 11, (2, 5), generator=g)
    cg, ce = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)

    def grads(chunked: bool):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if chunked:
            logp, ent = chunked_token_logp(hh, ww, y, temperature=0.7, with_entropy=True, chunk=3, keep_bytes=0)
        else:
            z = (hh @ ww.T) / 0.7
            lq = torch.log_softmax(z, -1)
            logp, ent = lq.gather(-1, y[..., None]).squeeze(-1), -(lq.exp() * lq).sum(-1)
        (logp * cg + ent * ce).sum().backward()
        return ent.detach(), hh.grad, ww.grad

    for a, b in zip(grads(True), grads(False)):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


# --- truncated completions -----------------------------------------------------------------------------------


def rollout_of(mask: torch.Tensor, truncated: list[bool], G: int) -> Rollout:
    n, c = mask.shape
    return Rollout(
        prompt_ids=torch.zeros((n, 1), dtype=torch.long),
        prompt_mask=torch.ones((n, 1), dtype=torch.long),
        completion_ids=torch.zeros((n, c), dtype=torch.long),
        completion_mask=mask,
        sample_logp=torch.zeros((n, c)),
        truncated=torch.tensor(truncated),
        texts=[""] * n,
        G=G,
    )


def test_mask_truncated_completions_zeroes_their_loss():
    r = rollout_of(MASK, [True, False, False], G=3)
    assert torch.equal(loss_mask(r, AlgoConfig()), MASK)  # off: every token
    on = dataclasses.replace(AlgoConfig(beta=0.0), mask_truncated_completions=True, aggregation="token_mean")
    lmask = loss_mask(r, on)
    assert lmask[0].sum() == 0 and torch.equal(lmask[1:], MASK[1:])
    loss, (grad,), _ = grpolab_loss(LOGP, OLD, ADV, lmask, on)
    assert torch.all(grad[0] == 0)  # the truncated completion adds no gradient
    # the others' token mean over their own 5 tokens (n_tok counts the loss mask, as TRL's num_items_in_batch)
    rest, _, _ = grpolab_loss(LOGP[1:], OLD[1:], ADV[1:], MASK[1:], on)
    assert loss == pytest.approx(rest, abs=1e-6)
    # seq_mean keeps the truncated sequence in n_seq (TRL's grpo loss: .mean() over the batch): 2/3 of the rest
    seq = dataclasses.replace(on, aggregation="seq_mean")
    l_seq, _, _ = grpolab_loss(LOGP, OLD, ADV, lmask, seq)
    l_rest, _, _ = grpolab_loss(LOGP[1:], OLD[1:], ADV[1:], MASK[1:], seq)
    assert l_seq == pytest.approx(l_rest * 2 / 3, abs=1e-6)


def test_generation_parts_split_whole_groups():
    assert [p.tolist() for p in generation_parts(4, 2)] == [[0, 1], [2, 3]]
    assert [p.tolist() for p in generation_parts(3, 1)] == [[0, 1, 2]]
    assert [p.tolist() for p in generation_parts(3, 2)] == [[0, 1], [2]]  # a short DAPO batch
