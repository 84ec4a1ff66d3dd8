"""Per-token values of a written sample, for the report's credit view (saved in samples.jsonl).

For completion row i of a step's Batch, the first `max_tokens` completion tokens get, as parallel
lists (one entry per token):

    text     the token decoded on its own (special tokens kept, so EOS shows)
    adv      the advantage the objective multiplied (sequence advantage repeated, or PPO's per token)
    logp     log pi_old(y_t): the log-prob under the policy that sampled it (temperature 1)
    ratio    pi_theta / pi_old in the last epoch's pass, exp(last_logp - old_logp): 1 when mu = 1
    entropy  entropy of pi_old at that position (nats)
    kl       the per-token KL estimate to the reference (algo.kl_estimator) of pi_old; null without one
    clip     0 not clipped, 1 clipped high, -1 clipped low, 2 dual-clipped: the objective's decision
             for that ratio (grpolab.algo.losses): clipped/gspo clip where the clipped term is the smaller
             one (A > 0 and ratio > 1 + eps_high, A < 0 and ratio < 1 - eps_low); cispo truncates the
             weight on either side; pg never clips

A row of a group that the update skipped (all advantages 0, no KL term in the loss, no critic) was
never computed: `computed` is false and logp, ratio, entropy, kl and clip are null, never zeros.
"""

from __future__ import annotations

import math

import torch


def _r(x: float) -> float | None:
    """4 decimals (the view needs no more, and samples.jsonl stays small); None for a non-number."""
    return round(x, 4) if math.isfinite(x) else None


def _computed_rows(batch, algo) -> torch.Tensor:
    """(N,) bool: the rows update() ran through the policy (grpolab.training.step.update's rule: a group with
    any nonzero advantage, or every group when a KL term in the loss or a critic needs it)."""
    rollout = batch.rollout
    N, C = rollout.completion_ids.shape
    adv = batch.adv if batch.adv.dim() == 2 else batch.adv[:, None].expand(N, C)  # (N, C)
    signal = ((adv.abs() * rollout.completion_mask).sum(-1) > 0).view(-1, rollout.G).any(-1)  # (B,)
    every = bool(algo.uses_critic) or (batch.ref_logp is not None and algo.kl_placement == "in_loss")
    return (signal | every).repeat_interleave(rollout.G)  # (N,)


def _clip_codes(ratio: torch.Tensor, adv: torch.Tensor, algo) -> torch.Tensor:
    """(T,) int: the clip decision of algo.objective for these ratios and advantages."""
    lo, hi = 1.0 - algo.eps_low, 1.0 + algo.eps_high
    code = torch.zeros_like(ratio, dtype=torch.long)
    if algo.objective == "pg":
        return code
    if algo.objective == "cispo":
        code[ratio > hi] = 1
        code[ratio < lo] = -1
        return code
    code[(adv > 0) & (ratio > hi)] = 1
    code[(adv < 0) & (ratio < lo)] = -1
    if algo.dual_clip is not None:
        code[(adv < 0) & (ratio > algo.dual_clip)] = 2
    return code


def token_credit(batch, rows: list[int], tokenizer, algo, max_tokens: int) -> list[dict]:
    """The per-token record (see the module docstring) of each row in `rows`."""
    from grpolab.algo.kl import kl_per_token

    rollout = batch.rollout
    N, C = rollout.completion_ids.shape
    mask = rollout.completion_mask  # (N, C)
    adv = (batch.adv if batch.adv.dim() == 2 else batch.adv[:, None].expand(N, C)).float()  # (N, C)
    have = batch.old_logp is not None and batch.last_logp is not None and batch.entropy is not None
    computed = _computed_rows(batch, algo) if have else torch.zeros(N, dtype=torch.bool)
    out = []
    for i in rows:
        n = int(mask[i].sum())
        t = min(n, max_tokens)
        ids = rollout.completion_ids[i, :t].tolist()
        rec = {"n": n, "shown": t, "computed": bool(computed[i]),
               "text": [tokenizer.decode([x], skip_special_tokens=False) for x in ids],
               "adv": [_r(float(a)) for a in adv[i, :t]],
               "logp": None, "ratio": None, "entropy": None, "kl": None, "clip": None}
        if rec["computed"]:
            old, last = batch.old_logp[i, :t].float(), batch.last_logp[i, :t].float()  # (t,)
            if algo.objective == "gspo":  # one sequence ratio s_i for every token (losses.obj_gspo)
                ratio = torch.exp((batch.last_logp[i] - batch.old_logp[i])[: n].float().mean()).expand(t)
            else:
                ratio = torch.exp(last - old)  # (t,)
            rec.update(logp=[_r(float(x)) for x in old], ratio=[_r(float(x)) for x in ratio],
                       entropy=[_r(float(x)) for x in batch.entropy[i, :t]],
                       clip=_clip_codes(ratio, adv[i, :t], algo).tolist())
            if batch.ref_logp is not None:
                kl = kl_per_token(old[None], batch.ref_logp[i, :t].float()[None], mask[i, :t].float()[None],
                                  algo.kl_estimator)[0]  # (t,)
                rec["kl"] = [_r(float(x)) for x in kl]
        out.append(rec)
    return out


__all__ = ["token_credit"]
