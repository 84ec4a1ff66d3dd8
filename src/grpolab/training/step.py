"""One training step, top to bottom, as stages over one `Batch`:

    batch = collect(run, step)            B prompts, G completions each, verifier rewards   engine/, rewards/
                                          (DAPO: drop all-equal groups and sample more)       algo/shaping.py
    reference(run, batch)                 log pi_ref of the completions, when beta > 0        model/passes.py
    shape(run, batch)                     overlong penalty, KL in the reward                  algo/shaping.py
    batch.adv = run.advantage.targets()   A (N,) from the group, or (N, C) from a critic      algo/advantages.py, model/critic.py
    update(run, batch)                    algo.mu AdamW updates of the policy objective       algo/losses.py
    -> metrics                            one flat dict per step (docs/metrics.md)

Each stage reads the Batch and fills in its own fields; nothing else is shared. The raw verifier
reward and the shaped one both stay on the batch. A method with a critic differs only in
`run.advantage` (grpolab.model.critic.Critic instead of grpolab.training.components.GroupBaseline).
The loop around the step (setup, evaluation, checkpoints, summary) is grpolab.training.trainer.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from grpolab.algo.advantages import per_token
from grpolab.algo.losses import policy_loss
from grpolab.algo.presets import AlgoConfig
from grpolab.algo.sampler import correction_weights, mismatch_metrics
from grpolab.algo.shaping import informative_groups, shape_rewards
from grpolab.batch import Batch, Example, Rollout, concat_rollouts
from grpolab.engine.base import Sampling
from grpolab.model.passes import (
    PassSpec,
    idle_pass,
    logp_without_grad,
    micro_batches,
    policy_logp,
    sampled_token_logp,
    slice_groups,
)
from grpolab.model.template import chat_prompts
from grpolab.parallel.distributed import SINGLE, global_counts, is_count, rank_slice, reduce_metrics, sum_gradients
from grpolab.parallel.fsdp import gathered, is_sharded, passes
from grpolab.rewards import score_completions
from grpolab.rewards.scoring import Scores
from grpolab.training.agents import UNSTARTED, agent_rollout, close_all, env_reward_metrics
from grpolab.training.diagnostics import aha_metrics
from grpolab.training.metrics import weighted_mean
from grpolab.training.run import Run, step_rng
from grpolab.util.fields import ConfigError


def rollout_examples(
    run: Run,
    examples: list[Example],
    *,
    G: int,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    sampling: Sampling | None = None,
) -> Rollout:
    """G completions for each example, in the model's chat template. `generator` (on run.device) is
    used as it is: the caller owns its stream. `sampling`: how to draw tokens (default: the run's
    rollout settings, run.sampling(greedy); the evaluation passes its own)."""
    ids = chat_prompts(
        run.tokenizer,
        [e.prompt for e in examples],
        run.task.system_prompt,
        raw_strings=getattr(run.task, "raw_string_prompts", False),
    )
    check_prompt_lengths(run, examples, ids)
    return run.engine.generate(ids, sampling or run.sampling(greedy), G=G, generator=generator)


def completion_ids(rollout: Rollout) -> list[list[int]]:
    """Per row, the token ids after the prompt (EOS included, no padding; in a multi-turn rollout the
    environment's tokens too): TRL's `completion_ids` for the reward functions."""
    present = rollout.attention_mask > 0  # (N, C)
    return [row[keep].tolist() for row, keep in zip(rollout.completion_ids, present)]


def context_length(model) -> int | None:
    """The model's context in tokens (its config's max_position_embeddings), None when it names none."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def check_prompt_lengths(run: Run, examples: list[Example], ids: list[list[int]]) -> None:
    """ConfigError (exit 2), before anything is allocated for them, when a templated prompt plus
    max_new_tokens does not fit the model's context. One 1 MB prompt (about 250 000 tokens) asked the
    prefill for terabytes at step 1; a prompt the model cannot read whole is a data error."""
    limit = context_length(run.policy)
    if limit is None:
        return
    for e, x in zip(examples, ids):
        if len(x) + run.cfg.max_new_tokens > limit:
            raise ConfigError(
                f"prompt of example {str(e.id)[:80]!r} has {len(x)} tokens in the chat template; with "
                f"max_new_tokens={run.cfg.max_new_tokens} that exceeds the model's context of {limit} tokens "
                f"(max_position_embeddings): shorten or drop that row, or lower max_new_tokens"
            )


