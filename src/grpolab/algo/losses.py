"""Policy objectives and loss aggregations: per-token losses in, one scalar (and its metrics) out.

    policy_loss = AGGREGATIONS[algo.aggregation]( OBJECTIVES[algo.objective](...) + beta * k_t )

Notation (docs/algorithms.md): tokens t of completion i with mask m_it, |y_i| = sum_t m_it, advantage
A_i (or A_it for PPO), importance ratio rho_it = pi_theta(y_it) / pi_old(y_it) = exp(logp - old_logp).
On-policy (one update per rollout, old_logp = logp.detach()) every ratio is 1 but its gradient is
grad log pi_theta: that is how the surrogates below carry the policy gradient.

Objectives: fn(logp, old_logp, adv, mask, algo) -> (loss_tok (b,T), info) where adv is (b,T)
(a sequence advantage broadcast over its tokens) and info holds detached (b,T) tensors
"ratio", "clip_low", "clip_high", "clip_dual" (bool: where a clip bound changed the term).

Aggregations: fn(loss_tok, mask, n_seq, n_tok, max_len) -> scalar. n_seq / n_tok count the sequences /
valid tokens of the whole optimizer batch, so the loss of a batch is the sum of its micro-batches'
losses (gradient accumulation needs no rescaling).

Numerics: padding positions may hold anything (0, -inf, NaN): they are replaced before any exp and
masked with torch.where, never multiplied by the mask, so they cannot leak NaN. The log-ratio is
clamped to +-LR_CLAMP (20) before exp; beyond that a clipped objective gives no gradient anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # the settings type only; grpolab.algo.presets imports no registry, nor this module
    from grpolab.algo.presets import AlgoConfig
from grpolab.algo.entropy import entropy_bonus
from grpolab.algo.kl import kl_per_token
from grpolab.algo.masks import policy_masks
from grpolab.algo.ratios import _importance_log_ratio, _where_valid, clip_ratio, masked_mean, sequence_log_ratio
from grpolab.algo.weights import clip_weight, obj_cispo, obj_cispo_seq, obj_vespo, vespo_weight


def _clipped_surrogate(ratio: Tensor, adv: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), optionally dual-clipped; see obj_clipped."""
    clipped_ratio, clip_low, clip_high = clip_ratio(ratio, adv, algo)  # (b, T) x 3
    surr1 = ratio * adv  # (b, T) unclipped
    surr2 = clipped_ratio * adv  # (b, T) clipped
    use_clip = surr2 < surr1  # (b, T) the min is the clipped term (gradient 0): where clip_ratio marks the token,
    loss = -torch.where(use_clip, surr2, surr1)  # (b, T) bar float ties (rho A = clip(rho) A when rounded)
    info = {"ratio": ratio.detach(), "clip_low": clip_low & use_clip, "clip_high": clip_high & use_clip}
    info["clip_dual"] = torch.zeros_like(clip_low)
    if algo.dual_clip is not None:
        bound = -algo.dual_clip * adv  # (b, T) for A < 0: the loss may not exceed -c A = c |A|
        dual = (adv < 0) & (loss > bound)  # (b, T) only reachable with rho > c
        loss = torch.where(dual, bound, loss)  # (b, T) constant there: gradient 0
        info["clip_dual"] = dual.detach()
    return loss, info


