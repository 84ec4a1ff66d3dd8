"""One training step, top to bottom, as stages over one `Batch`:

    batch = collect(run, step)            B prompts, G completions each, verifier rewards   engine/, rewards/
                                          (DAPO: drop all-equal groups and sample more)       algo/shaping.py
    reference(run, batch)                 log pi_ref of the completions, when beta > 0        model/passes.py
    shape(run, batch)                     overlong penalty, KL in the reward                  algo/shaping.py
    batch.adv = run.advantage.targets()   A (N,) from the group, or (N, C) from a critic      algo/advantages.py, model/critic.py
    update(run, batch)                    algo.mu AdamW updates of the policy objective       training/update.py, algo/losses.py
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

import torch
from torch import Tensor

from grpolab.algo.shaping import informative_groups, shape_rewards
from grpolab.batch import Batch, Example, Rollout, concat_rollouts
from grpolab.engine.base import Sampling
from grpolab.model.passes import logp_without_grad, sampled_token_logp
from grpolab.model.template import chat_prompts
from grpolab.parallel.distributed import SINGLE, is_count, rank_slice, reduce_metrics
from grpolab.parallel.fsdp import gathered
from grpolab.rewards import score_completions
from grpolab.rewards.scoring import Scores
from grpolab.training.agents import UNSTARTED, agent_rollout, close_all, env_reward_metrics
from grpolab.training.diagnostics import aha_metrics
from grpolab.training.metrics import weighted_mean
from grpolab.training.run import Run, step_rng
from grpolab.training.update import update
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
