"""The objectives whose importance weight is detached: each token keeps the policy gradient, scaled by a
weight of its ratio that carries no gradient. CISPO clips the weight (per token, or the sequence's ratio as
TRL's cispo at importance_sampling_level="sequence"); VESPO takes a smooth Gamma weight of the sequence's
ratio. Each is written as l_it = -w A_it pi_theta(y_it) / sg(pi_theta(y_it)): the gradient of -w A log pi,
and the value -w A (grpolab.algo.losses registers them in OBJECTIVES)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from grpolab.algo.ratios import _importance_log_ratio, _where_valid, clip_ratio, sequence_log_ratio

if TYPE_CHECKING:  # the settings type only
    from grpolab.algo.presets import AlgoConfig


def obj_cispo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """CISPO (MiniMax-M1, Chen et al. 2025, eqs. 4-5): clip the importance weight, not the update.

        w_it = sg( clip(rho_it, 1 - eps_low, 1 + eps_high) )
        grad l_it = -w_it A_it grad log pi_theta(y_it)

    Written as l_it = -w_it A_it pi_theta(y_it) / sg(pi_theta(y_it)): same gradient as the paper's
    -w A log pi, and a value (-w A) that reads like the other surrogates. Every token keeps its
    gradient (no token is clipped out); eps_low >= 1 means no lower bound, as in the paper.
    """
    lr = _importance_log_ratio(logp, old_logp, mask)  # (b, T)
    ratio = torch.exp(lr).detach()  # (b, T) rho
    weight, clip_low, clip_high = clip_ratio(ratio, None, algo)  # (b, T) w = sg(clip(rho)), where truncated
    logp_v = _where_valid(logp, mask)  # (b, T)
    loss = -weight * adv * torch.exp(logp_v - logp_v.detach())  # (b, T) value -w A
    none = torch.zeros_like(mask, dtype=torch.bool)  # (b, T)
    return loss, {"ratio": ratio, "clip_low": clip_low, "clip_high": clip_high, "clip_dual": none}


def obj_cispo_seq(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """CISPO with GSPO's sequence ratio, as TRL 1.16 computes loss_type="cispo" with
    importance_sampling_level="sequence" (GRPOTrainer._compute_loss: the weight's shape (B, 1)):

        s_i   = exp( (1/|y_i|) sum_t m_it log rho_it )
        w_i   = sg( clip(s_i, 1 - eps_low, 1 + eps_high) )
        grad l_it = -w_i A_it grad log pi_theta(y_it)

    Written as l_it = -w_i A_it pi_theta(y_it) / sg(pi_theta(y_it)), like obj_cispo. Every token of a
    sequence has the same weight; no token is clipped out."""
    log_s = sequence_log_ratio(_importance_log_ratio(logp, old_logp, mask), mask)  # (b,) log s_i
    ratio = torch.exp(log_s).detach()[:, None].expand_as(logp)  # (b, T) s_i on every token
    weight, clip_low, clip_high = clip_ratio(ratio, None, algo)  # (b, T) w_i = sg(clip(s_i))
    logp_v = _where_valid(logp, mask)  # (b, T)
    loss = -weight * adv * torch.exp(logp_v - logp_v.detach())  # (b, T) value -w A
    none = torch.zeros_like(mask, dtype=torch.bool)  # (b, T)
    return loss, {"ratio": ratio, "clip_low": clip_low, "clip_high": clip_high, "clip_dual": none}


def clip_weight(ratio: Tensor, adv: Tensor, algo: AlgoConfig) -> Tensor:
    """obj_cispo: the weight is truncated on either side, whatever the sign of A."""
    _, low, high = clip_ratio(ratio, None, algo)
    return torch.where(low, -1, high.long())


LOG_W_MIN = math.log(1e-8)
"""Lower clamp of VESPO's log w (TRL's get_gamma_weights: log(1e-8), as the paper's code)."""


@torch.no_grad()
def vespo_weight(
    log_ratio: Tensor, adv_seq: Tensor, mask: Tensor, algo: AlgoConfig, token_weight: Tensor | None = None
) -> Tensor:
    """VESPO's Gamma weight of each sequence, phi(w_i) (b,), detached (TRL 1.16: GRPOTrainer.get_gamma_weights):

        log w_i = clamp( sum_t m_it clamp(log rho_it, -20, 20) [+ sum_t m_it log c_it], log 1e-8, 20 )
        (k, lambda) = (vespo_k_pos, vespo_lambda_pos) if A_i >= 0 else (vespo_k_neg, vespo_lambda_neg)
        phi(w) = e^lambda w^k e^(-lambda w) = exp( lambda + k log w - lambda w ),   phi(1) = 1,

    w_i the sequence's importance ratio (a product over its tokens, not GSPO's geometric mean); c_it the
    sampler correction's weight when another engine sampled (folded into w, as TRL folds vLLM's ratio
    in). lambda is clamped to >= 1e-4 and a non-finite phi is 0, as in TRL."""
    lr = _where_valid(log_ratio.clamp(-20.0, 20.0), mask).sum(dim=1)  # (b,) sum_t log rho_it
    if token_weight is not None:
        lw = torch.log(token_weight.float()).clamp(LOG_W_MIN, 20.0)  # (b, T)
        lr = lr + _where_valid(lw, mask).sum(dim=1)
    log_w = lr.clamp(LOG_W_MIN, 20.0)  # (b,)
    pos = adv_seq >= 0  # (b,)
    k = torch.where(pos, algo.vespo_k_pos, algo.vespo_k_neg)  # (b,)
    lam = torch.where(pos, algo.vespo_lambda_pos, algo.vespo_lambda_neg).clamp(min=1e-4)  # (b,)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))  # (b,)
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def obj_vespo(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig, token_weight: Tensor | None = None
) -> tuple[Tensor, dict]:
    """VESPO, Variational Sequence-level Soft Policy Optimization (arXiv 2602.10693), as TRL 1.16 computes
    it (trl/trainer/grpo_trainer.py, _compute_loss and get_gamma_weights, loss_type "vespo"): no clip; each
    sequence's policy gradient is scaled by the detached Gamma weight phi(w_i) of its importance ratio
    (`vespo_weight`), which is 1 on-policy and decays smoothly both for w -> 0 (w^k) and for large w
    (e^(-lambda w)):

        grad l_it = -phi(w_i) A_it grad log pi_theta(y_it).

    Written as l_it = -phi(w_i) A_it pi_theta(y_it) / sg(pi_theta(y_it)), like obj_cispo: the same
    gradient as TRL's -phi A log pi, and the value -phi A. The sampler correction's weight goes into
    w_i (token_weight), not onto the loss. The clip metrics stay 0; ratio holds phi(w_i).
    """
    lr = _importance_log_ratio(logp, old_logp, mask)  # (b, T)
    adv_seq = _where_valid(adv, mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (b,) A_i
    phi = vespo_weight(lr, adv_seq, mask, algo, token_weight)  # (b,)
    logp_v = _where_valid(logp, mask)  # (b, T)
    loss = -phi[:, None] * adv * torch.exp(logp_v - logp_v.detach())  # (b, T) value -phi A
    none = torch.zeros_like(mask, dtype=torch.bool)  # (b, T)
    return loss, {
        "ratio": phi[:, None].expand_as(logp).detach(),
        "clip_low": none,
        "clip_high": none,
        "clip_dual": none,
    }


__all__ = ["clip_weight", "obj_cispo", "obj_cispo_seq", "obj_vespo", "vespo_weight"]