def score(run: Run, rollout: Rollout, examples: list[Example], context: dict[str, list] | None = None):
    """Rewards for every completion (examples repeated G times to match the layout). TRL-form functions
    get TRL's contract (grpolab.rewards.contract): `completion_ids`, `trainer_state` (run.trainer_state),
    `log_extra`, `log_metric`; in a multi-turn rollout also each row's conversation
    (rollout.conversations), its environment and its prompt (`context`, as TRL passes them), the
    per-sample form its last turn's text (rollout.texts); the environment's own reward is one of the
    functions (grpolab.training.agents.env_reward)."""
    per_completion = [e for e in examples for _ in range(rollout.G)]
    context = {**(context or {}), "completion_ids": completion_ids(rollout)}
    shared = {"trainer_state": run.trainer_state} if run.trainer_state is not None else {}
    return score_completions(
        run.reward_fns,
        rollout.texts,
        per_completion,
        conversations=rollout.conversations,
        context=context,
        shared=shared,
        timeout_s=run.cfg.reward_timeout_s,
        workers=run.cfg.reward_workers,
        thread=run.cfg.reward_thread,
    )


def advance_state(run: Run, step: int) -> None:
    """run.trainer_state as TRL's is while step `step`'s batch is scored: global_step = steps done before
    it, epoch = the training rows used so far over the task's size (0 when the task has no size)."""
    state = run.trainer_state
    if state is None:
        return
    state.global_step = step - 1
    size = len(run.task) if hasattr(run.task, "__len__") else 0
    per_step = run.cfg.batch_size // run.cfg.G
    state.epoch = (step - 1) / math.ceil(size / per_step) if size and per_step else 0.0


def rollout_and_score(
    run: Run,
    examples: list[Example],
    *,
    G: int,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    sampling: Sampling | None = None,
) -> tuple[Rollout, Scores, dict]:
    """Roll out and score: single-turn (rollout_examples), or multi-turn in the run's environment
    (grpolab.training.agents), scored while its environments are open, then closed. Returns (rollout,
    scores, info: the environments' metrics and time/score_s)."""
    if run.environments is None:
        rollout = rollout_examples(run, examples, G=G, greedy=greedy, generator=generator, sampling=sampling)
        t0 = time.perf_counter()
        scores = score(run, rollout, examples)
        return rollout, scores, {"time/score_s": time.perf_counter() - t0}
    rollout, context, info = agent_rollout(run, examples, G=G, greedy=greedy, generator=generator, sampling=sampling)
    unstarted = context.pop(UNSTARTED, [])
    t0 = time.perf_counter()
    try:
        scores = score(run, rollout, examples, context)
    finally:
        close_all(context["environments"])
    for i in unstarted:  # an environment that could not start: the group scores 0 (no advantage within it)
        scores.total[i] = 0.0
    return rollout, scores, {**info, **env_reward_metrics(scores), "time/score_s": time.perf_counter() - t0}


