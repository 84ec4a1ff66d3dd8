"""The records of samples.jsonl (sample_records), with the per-token values of each written sample, for the
report's credit view (token_credit).

For completion row i of a step's Batch, the first `max_tokens` tokens of its completion stream get, as
parallel lists (one entry per token):

    text     the token decoded on its own (special tokens kept, so EOS shows)
    adv      the advantage the objective multiplied (sequence advantage repeated, or PPO's per token)
    logp     log pi_old(y_t): the log-prob under the policy that sampled it (temperature 1)
    ratio    pi_theta / pi_old in the last epoch's pass, exp(last_logp - old_logp): 1 when mu = 1
    entropy  entropy of pi_old at that position (nats)
    kl       the per-token KL estimate to the reference (algo.kl_estimator) of pi_old; null without one
    clip     0 not clipped, 1 clipped high, -1 clipped low, 2 dual-clipped: the objective's own decision
             for that ratio (grpolab.algo.losses.clip_decision, registered beside each objective)

A multi-turn row (Rollout.env_mask) interleaves the model's turns with the environment's tokens (tool
results, replies, the template's role headers): the stream shows both, in place, `n` counts both, `n_env`
the environment's, and `env` (true at an environment token) says whose each shown token is. An
environment token is context, never a sample: its adv, logp, ratio, entropy, kl and clip are null. A
single-turn record has neither `env` nor `n_env`.

The ratio is the objective's (grpolab.algo.losses.shown_ratio: per token, or GSPO's one per sequence).
A row of a group that the update skipped (grpolab.training.update.computed_groups: all advantages 0, no
KL term in the loss, an advantage component that does not need every group) was never computed:
`computed` is false and logp, ratio, entropy, kl and clip are null, never zeros.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from grpolab.algo.advantages import per_token
from grpolab.algo.kl import kl_per_token
from grpolab.algo.losses import SEQUENCE_RATIO, clip_decision, shown_ratio
from grpolab.algo.presets import AlgoConfig
from grpolab.batch import Batch
from grpolab.training.update import computed_groups, every_group

if TYPE_CHECKING:
    from grpolab.training.run import Run


def _r(x: float) -> float | None:
    """4 decimals (the view needs no more, and samples.jsonl stays small); None for a non-number."""
    return round(x, 4) if math.isfinite(x) else None


def _at(model: list[bool], vals: list) -> list:
    """The values at the model's tokens, null at the environment's."""
    return [v if m else None for v, m in zip(vals, model)]


def token_credit(
    batch: Batch, rows: list[int], tokenizer, algo: AlgoConfig, max_tokens: int, *, computes_every_group: bool
) -> list[dict]:
    """The per-token record (see the module docstring) of each row in `rows`. computes_every_group:
    the run's advantage component's (run.advantage.computes_every_group: a critic computes every group)."""
    rollout = batch.rollout
    N, C = rollout.completion_ids.shape
    mask = rollout.completion_mask  # (N, C) the model's tokens
    env = rollout.env_mask  # (N, C) the environment's, or None (single-turn)
    present = rollout.attention_mask  # (N, C) the whole stream: model + environment
    adv = per_token(batch.adv, (N, C)).float()  # (N, C)
    have = batch.old_logp is not None and batch.last_logp is not None and batch.entropy is not None
    computed = (
        computed_groups(batch, algo, computes_every_group).repeat_interleave(rollout.G)
        if have
        else torch.zeros(N, dtype=torch.bool)
    )  # (N,)
    out = []
    for i in rows:
        n = int(present[i].sum())  # the stream is contiguous from position 0
        t = min(n, max_tokens)
        ids = rollout.completion_ids[i, :t].tolist()
        model = (mask[i, :t] > 0).tolist()  # the model's tokens among those shown
        rec = {
            "n": n,
            "shown": t,
            "computed": bool(computed[i]),
            "text": [tokenizer.decode([x], skip_special_tokens=False) for x in ids],
            "adv": _at(model, [_r(float(a)) for a in adv[i, :t]]),
            "logp": None,
            "ratio": None,
            "entropy": None,
            "kl": None,
            "clip": None,
        }
        if env is not None:
            rec["n_env"] = int(env[i].sum())
            rec["env"] = [bool(e) for e in (env[i, :t] > 0).tolist()]
        if rec["computed"]:
            old = batch.old_logp[i, :t].float()  # (t,)
            log_ratio = (batch.last_logp[i] - batch.old_logp[i]).float()  # (C,)
            if env is not None and algo.objective in SEQUENCE_RATIO:  # s_i over the model's tokens only
                ratio = shown_ratio(log_ratio[mask[i] > 0], int(mask[i].sum()), t, algo)  # (t,)
            else:
                ratio = shown_ratio(log_ratio, n, t, algo)  # (t,)
            rec.update(
                logp=_at(model, [_r(float(x)) for x in old]),
                ratio=_at(model, [_r(float(x)) for x in ratio]),
                entropy=_at(model, [_r(float(x)) for x in batch.entropy[i, :t]]),
                clip=_at(model, clip_decision(ratio, adv[i, :t], algo).tolist()),
            )
            if batch.ref_logp is not None:
                kl = kl_per_token(
                    old[None], batch.ref_logp[i, :t].float()[None], mask[i, :t].float()[None], algo.kl_estimator
                )[0]  # (t,)
                rec["kl"] = _at(model, [_r(float(x)) for x in kl])
        out.append(rec)
    return out


def sample_records(batch: Batch, step: int, k: int, *, run: Run | None = None) -> list[dict]:
    """The first `k` completions of the step: prompt, answer, the verifiers' reward (`reward`, and per
    function under `rewards`) and the shaped reward the advantages were computed from (`reward_shaped`).
    With `run` (and run.cfg.sample_tokens > 0), each also gets `tokens`: the per-token advantage,
    log-prob, ratio and clip decision, entropy and KL of its first sample_tokens tokens
    (token_credit, for the report's credit view). A multi-turn row also gets
    `conversation` (the messages after the prompt: assistant, tool and user turns), and `stop` (why it
    ended) where the rollout records it (`stops`)."""
    rollout = batch.rollout
    out = []
    for i in range(min(k, len(rollout.texts))):
        ex = batch.examples[i // rollout.G]
        out.append(
            {
                "step": step,
                "id": ex.id,
                "prompt": ex.prompt,
                "answer": ex.answer,
                "completion": rollout.texts[i],
                "reward": float(batch.raw_reward[i]),
                "reward_shaped": float(batch.reward[i]),
                "rewards": {name: v[i] for name, v in batch.reward_by_fn.items()},
                "length": int(rollout.completion_mask[i].sum()),
                "truncated": bool(rollout.truncated[i]),
                **({"extra": {c: v[i] for c, v in batch.extra.items()}} if batch.extra else {}),
            }
        )
        if rollout.conversations is not None:  # multi-turn: the messages after the prompt, and why it ended
            out[-1]["conversation"] = json.loads(json.dumps(rollout.conversations[i], default=str))
            stops = rollout.stops  # per row, in a multi-turn run
            if stops is not None:
                out[-1]["stop"] = stops[i]
    limit = run.cfg.sample_tokens if run is not None else 0
    if out and limit > 0 and batch.adv is not None:
        credit = token_credit(
            batch, list(range(len(out))), run.tokenizer, run.cfg.algo, limit, computes_every_group=every_group(run)
        )
        for rec, tokens in zip(out, credit):
            rec["tokens"] = tokens
    return out


__all__ = ["sample_records", "token_credit"]
