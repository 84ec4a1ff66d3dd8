"""The step's last stage, update(run, batch): `algo.mu` epochs of AdamW updates of the policy objective
over one Batch whose advantages are set (grpolab.training.step runs it after collect -> reference ->
shape -> advantages).

    u = plan_update(run, batch)               the parts (steps_per_generation), their micro-batches of
                                              whole computed groups (computed_groups), the loss mask
    for each epoch, each part:
        micro_batch_pass -> record_first_pass (first epoch: log pi_old, correction weights, entropy)
                         -> micro_batch_loss  (policy_loss + a critic's value loss + an MoE's router
                                              load-balancing term, backpropagated)
        optimizer_step                        (fp16: unscale) clip, AdamW, schedule, critic, reference
                                              sync; a non-finite update (fp16: an overflow) is skipped
                                              and counted
    update_metrics(run, batch, u)             the update's report
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from grpolab.algo.advantages import per_token
from grpolab.algo.losses import policy_loss
from grpolab.algo.masks import policy_masks
from grpolab.algo.presets import AlgoConfig
from grpolab.algo.sampler import correction_weights, mismatch_metrics
from grpolab.batch import Batch, Rollout
from grpolab.model.loss_scale import LOSS_SCALE, finish_step, scale_loss, scale_of, unscale_and_clip
from grpolab.model.moe import RouterLogits
from grpolab.model.neftune import noisy_embeddings
from grpolab.model.passes import PassSpec, idle_pass, micro_batches, policy_logp, sampled_token_logp, slice_groups
from grpolab.parallel.distributed import global_counts, sum_gradients
from grpolab.parallel.fsdp import gathered, is_sharded, passes
from grpolab.training.metrics import weighted_mean
from grpolab.training.run import Run


def every_group(run: Run) -> bool:
    """Whether the update computes every prompt group whatever its advantages: the advantage component's
    (a critic's value loss) or an MoE's router load-balancing term (TRL's covers every sequence)."""
    return run.advantage.computes_every_group or run.pass_spec.router is not None


def computed_groups(batch: Batch, algo: AlgoConfig, computes_every_group: bool) -> Tensor:
    """(B,) bool: the prompt groups update() runs through the policy. A group whose sequences all have
    zero advantage adds nothing to the policy gradient and is skipped, unless a KL term in the loss
    (with a reference) or `computes_every_group` (`every_group`: a critic, a router term) needs every group.
    grpolab.training.token_credit asks this too, to mark the rows never computed."""
    rollout = batch.rollout
    adv_tok = per_token(batch.adv, rollout.completion_ids.shape)  # (N, C)
    has_signal = (adv_tok.abs() * rollout.completion_mask).sum(-1) > 0  # (N,)
    every = (batch.ref_logp is not None and algo.kl_in_loss) or computes_every_group
    return has_signal.view(-1, rollout.G).any(-1) | every  # (B,)


def loss_mask(rollout: Rollout, algo: AlgoConfig) -> Tensor:
    """(N, C) the tokens the loss reads: the completion mask, with every truncated completion's row zeroed
    when algo.mask_truncated_completions (DAPO's overlong filtering; TRL's mask_truncated_completions)."""
    mask = rollout.completion_mask
    if algo.mask_truncated_completions:
        mask = mask * (~rollout.truncated).to(mask.dtype)[:, None]  # (N, C)
    return mask


def generation_parts(n_groups: int, parts: int) -> list[Tensor]:
    """The prompt groups 0..n_groups-1 split into `parts` contiguous runs (algo.steps_per_generation), one
    optimizer update each; sizes differ by at most one (a DAPO batch may hold fewer groups)."""
    return list(torch.arange(n_groups).tensor_split(parts))


@dataclass
class Update:
    """One batch's update: its plan, the (N, C) tensors its passes fill (the first: log pi_old, entropy,
    the sampler's correction weights; the last: log pi_theta) and the report's accumulators."""

    spec: PassSpec
    adv_tok: Tensor  # (N, C)
    lmask: Tensor  # (N, C) the loss's token mask
    parts: list[Tensor]  # prompt groups of each optimizer update
    plan: list[list[Tensor]]  # each part's micro-batches (rows), groups that add nothing left out
    old_logp: Tensor
    last_logp: Tensor
    entropy_tok: Tensor
    is_weight: Tensor
    is_clipped: Tensor
    correct: bool  # weight each token by rollout.correction (the sampler is not the trainer)
    entropy_window: list = field(default_factory=lambda: [0.0, 0.0])  # sum_t k_t H_t, sum_t k_t of this update
    entropy_term: float = 0.0  # the entropy bonus subtracted from this update's loss (its micro-batches' sum)
    loss_infos: list = field(default_factory=list)  # ({metric: value}, weight) per micro-batch, as entropy_infos
    updates: list = field(default_factory=list)  # per optimizer update: the lr it used, its grad norm and loss
    entropy_infos: list = field(default_factory=list)
    aux_losses: list = field(default_factory=list)  # an MoE's router load-balancing loss, per micro-batch
    grad_norms: list = field(default_factory=list)
    n_nonfinite: int = 0
    n_overflow: int = 0  # precision=fp16: updates skipped because the scaled gradient overflowed
    n_idle: int = 0
    n_synced: int = 0


def sampled_logp(policy: nn.Module, spec: PassSpec, rollout: Rollout, plain: bool, exact: bool) -> Tensor:
    """(N, C) log pi_theta of the sampled tokens (grpolab.model.passes.sampled_token_logp): the rollout's
    own log-probs when the sampler is the policy (`exact`: the engine samples from the trainer) and the
    sampling is plain (Run.plain_sampling), else one no-grad pass of the policy (FSDP: gathered)."""
    with gathered(policy, not (plain and exact)):
        return sampled_token_logp(spec, policy, rollout, plain=plain, sampler_is_policy=exact)


def plan_update(run: Run, batch: Batch) -> Update:
    """Micro-batches of whole computed groups per part; log pi_old taken now when there are several parts."""
    algo, rollout, spec = run.cfg.algo, batch.rollout, run.pass_spec
    N, C = rollout.completion_ids.shape
    computed = computed_groups(batch, algo, every_group(run))  # (B,)
    parts = generation_parts(N // rollout.G, algo.steps_per_generation)
    old_logp = torch.zeros((N, C))
    exact = run.engine.samples_from_trainer
    if len(parts) > 1:
        old_logp = sampled_logp(run.policy, spec, rollout, run.plain_sampling, exact).clone()
    return Update(
        spec,
        per_token(batch.adv, (N, C)),
        loss_mask(rollout, algo),
        parts,
        [micro_batches(rollout, part[computed[part]], spec.micro_batch) for part in parts],
        old_logp,
        torch.zeros((N, C)),
        torch.zeros((N, C)),
        torch.ones((N, C)),
        torch.zeros((N, C), dtype=torch.bool),
        not exact and run.cfg.rollout.correction != "none",
    )


def micro_batch_pass(run: Run, u: Update, rollout: Rollout, rows: Tensor | None, entropy: bool):
    """The policy's pass over one micro-batch: (slice, log pi_theta (b, C'), entropy, an MoE's router
    load-balancing loss aux or None), its log-probs kept as the last pass's; None for FSDP's idle pass (a
    rank without a micro-batch joins its all-gathers)."""
    if rows is None:
        idle_pass(u.spec, run.policy, rollout)
        u.n_idle += 1
        return None
    sl = slice_groups(rollout, rows, u.spec.device)
    router = RouterLogits() if u.spec.router is not None else None
    with noisy_embeddings(run.policy, run.cfg.neftune_alpha, sl.prompt_ids.shape[1] + sl.width):  # NEFTune
        logp, ent = policy_logp(u.spec, run.policy, sl, with_entropy=entropy, router=router)  # (b, C')
    u.last_logp[rows, : sl.width] = logp.detach().cpu()
    aux = u.spec.router.loss(router) if router is not None else None
    return sl, logp, ent, aux


def record_first_pass(
    run: Run, u: Update, rollout: Rollout, rows: Tensor, sl, logp: Tensor, entropy: Tensor, aux, first_part: bool
) -> None:
    """The first epoch's pass: log pi_old (the weights have not moved yet), the sampler's correction
    weights against it (grpolab.algo.sampler), and the entropy for the report."""
    width, mask = sl.width, sl.completion_mask
    if first_part:
        u.old_logp[rows, :width] = logp.detach().cpu()
    if u.correct:
        u.is_weight[rows, :width], u.is_clipped[rows, :width] = correction_weights(
            u.old_logp[rows, :width],
            rollout.sample_logp[rows, :width],
            mask.cpu(),
            run.cfg.rollout.correction,
            run.cfg.rollout.correction_clip,
            run.cfg.rollout.correction_clip_min,
        )
    ent = entropy.detach()
    u.entropy_tok[rows, :width] = (ent * mask).cpu()
    u.entropy_infos.append(({"entropy": float((ent * mask).sum() / mask.sum().clamp(min=1))}, float(mask.sum())))


def micro_batch_loss(
    run: Run,
    batch: Batch,
    u: Update,
    rows: Tensor,
    sl,
    logp: Tensor,
    entropy: Tensor,
    aux: Tensor | None,
    counts: tuple[int, int, int],
) -> float:
    """The policy objective (and a critic's value loss) of one micro-batch, backpropagated; its value. The
    policy term's token masks (grpolab.algo.masks) are taken here, and the entropy over the tokens the
    policy term reads is added to the update's window (the adaptive entropy control's measurement).
    counts: the update's (n_seq, n_tok, micro-batches) over every process. An MoE's router load-balancing
    loss adds c * aux / micro-batches, as TRL adds it to each micro-batch's loss (divided by the gradient
    accumulation steps): the update's gradient is that of c times its micro-batches' mean aux."""
    n_seq, n_tok, n_batches = counts
    algo, width, dev = run.cfg.algo, sl.width, run.device
    kl_in_loss = batch.ref_logp is not None and algo.kl_in_loss
    old, adv, lmask = (x[rows, :width].to(dev) for x in (u.old_logp, u.adv_tok, u.lmask))
    sampled = old if run.engine.samples_from_trainer else batch.rollout.sample_logp[rows, :width].to(dev)
    masks = policy_masks(algo, adv=adv, logp=logp, sampler_logp=sampled.float(), mask=lmask, entropy=entropy)
    control = run.components.get("entropy_control")  # grpolab.algo.entropy.AdaptiveEntropy
    if control is not None:
        kept = (lmask > 0).float() * masks.get("entropy", 1.0)  # (b, C') TRL's effective_mask
        u.entropy_window[0] += float((entropy.detach().float() * kept).sum())
        u.entropy_window[1] += float(kept.sum())
    loss, info = policy_loss(
        logp,
        old,
        adv,
        lmask,
        algo,
        masks=masks,
        entropy_coef=control.applied if control is not None else None,
        beta=run.kl.value,
        ref_logp=batch.ref_logp[rows, :width].to(dev) if kl_in_loss else None,
        n_seq=n_seq,
        n_tok=n_tok,
        max_len=run.cfg.max_completion_tokens,
        token_weight=u.is_weight[rows, :width].to(dev) if u.correct else None,
        entropy=entropy if needs_entropy(algo) else None,
    )
    loss, value_info = run.advantage.add_loss(loss, u.spec, sl, batch)
    if aux is not None:
        loss = loss + u.spec.router.coef * aux / n_batches
        u.aux_losses.append(float(aux.detach()))
    scale_loss(run.components.get(LOSS_SCALE), loss).backward()  # precision=fp16: S * loss
    u.entropy_term += info.pop("loss/entropy_term", 0.0)
    u.loss_infos.append(({**info, **value_info}, float(sl.completion_mask.sum())))
    return float(loss.detach())


def needs_entropy(algo: AlgoConfig) -> bool:
    """Whether the loss reads the policy's entropy in every epoch (not only the first, for the report): an
    entropy bonus, fixed or adaptive, or the top-entropy token mask."""
    return algo.entropy_coef != 0.0 or algo.adaptive_entropy or algo.top_entropy_quantile < 1.0


def adapt_entropy(run: Run, u: Update) -> None:
    """After an optimizer update: the adaptive entropy control (run.components["entropy_control"]) takes the
    mean entropy of the tokens the update's policy term read, over every process, and sets the next
    coefficient; the window starts again."""
    control = run.components.get("entropy_control")
    if control is None:
        return
    total, count = global_counts(run.ranks, *u.entropy_window)
    control.update(total / max(count, 1.0))
    u.entropy_window[:] = [0.0, 0.0]
    if u.updates:
        u.updates[-1]["entropy_coef"] = control.coef  # TRL logs the coefficient the controller just set


def optimizer_step(run: Run, u: Update, loss_sum: float) -> None:
    """The global-batch gradient (precision=fp16: divided by the loss scale, grpolab.model.loss_scale),
    clipped (its norm recorded), then AdamW, the schedule, the critic and the reference's sync; an update
    whose loss or gradient norm is not finite is skipped instead (the weights stay as they were) and
    counted. Under fp16 a finite loss with a non-finite gradient is the scaler's overflow: skipped as
    GradScaler skips it, the scale halved, and counted apart (u.n_overflow), not toward
    max_nonfinite_updates' stop; the schedule does not move on a skipped update (as transformers' Trainer)."""
    cfg, d = run.cfg, run.ranks
    scaler = run.components.get(LOSS_SCALE)
    sum_gradients(d, run.policy.parameters())  # the global-batch gradient on every rank
    loss_sum, entropy_term = global_counts(d, loss_sum, u.entropy_term)
    u.entropy_term = 0.0
    norm, overflow = unscale_and_clip(scaler, run.optimizer, run.policy.parameters(), cfg.max_grad_norm)
    if overflow or not (math.isfinite(loss_sum) and math.isfinite(norm)):  # skip this update, keep the weights
        finish_step(scaler, run.optimizer, apply=False)  # fp16: the scale backs off
        run.optimizer.zero_grad(set_to_none=True)
        run.advantage.discard()
        if overflow and math.isfinite(loss_sum):
            u.n_overflow += 1
        else:
            u.n_nonfinite += 1
            run.nonfinite_streak += 1
        u.updates.append(update_record(run, None, None))
        return
    if cfg.max_grad_norm > 0:
        u.grad_norms.append(norm)
    u.updates.append(update_record(run, norm, loss_sum, entropy_term))
    finish_step(scaler, run.optimizer, apply=True)
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    run.advantage.step(cfg.max_grad_norm)
    run.nonfinite_streak = 0
    u.n_synced += sync_reference(run)


def update_record(run: Run, grad_norm: float | None, loss: float | None, entropy_term: float = 0.0) -> dict:
    """One optimizer update's record (Run.updates): the learning rate it uses (read before the schedule
    moves on: what TRL logs as learning_rate), its gradient norm before clipping and its loss (None for
    an update skipped for a non-finite loss or norm). With an entropy bonus (fixed or adaptive) also
    TRL's policy_loss, the loss without the bonus (loss + the bonus subtracted), and entropy_coef, the
    coefficient (the adaptive control's, set after the update by adapt_entropy)."""
    record = {"learning_rate": run.scheduler.get_last_lr()[0], "grad_norm": grad_norm, "loss": loss}
    algo = run.cfg.algo
    if algo.entropy_coef != 0.0 or algo.adaptive_entropy:
        record["policy_loss"] = None if loss is None else loss + entropy_term
        control = run.components.get("entropy_control")
        record["entropy_coef"] = control.coef if control is not None else algo.entropy_coef
    return record


def skipped_update(run: Run, u: Update) -> None:
    """An update whose prompt groups all have zero advantage (nothing computed): the weights stay, and the
    schedule moves on as TRL's does (its update runs on a zero gradient), so the schedule's length is the
    run's steps x mu x steps_per_generation whatever the rewards. Recorded with gradient norm and loss 0."""
    u.updates.append(update_record(run, 0.0, 0.0))
    run.scheduler.step()
    u.n_synced += sync_reference(run)


def update(run: Run, batch: Batch) -> dict:
    """`algo.mu` epochs over the batch, each `algo.steps_per_generation` AdamW updates (one per part of
    the batch's prompt groups, `generation_parts`). batch.adv: (N,) or (N, C).

    log pi_old is the policy that sampled. The first pass of the first update records it as log pi_theta
    (detached): the weights have not moved yet, so no separate old-log-prob pass is needed; with
    steps_per_generation > 1 the later parts' log pi_old is taken before any update (the rollout's own
    log-probs where they are the policy's, else one no-grad pass). An update whose loss or gradient norm
    is not finite is skipped (the weights stay as they were) and counted: update/nonfinite_skipped, and
    run.nonfinite_streak for the loop's stop rule. Micro-batches hold whole groups (the
    prompt is computed once per group). A group whose sequences all have zero advantage adds nothing to
    the policy gradient and is not computed at all (`computed_groups`); the normalisers n_seq / n_tok
    still count it, so the loss is unchanged. When the engine that sampled is not the trainer (vLLM),
    each token's policy term is weighted by the rollout.correction weight of log pi_old against the
    sampler's log-probs (grpolab.algo.sampler), computed in the first pass and kept for every epoch.
    The loss reads `loss_mask` (truncated completions left out on request); algo.entropy_coef adds the
    entropy bonus; algo.sync_ref_model updates the reference every sync_ref_model_steps updates. A mixture of
    experts with a router term (run.pass_spec.router, algo.router_aux_loss_coef) adds c * aux / micro-batches
    per micro-batch (`micro_batch_loss`) and computes every group.
    """
    algo, rollout, d = run.cfg.algo, batch.rollout, run.ranks
    u = plan_update(run, batch)
    for epoch in range(algo.mu):
        for p, (part, part_batches) in enumerate(zip(u.parts, u.plan)):
            part_rows = (part[:, None] * rollout.G + torch.arange(rollout.G)).reshape(-1)  # (n,)
            n_seq, n_tok, n_batches = (
                int(x) for x in global_counts(d, len(part_rows), float(u.lmask[part_rows].sum()), len(part_batches))
            )  # this update's batch
            if not n_batches:  # every rank runs the same updates
                skipped_update(run, u)
                continue
            loss_sum = 0.0
            for rows in passes(d, part_batches, is_sharded(run.policy)):  # FSDP: every rank the same passes
                out = micro_batch_pass(run, u, rollout, rows, entropy=epoch == 0 or needs_entropy(algo))
                if out is None:
                    continue
                if epoch == 0:
                    record_first_pass(run, u, rollout, rows, *out, first_part=p == 0)
                loss_sum += micro_batch_loss(run, batch, u, rows, *out, (n_seq, n_tok, n_batches))
            optimizer_step(run, u, loss_sum)
            adapt_entropy(run, u)
    batch.old_logp, batch.last_logp, batch.entropy = u.old_logp, u.last_logp, u.entropy_tok  # not computed: 0
    run.updates = u.updates
    return update_metrics(run, batch, u)


def update_metrics(run: Run, batch: Batch, u: Update) -> dict:
    """The update's report: the weighted losses and entropy, the rows computed, skips, the learning rate
    the step's first update used, beta, the gradient norm, the sampler's mismatch where it is not the trainer, FSDP's idle passes."""
    algo, rollout = run.cfg.algo, batch.rollout
    batches = [rows for part in u.plan for rows in part]
    metrics = weighted_mean(u.loss_infos)
    metrics.update(weighted_mean(u.entropy_infos))
    if u.aux_losses:  # TRL's aux_loss: the mean over the micro-batches
        metrics["loss/aux"] = sum(u.aux_losses) / len(u.aux_losses)
    n_rows = sum(len(b) for b in batches)
    metrics.update(
        {
            "update/seqs_computed": float(n_rows),
            "update/skipped": float(n_rows == 0),
            "update/nonfinite_skipped": float(u.n_nonfinite),
            "lr": u.updates[0]["learning_rate"] if u.updates else run.scheduler.get_last_lr()[0],
            "kl/beta": run.kl.value,
        }
    )
    if algo.sync_ref_model:
        metrics["ref/synced"] = float(u.n_synced)
    if (scale := scale_of(run.components.get(LOSS_SCALE))) is not None:  # precision=fp16
        metrics["update/overflow_skipped"], metrics["update/loss_scale"] = float(u.n_overflow), scale
    if (control := run.components.get("entropy_control")) is not None:  # the coefficient the next update applies
        metrics["entropy/coef"], metrics["entropy/coef_applied"] = control.coef, control.applied
    if algo.mask_truncated_completions:
        metrics["update/masked_truncated"] = float(rollout.truncated.sum())
    if u.grad_norms:
        metrics["grad_norm"] = sum(u.grad_norms) / len(u.grad_norms)
    if not run.engine.samples_from_trainer and n_rows:  # over the computed rows: their log pi_old exists
        rows_done = torch.cat(batches) if batches else torch.zeros(0, dtype=torch.long)
        metrics.update(
            mismatch_metrics(
                u.old_logp[rows_done],
                rollout.sample_logp[rows_done],
                rollout.completion_mask[rows_done],
                u.is_weight[rows_done],
                u.is_clipped[rows_done],
            )
        )
    if is_sharded(run.policy):
        metrics["update/idle_passes"] = float(u.n_idle)
    return metrics


def sync_reference(run: Run) -> int:
    """After an optimizer update: with algo.sync_ref_model, every sync_ref_model_steps-th update (counted by
    the scheduler, so a resumed run keeps the count) mixes the policy into the reference,
    pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (grpolab.model.reference.mix_into). Returns 1 if it did."""
    algo = run.cfg.algo
    if not algo.sync_ref_model or run.ref is None or run.scheduler.last_epoch % algo.sync_ref_model_steps:
        return 0
    run.ref.sync(run.policy, algo.sync_ref_model_alpha)
    return 1
