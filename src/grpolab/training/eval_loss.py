"""The training loss of a held-out batch: what the update would take on it, without a gradient (TRL's eval_loss).

TRL's evaluation scores each batch of eval completions with compute_loss, the policy that sampled them being
the one scored: log pi_old = log pi_theta, every ratio is 1. The same here, on an evaluation chunk's rollout
and scores: the chunk's rewards shaped and turned into advantages as a step's are (grpolab.training.step.shape,
the run's advantage component), one no-grad pass of the policy over its groups, and grpolab.algo.losses.
policy_loss with old = the pass's own log-probs:

    L = AGG( l_it(rho = 1, A_i) )  -  entropy_coef * mean_t H_t  +  c * aux

The objective's own terms at rho = 1 (-A for the clipped family, -sg(min(1, eps_high)) A log pi for CISPO, ...)
are kept as they are; c * aux is a mixture of experts' router load-balancing term (grpolab.model.moe: the mean
of its micro-batches' aux, TRL's aux of the batch when the chunk is one micro-batch). The loss is defined only
where it needs nothing the evaluation does not have: `eval_loss_applies` (no KL to a reference, no critic).
"""

from __future__ import annotations

import torch

from grpolab.algo.losses import policy_loss
from grpolab.batch import Batch
from grpolab.model.moe import RouterLogits
from grpolab.model.passes import all_groups, micro_batches, policy_logp, slice_groups
from grpolab.rewards.scoring import Scores
from grpolab.training.run import Run
from grpolab.training.step import shape
from grpolab.training.update import loss_mask, needs_entropy


def eval_loss_applies(run: Run) -> bool:
    """Whether the held-out loss is the training loss: no KL term (beta 0, no adaptive KL: evaluation has no
    reference) and no critic (evaluation has no value model: the advantage is the group's)."""
    algo = run.cfg.algo
    return algo.beta == 0.0 and not algo.adaptive_kl and not run.advantage.computes_every_group


@torch.no_grad()
def batch_loss(run: Run, examples: list, rollout, scores: Scores) -> tuple[float, int]:
    """(the loss of the chunk, its completions): the advantages of its rewards, the policy's pass over its
    groups in micro-batches (whole groups), policy_loss at rho = 1 summed over them (the normalisers are the
    chunk's: n_seq completions, n_tok loss tokens)."""
    algo = run.cfg.algo
    raw = torch.tensor(scores.total, dtype=torch.float32)  # (N,)
    batch = Batch(examples, rollout, raw, scores.per_fn, extra=scores.extra)
    shape(run, batch)
    adv = run.advantage.targets(run.pass_spec, batch)  # (N,) or (N, C)
    lmask = loss_mask(rollout, algo)  # (N, C)
    n_seq, n_tok = int(lmask.shape[0]), int(lmask.sum())
    control = run.components.get("entropy_control")  # the coefficient the next update would apply
    total = 0.0
    aux = run.pass_spec.router  # an MoE's load-balancing term, or None
    batches = micro_batches(rollout, all_groups(rollout), run.pass_spec.micro_batch)
    for rows in batches:
        sl = slice_groups(rollout, rows, run.device)
        router = RouterLogits() if aux is not None else None
        logp, ent = policy_logp(run.pass_spec, run.policy, sl, with_entropy=needs_entropy(algo), router=router)
        a = adv[rows] if adv.dim() == 1 else adv[rows, : sl.width]
        loss, _ = policy_loss(
            logp,
            logp,
            a.to(run.device),
            lmask[rows, : sl.width].to(run.device),
            algo,
            n_seq=n_seq,
            n_tok=n_tok,
            max_len=run.cfg.max_completion_tokens,
            entropy=ent,
            entropy_coef=control.applied if control is not None else None,
        )
        total += float(loss)
        if router is not None:  # TRL's evaluation adds c * aux, not divided (no accumulation)
            total += aux.coef * float(aux.loss(router)) / len(batches)
    return total, n_seq


__all__ = ["batch_loss", "eval_loss_applies"]