def collect(run: Run, step: int) -> Batch:
    """Sample prompts, roll out and score them. With dynamic sampling (DAPO), groups whose rewards are
    all equal are dropped and more prompts are sampled, up to `algo.max_resample_rounds` extra rounds;
    the reward metrics cover every sampled completion, the batch only the kept ones."""
    cfg, algo = run.cfg, run.cfg.algo
    prompts_per_step = cfg.batch_size // cfg.G
    advance_state(run, step)
    d = run.dist or SINGLE
    rng, generator = step_rng(cfg.seed, step, run.device, d.rank)
    rounds = 1 + (algo.max_resample_rounds if algo.dynamic_sampling else 0)
    kept: list[Batch] = []
    round_metrics: list[tuple[dict, float]] = []
    first_errors: dict[str, str] = {}
    sampled_rewards: list[Tensor] = []
    t_generate = t_score = 0.0
    n_groups = 0
    for _ in range(rounds):
        need = prompts_per_step - sum(len(b.examples) for b in kept)
        if need <= 0:
            break
        if cfg.num_train_epochs is not None and hasattr(run.task, "epoch_rows") and not n_groups:  # epochs
            examples = run.task.epoch_rows(
                (step - 1) * need * d.world,
                need * d.world,
                cfg.seed if cfg.data_seed is None else cfg.data_seed,
                cfg.shuffle,
            )
            examples = examples[rank_slice(need * d.world, d)]  # this rank's share
        else:
            examples = run.task.sample(need * d.world, rng)[rank_slice(need * d.world, d)]  # this rank's share
        t0 = time.perf_counter()
        rollout, scores, info = rollout_and_score(run, examples, G=cfg.G, generator=generator)
        scoring_s = info.pop("time/score_s")
        t_score += scoring_s
        t_generate += time.perf_counter() - t0 - scoring_s
        part = Batch(
            examples, rollout, torch.tensor(scores.total, dtype=torch.float32), scores.per_fn, extra=scores.extra
        )  # (n,)
        for name, message in scores.first_errors.items():
            first_errors.setdefault(name, message)
        sampled_rewards.append(part.raw_reward)
        round_metrics.append(({**scores.metrics, **info}, len(rollout.texts)))
        n_groups += len(examples)
        if algo.dynamic_sampling:
            part = part.keep_groups(informative_groups(part.raw_reward, cfg.G))
        if not part.empty:
            kept.append(part)
    metrics = weighted_mean(round_metrics)
    for k in {k for m, _ in round_metrics for k in m if is_count(k)}:  # counts: sum over rounds, not mean
        metrics[k] = float(sum(m.get(k, 0.0) for m, _ in round_metrics))
    raw = torch.cat(sampled_rewards)  # (every sampled completion,)
    metrics.update(
        {
            "time/generate_s": t_generate,
            "time/score_s": t_score,
            "reward/mean": float(raw.mean()),
            "reward/std": float(raw.std()) if len(raw) > 1 else 0.0,
        }
    )
    n_kept = sum(len(b.examples) for b in kept)
    if algo.dynamic_sampling:
        metrics.update(
            {"dapo/groups_sampled": n_groups, "dapo/groups_dropped": n_groups - n_kept, "dapo/groups_kept": n_kept}
        )
    if not kept:
        return Batch([], None, raw[:0], {}, metrics, first_errors=first_errors)
    columns = {c for b in kept for c in b.extra}
    n_of = [len(b.rollout.texts) for b in kept]
    return Batch(
        [e for b in kept for e in b.examples],
        concat_rollouts([b.rollout for b in kept]),
        torch.cat([b.raw_reward for b in kept]),
        {k: [x for b in kept for x in b.reward_by_fn[k]] for k in kept[0].reward_by_fn},
        metrics,
        extra={c: [x for b, n in zip(kept, n_of) for x in b.extra.get(c, [None] * n)] for c in columns},
        first_errors=first_errors,
    )


def reference(run: Run, batch: Batch) -> None:
    """batch.ref_logp (N, C): log pi_ref of the completions, one no-grad pass (only with a reference)."""
    if run.ref is not None:
        with run.ref.model() as ref:  # a frozen copy, or the LoRA policy with its adapter off
            batch.ref_logp = logp_without_grad(run.pass_spec(), ref, batch.rollout)


def shape(run: Run, batch: Batch) -> None:
    """batch.reward (N,) and batch.token_reward (N, C): every reward change after the verifiers
    (grpolab.algo.shaping), plus `groups/zero_std_frac` of the shaped reward."""
    algo, rollout = run.cfg.algo, batch.rollout
    kl_in_reward = batch.ref_logp is not None and algo.kl_in_reward
    exact = run.engine.samples_from_trainer  # else the sampler's log-probs are not the policy's: a pass
    with gathered(run.policy, kl_in_reward and not (run.plain_sampling and exact)):  # FSDP: a no-grad policy pass
        sampled = (
            sampled_token_logp(run.pass_spec(), run.policy, rollout, plain=run.plain_sampling, sampler_is_policy=exact)
            if kl_in_reward
            else None
        )  # (N, C) log pi_theta of the sampled tokens
        shaped = shape_rewards(
            batch.raw_reward,
            rollout.lengths,
            rollout.completion_mask,
            algo,
            max_len=run.cfg.max_completion_tokens,
            beta=run.kl.value,
            ref_logp=batch.ref_logp,
            policy_logp=sampled,
        )
    batch.reward, batch.token_reward = shaped.reward, shaped.token_reward
    batch.metrics.update(shaped.metrics)
    batch.metrics["groups/zero_std_frac"] = 1.0 - float(informative_groups(batch.reward, rollout.G).float().mean())