def obj_pg(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """Vanilla policy gradient as the unclipped importance-sampled surrogate (Kakade & Langford 2002):

        l_it = -rho_it A_it,     grad l_it = -rho_it A_it grad log pi_theta(y_it).

    On-policy rho = 1 and this is REINFORCE (Williams 1992): -A grad log pi. Unlike -A * logp, its value
    (-A) and its off-policy gradient stay correct when mu > 1. No clipping: nothing bounds the step.
    """
    ratio = torch.exp(_importance_log_ratio(logp, old_logp, mask))  # (b, T)
    loss = -ratio * adv  # (b, T)
    none = torch.zeros_like(mask, dtype=torch.bool)  # (b, T)
    return loss, {"ratio": ratio.detach(), "clip_low": none, "clip_high": none, "clip_dual": none}


def obj_clipped(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), as in GRPO (Shao et al. 2024, eq. 3) and
    with DAPO's clip-higher (Yu et al. 2025, eq. 10: eps_high > eps_low):

        l_it = -min( rho_it A_it, clip(rho_it, 1 - eps_low, 1 + eps_high) A_it ).

    Where the clipped term is the smaller (A > 0 and rho > 1 + eps_high, or A < 0 and rho < 1 - eps_low)
    the term is constant in theta: that token contributes no gradient.
    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games", eq. 5), for A < 0 only:
    l_it = min(l_it, -c A_it) with c = algo.dual_clip > 1 -- bounds the loss of a bad token whose
    ratio exploded.
    """
    ratio = torch.exp(_importance_log_ratio(logp, old_logp, mask))  # (b, T)
    return _clipped_surrogate(ratio, adv, algo)


def obj_gspo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", eqs. 5-7 and the GSPO-token form, eq. 13):

        s_i  = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp( (1/|y_i|) sum_t m_it log rho_it )
        s_it = sg(s_i) * pi_theta(y_it) / sg(pi_theta(y_it))        (value s_i, gradient of token t)
        l_it = -min( s_it A_i, clip(s_it, 1 - eps_low, 1 + eps_high) A_i )

    The clip acts on the sequence ratio: a sequence is kept or dropped whole. With a sequence advantage
    and the seq_mean aggregation, the gradient is exactly GSPO's:
    -(1/|y_i|) s_i A_i sum_t grad log pi_theta(y_it) = grad(-s_i A_i). The token form also accepts
    per-token advantages.
    """
    log_s = sequence_log_ratio(_importance_log_ratio(logp, old_logp, mask), mask)  # (b,) log s_i
    logp_v = _where_valid(logp, mask)  # (b, T)
    ratio = torch.exp(log_s.detach()[:, None] + logp_v - logp_v.detach())  # (b, T) s_it: value s_i
    return _clipped_surrogate(ratio, adv, algo)


def obj_sapo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, algo: AlgoConfig) -> tuple[Tensor, dict]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347), as TRL 1.16 computes
    it (trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss, loss_type "sapo"): the hard clip is
    replaced by a smooth gate of the token ratio,

        tau_it = sapo_temperature_pos if A_it > 0 else sapo_temperature_neg
        f_it   = sigmoid( tau_it (rho_it - 1) ) * 4 / tau_it
        l_it   = -f_it A_it,      grad l_it = -4 s (1 - s) rho_it A_it grad log pi_theta(y_it),  s = sigmoid(.)

    On-policy (rho = 1) f = 2 / tau and the gradient is exactly the policy gradient -A grad log pi (the
    gate's slope there is 4 s (1 - s) = 1); away from 1 the gate's slope decays smoothly instead of
    dropping to 0, faster for a larger tau (the paper damps negative tokens more: tau_neg 1.05 > tau_pos 1).
    Nothing is clipped, so the clip metrics stay 0.
    """
    ratio = torch.exp(_importance_log_ratio(logp, old_logp, mask))  # (b, T)
    tau = torch.where(adv > 0, algo.sapo_temperature_pos, algo.sapo_temperature_neg)  # (b, T)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau  # (b, T) f
    loss = -gate * adv  # (b, T)
    none = torch.zeros_like(mask, dtype=torch.bool)  # (b, T)
    return loss, {"ratio": ratio.detach(), "clip_low": none, "clip_high": none, "clip_dual": none}


OBJECTIVES: dict[str, Callable[..., tuple[Tensor, dict]]] = {
    "pg": obj_pg,
    "clipped": obj_clipped,
    "gspo": obj_gspo,
    "cispo": obj_cispo,
    "cispo_seq": obj_cispo_seq,
    "sapo": obj_sapo,
    "vespo": obj_vespo,
}
"""name -> fn(logp, old_logp, adv (b,T), mask, algo) -> (per-token loss (b,T), info)."""


# --- each objective's clip decision, token by token (the report's credit view) ------------------------
# Codes: 0 not clipped, 1 clipped high, -1 clipped low, 2 dual-clipped: the regions where the objective's
# info says clip_high / clip_low / clip_dual.


def clip_never(ratio: Tensor, adv: Tensor, algo: AlgoConfig) -> Tensor:
    """obj_pg: nothing bounds the ratio, every code is 0."""
    return torch.zeros_like(ratio, dtype=torch.long)


def clip_surrogate(ratio: Tensor, adv: Tensor, algo: AlgoConfig) -> Tensor:
    """obj_clipped and obj_gspo (whose ratio is the sequence's s_i): clipped where the clipped term is
    the smaller one, A > 0 and ratio > 1 + eps_high (1) or A < 0 and ratio < 1 - eps_low (-1); with a
    dual clip c, A < 0 and ratio > c (2)."""
    _, low, high = clip_ratio(ratio, adv, algo)
    code = torch.where(low, -1, high.long())
    if algo.dual_clip is not None:
        code[(adv < 0) & (ratio > algo.dual_clip)] = 2
    return code


CLIP_DECISIONS: dict[str, Callable[[Tensor, Tensor, AlgoConfig], Tensor]] = {
    "pg": clip_never,
    "clipped": clip_surrogate,
    "gspo": clip_surrogate,
    "cispo": clip_weight,
    "cispo_seq": clip_weight,
    "sapo": clip_never,
    "vespo": clip_never,
}
"""objective name -> fn(ratio (t,), adv (t,), algo) -> clip codes (t,) long."""

SEQUENCE_RATIO: set[str] = {"gspo", "cispo_seq"}
"""Objectives whose ratio is one per sequence, s_i = exp(mean_t log rho_it), not one per token."""

WEIGHT_IN_OBJECTIVE: set[str] = {"vespo"}
"""Objectives that take the sampler correction's weight themselves (token_weight=...), instead of
policy_loss multiplying their per-token loss by it."""


def register_objective(
    name: str,
    loss: Callable[..., tuple[Tensor, dict]],
    clip: Callable[[Tensor, Tensor, AlgoConfig], Tensor],
    *,
    sequence_ratio: bool = False,
) -> None:
    """Add (or replace) objective `name`: its loss, its clip decision, and whether its ratio is per
    sequence. Everything that reads an objective (policy_loss, the config's choices, the report's
    credit view) then knows it."""
    OBJECTIVES[name] = loss
    CLIP_DECISIONS[name] = clip
    if sequence_ratio:
        SEQUENCE_RATIO.add(name)
    else:
        SEQUENCE_RATIO.discard(name)


def clip_decision(ratio: Tensor, adv: Tensor, algo: AlgoConfig) -> Tensor:
    """(t,) long: algo.objective's clip decision for these ratios and advantages (codes above)."""
    if algo.objective not in CLIP_DECISIONS:
        raise ValueError(f"objective {algo.objective!r} has no clip decision; register it with register_objective")
    return CLIP_DECISIONS[algo.objective](ratio, adv, algo)


def shown_ratio(log_ratio: Tensor, n: int, t: int, algo: AlgoConfig) -> Tensor:
    """The ratio (t,) algo.objective applies to the first t tokens of a completion of n tokens, from
    log_ratio (>= n,) = log pi_theta - log pi_old: per token, or the sequence's s_i repeated."""
    if algo.objective in SEQUENCE_RATIO:
        return torch.exp(log_ratio[:n].mean()).expand(t)  # (t,) s_i (obj_gspo)
    return torch.exp(log_ratio[:t])  # (t,)


# --- aggregations --------------------------------------------------------------------------------------


def agg_seq_mean(loss_tok: Tensor, mask: Tensor, n_seq: int, n_tok: int, max_len: int) -> Tensor:
    """GRPO paper (Shao et al. 2024, eq. 3): (1/G) sum_i (1/|y_i|) sum_t l_it, over the batch's n_seq
    sequences. Each sequence weighs the same, so a token of a long answer weighs less (the length bias
    Dr. GRPO points out)."""
    length = mask.sum(dim=1).clamp(min=1)  # (b,) |y_i|
    per_seq = _where_valid(loss_tok, mask).sum(dim=1) / length  # (b,)
    return per_seq.sum() / n_seq


def agg_token_mean(loss_tok: Tensor, mask: Tensor, n_seq: int, n_tok: int, max_len: int) -> Tensor:
    """DAPO token-level loss (Yu et al. 2025, eq. 12): sum_i sum_t l_it / sum_i |y_i| -- every token of
    the batch weighs the same."""
    return _where_valid(loss_tok, mask).sum() / n_tok


def agg_token_sum_norm(loss_tok: Tensor, mask: Tensor, n_seq: int, n_tok: int, max_len: int) -> Tensor:
    """Dr. GRPO (Liu et al. 2025, sec. 3.2 / Appendix): sum_i sum_t l_it / (n_seq * max_len), a constant
    denominator, so neither the sequence length nor the batch's token count rescales a token's gradient."""
    return _where_valid(loss_tok, mask).sum() / (n_seq * max_len)


def agg_seq_sum(loss_tok: Tensor, mask: Tensor, n_seq: int, n_tok: int, max_len: int) -> Tensor:
    """REINFORCE / RLOO on whole sequences: (1/n_seq) sum_i sum_t l_it. With the pg objective on-policy
    the gradient is -(1/n_seq) sum_i A_i grad log pi(y_i), log pi(y_i) = sum_t log pi(y_it): the
    textbook Monte-Carlo estimator (tests/test_unbiased.py)."""
    return _where_valid(loss_tok, mask).sum() / n_seq


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "seq_mean": agg_seq_mean,
    "token_mean": agg_token_mean,
    "token_sum_norm": agg_token_sum_norm,
    "seq_sum": agg_seq_sum,
}
"""name -> fn(loss_tok (b,T), mask (b,T), n_seq, n_tok, max_len) -> scalar."""


# --- the entry point -------------------------------------------------------------------------------------


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    algo: AlgoConfig,
    *,
    ref_logp: Tensor | None = None,
    n_seq: int,
    n_tok: int,
    max_len: int,
    beta: float | None = None,
    token_weight: Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float | None = None,
    sampler_logp: Tensor | None = None,
    masks: dict[str, Tensor] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Loss of one micro-batch and its metrics.

        loss = AGG( w_it * l_it + [algo.kl_in_loss] * beta * k_t )  -  entropy_coef * sum_it m_it H_it / n_tok

    over valid tokens. The entropy bonus (TRL 1.16 GRPOConfig.entropy_coef: L = L_policy - coef * H, H the
    mean per-token entropy whatever the aggregation) is the mean over the optimizer batch's n_tok tokens,
    so that micro-batches add up; TRL takes each micro-batch's own mean divided by the accumulation
    steps, the same number when micro-batches hold equal token counts.

    logp     (b,T) current-policy token log-probs (requires grad)
    old_logp (b,T) log-probs of the policy that sampled (or of theta_old when mu > 1); detached here
    adv      (b,) sequence advantage, or (b,T) per-token advantage (PPO/GAE); detached here
    mask     (b,T) float, 1 = real completion token
    ref_logp (b,T) reference log-probs, or None (no reference model)
    n_seq, n_tok: sequences / valid tokens of the whole optimizer batch (micro-batch losses add up)
    max_len:  the max_new_tokens constant (token_sum_norm)
    beta:     overrides algo.beta (the current value of an AdaptiveKL)
    token_weight (b,T) w_it, the sampler correction's importance weight (grpolab.algo.sampler), or
              None (w = 1: the tokens were sampled by the trainer's own weights); detached here
    entropy  (b,T) H_it, the policy's entropy at each position with its gradient; needed when
              algo.entropy_coef != 0, algo.adaptive_entropy or algo.top_entropy_quantile < 1
    entropy_coef: overrides algo.entropy_coef (the coefficient an AdaptiveEntropy applies now)
    sampler_logp (b,T) log-probs of the engine that sampled, for algo.off_policy_mask (None: old_logp)
    masks:    the policy term's token masks (grpolab.algo.masks.policy_masks; None: computed here from algo);
              each multiplies l_it, "entropy" also restricts the entropy bonus to its tokens

    Metrics are floats, each a mean over this micro-batch's valid tokens (0.0 when it has none):
    loss/policy (the objective without KL), kl (mean k_t; only when ref_logp is given), loss/kl
    (beta * kl when the KL is in the loss, else 0), clip/frac, clip/low_frac, clip/high_frac, clip/dual_frac,
    ratio/mean, approx_kl (mean of (rho - 1) - log rho: KL(old || new), Schulman 2020), adv/mean, and
    with an entropy bonus loss/entropy (entropy_coef * the mean entropy) and loss/entropy_term (the bonus
    subtracted from this micro-batch's loss, a sum and not a mean: loss + loss/entropy_term is the loss
    without the bonus, TRL's policy_loss).
    """
    if algo.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {algo.objective!r}; known: {', '.join(sorted(OBJECTIVES))}")
    if algo.aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {algo.aggregation!r}; known: {', '.join(sorted(AGGREGATIONS))}")
    if n_seq < 1 or max_len < 1:
        raise ValueError(f"n_seq and max_len must be >= 1, got n_seq={n_seq}, max_len={max_len}")
    n_tok = max(int(n_tok), 1)
    logp = logp.float()  # (b, T) fp32 maths whatever the model dtype
    old_logp = old_logp.detach().float()  # (b, T)
    mask = mask.float()  # (b, T)
    adv = adv.detach().float()
    adv_tok = (adv[:, None] if adv.dim() == 1 else adv).expand_as(logp)  # (b, T)
    adv_tok = _where_valid(adv_tok, mask)  # (b, T)

    weight = None if token_weight is None else token_weight.detach().float()  # (b, T)
    if weight is not None and algo.objective in WEIGHT_IN_OBJECTIVE:
        loss_tok, info = OBJECTIVES[algo.objective](logp, old_logp, adv_tok, mask, algo, token_weight=weight)
    else:
        loss_tok, info = OBJECTIVES[algo.objective](logp, old_logp, adv_tok, mask, algo)  # (b, T)
        if weight is not None:  # the sampler was not the trainer: w_it l_it
            loss_tok = loss_tok * _where_valid(weight, mask)  # (b, T)
    if masks is None:
        sampled = old_logp if sampler_logp is None else sampler_logp.detach().float()
        masks = policy_masks(algo, adv=adv_tok, logp=logp, sampler_logp=sampled, mask=mask, entropy=entropy)
    for keep in masks.values():  # top-entropy tokens, DeepSeek-V3.2's off-policy sequences: l_it * M_it
        loss_tok = loss_tok * keep  # (b, T)
    total_tok = loss_tok  # (b, T)

    beta = algo.beta if beta is None else float(beta)
    kl_tok = None
    if ref_logp is not None:
        kl_tok = kl_per_token(logp, ref_logp.detach().float(), mask, algo.kl_estimator)  # (b, T)
        if beta > 0 and algo.kl_in_loss:
            weighted = (
                kl_tok * torch.exp(_importance_log_ratio(logp, old_logp, mask)) if algo.kl_ratio_weight else kl_tok
            )  # (b, T) rho_it * k_t: TRL's use_bias_correction_kl
            total_tok = loss_tok + beta * weighted  # (b, T)

    loss = AGGREGATIONS[algo.aggregation](total_tok, mask, n_seq=n_seq, n_tok=n_tok, max_len=max_len)
    coef = algo.entropy_coef if entropy_coef is None else float(entropy_coef)
    bonus = None
    if coef != 0.0:
        if entropy is None:
            raise ValueError("algo.entropy_coef needs the policy's entropy (entropy=..., with its gradient)")
        bonus = entropy_bonus(entropy.float(), mask, n_tok, coef, masks.get("entropy"))
        loss = loss - bonus

    with torch.no_grad():
        log_ratio = _importance_log_ratio(logp.detach(), old_logp, mask)  # (b, T)
        clip_low, clip_high, clip_dual = info["clip_low"], info["clip_high"], info["clip_dual"]
        metrics = {
            "loss/policy": masked_mean(loss_tok.detach(), mask),
            "clip/frac": masked_mean(clip_low | clip_high | clip_dual, mask),
            "clip/low_frac": masked_mean(clip_low, mask),
            "clip/high_frac": masked_mean(clip_high, mask),
            "clip/dual_frac": masked_mean(clip_dual, mask),
            "ratio/mean": masked_mean(info["ratio"], mask),
            "approx_kl": masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask),
            "adv/mean": masked_mean(adv_tok, mask),
            "loss/kl": 0.0,
        }
        if kl_tok is not None:  # the KL to the reference, measured where it is used
            metrics["kl"] = masked_mean(kl_tok, mask)
            metrics["loss/kl"] = beta * metrics["kl"] if algo.kl_in_loss else 0.0
        if bonus is not None:
            metrics["loss/entropy"] = coef * masked_mean(entropy.detach(), mask * masks.get("entropy", 1.0))
            metrics["loss/entropy_term"] = float(bonus.detach())
        for name, keep in masks.items():  # the share of valid tokens each mask drops
            metrics[f"mask/{name}_dropped_frac"] = 1.0 - masked_mean(keep, mask)
    return loss, metrics


__all__ = [
    "AGGREGATIONS",
    "CLIP_DECISIONS",
    "OBJECTIVES",
    "SEQUENCE_RATIO",
    "WEIGHT_IN_OBJECTIVE",
    "clip_decision",
    "clip_ratio",
    "masked_mean",
    "policy_loss",
    "vespo_weight",
]
__all__ += ["clip_ratio", "entropy_bonus", "masked_mean", "policy_loss", "register_objective", "shown_ratio"]
__all__ += ["vespo_weight"]