def computed_groups(batch: Batch, algo: AlgoConfig, computes_every_group: bool) -> Tensor:
    """(B,) bool: the prompt groups update() runs through the policy. A group whose sequences all have
    zero advantage adds nothing to the policy gradient and is skipped, unless a KL term in the loss
    (with a reference) or the advantage component (a critic's value loss) needs every group.
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
    loss_infos: list = field(default_factory=list)  # ({metric: value}, weight) per micro-batch, as entropy_infos
    entropy_infos: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    n_nonfinite: int = 0
    n_idle: int = 0
    n_synced: int = 0


def plan_update(run: Run, batch: Batch) -> Update:
    """Micro-batches of whole computed groups per part; log pi_old taken now when there are several parts."""
    algo, rollout = run.cfg.algo, batch.rollout
    N, C = rollout.completion_ids.shape
    spec = run.pass_spec()
    computed = computed_groups(batch, algo, run.advantage.computes_every_group)  # (B,)
    parts = generation_parts(N // rollout.G, algo.steps_per_generation)
    old_logp = torch.zeros((N, C))
    exact = run.engine.samples_from_trainer
    if len(parts) > 1:
        with gathered(run.policy, not (run.plain_sampling and exact)):
            old_logp = sampled_token_logp(
                spec, run.policy, rollout, plain=run.plain_sampling, sampler_is_policy=exact
            ).clone()
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
    """The policy's pass over one micro-batch: (slice, log pi_theta (b, C'), entropy), its log-probs kept
    as the last pass's; None for FSDP's idle pass (a rank without a micro-batch joins its all-gathers)."""
    if rows is None:
        idle_pass(u.spec, run.policy, rollout)
        u.n_idle += 1
        return None
    sl = slice_groups(rollout, rows, u.spec.device)
    logp, ent = policy_logp(u.spec, run.policy, sl, with_entropy=entropy)  # (b, C')
    u.last_logp[rows, : sl.width] = logp.detach().cpu()
    return sl, logp, ent


def record_first_pass(
    run: Run, u: Update, rollout: Rollout, rows: Tensor, sl, logp: Tensor, entropy: Tensor, first_part: bool
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
        )
    ent = entropy.detach()
    u.entropy_tok[rows, :width] = (ent * mask).cpu()
    u.entropy_infos.append(({"entropy": float((ent * mask).sum() / mask.sum().clamp(min=1))}, float(mask.sum())))


def micro_batch_loss(
    run: Run, batch: Batch, u: Update, rows: Tensor, sl, logp: Tensor, entropy: Tensor, n_seq: int, n_tok: int
) -> float:
    """The policy objective (and a critic's value loss) of one micro-batch, backpropagated; its value."""
    algo, width, dev = run.cfg.algo, sl.width, run.device
    kl_in_loss = batch.ref_logp is not None and algo.kl_in_loss
    loss, info = policy_loss(
        logp,
        u.old_logp[rows, :width].to(dev),
        u.adv_tok[rows, :width].to(dev),
        u.lmask[rows, :width].to(dev),
        algo,
        beta=run.kl.value,
        ref_logp=batch.ref_logp[rows, :width].to(dev) if kl_in_loss else None,
        n_seq=n_seq,
        n_tok=n_tok,
        max_len=run.cfg.max_completion_tokens,
        token_weight=u.is_weight[rows, :width].to(dev) if u.correct else None,
        entropy=entropy if algo.entropy_coef != 0.0 else None,
    )
    loss, value_info = run.advantage.add_loss(loss, u.spec, sl, batch)
    loss.backward()
    u.loss_infos.append(({**info, **value_info}, float(sl.completion_mask.sum())))
    return float(loss.detach())


def optimizer_step(run: Run, u: Update, loss_sum: float) -> None:
    """The global-batch gradient, clipped (its norm recorded), then AdamW, the schedule, the critic and
    the reference's sync; an update whose loss or gradient norm is not finite is skipped instead (the
    weights stay as they were) and counted."""
    cfg, d = run.cfg, run.ranks
    sum_gradients(d, run.policy.parameters())  # the global-batch gradient on every rank
    loss_sum = global_counts(d, loss_sum)[0]
    # max_norm inf measures the norm without clipping (the grads are multiplied by exactly 1)
    norm = float(
        torch.nn.utils.clip_grad_norm_(
            run.policy.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        )
    )
    if not (math.isfinite(loss_sum) and math.isfinite(norm)):  # skip this update, keep the weights
        run.optimizer.zero_grad(set_to_none=True)
        run.advantage.discard()
        u.n_nonfinite += 1
        run.nonfinite_streak += 1
        return
    if cfg.max_grad_norm > 0:
        u.grad_norms.append(norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()  # warm-up counts optimizer updates actually made
    run.advantage.step(cfg.max_grad_norm)
    run.nonfinite_streak = 0
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
    entropy bonus; algo.sync_ref_model updates the reference every sync_ref_model_steps updates.
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
                continue
            loss_sum = 0.0
            for rows in passes(d, part_batches, is_sharded(run.policy)):  # FSDP: every rank the same passes
                out = micro_batch_pass(run, u, rollout, rows, entropy=epoch == 0 or algo.entropy_coef != 0.0)
                if out is None:
                    continue
                if epoch == 0:
                    record_first_pass(run, u, rollout, rows, *out, first_part=p == 0)
                loss_sum += micro_batch_loss(run, batch, u, rows, *out, n_seq, n_tok)
            optimizer_step(run, u, loss_sum)
    batch.old_logp, batch.last_logp, batch.entropy = u.old_logp, u.last_logp, u.entropy_tok  # not computed: 0
    return update_metrics(run, batch, u)


def update_metrics(run: Run, batch: Batch, u: Update) -> dict:
    """The update's report: the weighted losses and entropy, the rows computed, skips, the learning rate,
    beta, the gradient norm, the sampler's mismatch where it is not the trainer, FSDP's idle passes."""
    algo, rollout = run.cfg.algo, batch.rollout
    batches = [rows for part in u.plan for rows in part]
    metrics = weighted_mean(u.loss_infos)
    metrics.update(weighted_mean(u.entropy_infos))
    n_rows = sum(len(b) for b in batches)
    metrics.update(
        {
            "update/seqs_computed": float(n_rows),
            "update/skipped": float(n_rows == 0),
            "update/nonfinite_skipped": float(u.n_nonfinite),
            "lr": run.scheduler.get_last_lr()[0],
            "kl/beta": run.kl.value,
        }
    )
    if algo.sync_ref_model:
        metrics["ref/synced"] = float(u.n_synced)
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


def train_step(run: Run, step: int) -> tuple[dict, Batch]:
    """One step: collect -> reference -> shape -> advantages -> update. Returns (metrics, batch)."""
    t_start = time.perf_counter()
    batch = collect(run, step)
    if batch.empty:  # dynamic sampling found no informative group: nothing to learn from
        run.engine.sync(run.policy, step)  # the weights did not move; the version does
        return {
            "step": step,
            **batch.metrics,
            "update/skipped": 1.0,
            "time/step_s": time.perf_counter() - t_start,
        }, batch
    run.engine.release()  # the update runs without what the engine holds only for sampling (vLLM's KV cache)
    t_update = time.perf_counter()
    reference(run, batch)
    shape(run, batch)
    batch.adv = run.advantage.targets(run.pass_spec(), batch)  # (N,) or (N, C)
    metrics = {**batch.metrics, "adv/abs_mean": float(batch.adv.abs().mean())}
    metrics.update(update(run, batch))
    metrics["time/sync_s"] = run.engine.sync(run.policy, step)  # the next rollout samples these weights
    metrics["rollout/policy_lag"] = float(step - 1 - batch.rollout.version)  # 0: sampled by the step's own weights
    kl_measured = "kl" in metrics  # in the loss or in the reward: the adaptive controller's input
    metrics.update(aha_metrics(batch, run.main_reward, run.cfg.reflection_phrases))  # docs/metrics.md, "aha"
    lengths = batch.rollout.lengths  # (N,)
    metrics = {
        "step": step,
        "kl": 0.0,
        "clip/frac": 0.0,
        "entropy": float("nan"),
        **metrics,
        "time/update_s": time.perf_counter() - t_update,
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": float(batch.rollout.truncated.float().mean()),
        "tokens/generated": float(lengths.sum()),
        "memory/peak_mb": peak_memory_mb(run.device),
        "params/trained": float(run.trained_params()),
        "time/step_s": time.perf_counter() - t_start,
    }
    metrics = reduce_metrics(run.ranks, metrics)  # data parallel: over ranks; one process: as is
    if kl_measured:
        run.kl.update(metrics["kl"], len(batch.reward) * run.ranks.world)
    return metrics, batch


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: GPU allocator peak on CUDA, process peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
