"""One training step, top to bottom, as stages over one `Batch`:

    batch = collect(run, step)            B prompts, G completions each, verifier rewards   engine/, env/, rewards/
                                          (DAPO: drop all-equal groups and sample more)       algo/shaping.py
    reference(run.ref, spec, batch)       log pi_ref of the completions, when beta > 0        model/passes.py
    shape(run, batch)                     overlong penalty, KL in the reward                  algo/shaping.py
    batch.adv = run.advantage.targets()   A (N,) from the group, or (N, C) from a critic      algo/advantages.py, model/critic.py
    update(run, batch)                    algo.mu AdamW updates of the policy objective       training/update.py, algo/losses.py
    -> metrics                            one flat dict per step (docs/metrics.md)

Each stage reads the Batch and fills in its own fields; nothing else is shared. The raw verifier
reward and the shaped one both stay on the batch. A method with a critic differs only in
`run.advantage` (grpolab.model.critic.Critic instead of grpolab.training.components.GroupBaseline).
The run's sampling, pass spec and plain-sampling flag are set once by setup (grpolab.training.run.Run);
a stage reads them and the run's other fields first, then hands plain values to the layers below.
The loop around the step (setup, evaluation, checkpoints, summary) is grpolab.training.trainer.
"""

from __future__ import annotations

import math
import resource
import time

import torch
from torch import Tensor

from grpolab.algo.advantages import REWARD_AGGREGATIONS
from grpolab.algo.shaping import informative_groups, shape_rewards
from grpolab.batch import Batch, Example, Rollout, concat_rollouts
from grpolab.engine.base import Sampling
from grpolab.env.reward import env_reward_metrics
from grpolab.env.rollout import UNSTARTED, close_all
from grpolab.model.passes import PassSpec, logp_without_grad
from grpolab.model.template import chat_prompts, check_prompt_lengths, context_length
from grpolab.parallel.distributed import is_count, rank_slice, reduce_metrics
from grpolab.rewards.scoring import Scores, score_rollout
from grpolab.training.agents import agent_rollout
from grpolab.training.diagnostics import aha_metrics
from grpolab.training.metrics import weighted_mean
from grpolab.training.run import Reference, Run, step_rng
from grpolab.training.update import sampled_logp, update


def rollout_examples(
    run: Run,
    examples: list[Example],
    *,
    G: int,
    generator: torch.Generator | None = None,
    sampling: Sampling | None = None,
) -> Rollout:
    """G single-turn completions for each example: the prompts in the chat template, checked against the
    model's context (grpolab.model.template), sampled by run.engine. `generator` is used as it is: the
    caller owns its stream. `sampling`: how to draw tokens (default: the run's rollout settings,
    run.sampling; greedy or the evaluation's are derived from it by the caller)."""
    sampling, task = sampling or run.sampling, run.task
    raw = getattr(task, "raw_string_prompts", False)
    ids = chat_prompts(run.tokenizer, [e.prompt for e in examples], task.system_prompt, raw_strings=raw)
    check_prompt_lengths(ids, examples, sampling.max_new_tokens, context_length(run.policy))
    return run.engine.generate(ids, sampling, G=G, generator=generator)


def scoring_options(run: Run) -> dict:
    """What the reward functions are called with besides a rollout (grpolab.rewards.scoring.score_rollout):
    TRL's contract `trainer_state` (run.trainer_state), the timeout, workers and thread of the calls."""
    cfg = run.cfg
    shared = {"trainer_state": run.trainer_state} if run.trainer_state is not None else {}
    return {
        "shared": shared,
        "timeout_s": cfg.reward_timeout_s,
        "workers": cfg.reward_workers,
        "thread": cfg.reward_thread,
        "process": cfg.reward_process,
    }


def score(run: Run, rollout: Rollout, examples: list[Example], context: dict[str, list] | None = None) -> Scores:
    """Rewards for every completion (grpolab.rewards.scoring.score_rollout with the run's reward functions
    and scoring_options). TRL-form functions get TRL's contract (grpolab.rewards.contract):
    `completion_ids`, `trainer_state`, `log_extra`, `log_metric`; in a multi-turn rollout also each row's
    conversation (rollout.conversations), its environment and its prompt (`context`, as TRL passes
    them), the per-sample form its last turn's text (rollout.texts); the environment's own reward is one
    of the functions (grpolab.env.reward.env_reward)."""
    return score_rollout(run.reward_fns, rollout, examples, context, **scoring_options(run))


def advance_state(state, step: int, task, per_step: int) -> None:
    """The run's trainer_state (transformers' TrainerState, None: nothing) as TRL's is while step `step`'s
    batch is scored: global_step = steps done before it, epoch = the training rows used so far over the
    task's size (0 when the task has no size), at `per_step` prompts per step."""
    if state is None:
        return
    state.global_step = step - 1
    size = len(task) if hasattr(task, "__len__") else 0
    state.epoch = (step - 1) / math.ceil(size / per_step) if size and per_step else 0.0


def rollout_and_score(
    run: Run,
    examples: list[Example],
    *,
    G: int,
    generator: torch.Generator | None = None,
    sampling: Sampling | None = None,
) -> tuple[Rollout, Scores, dict]:
    """Roll out and score: single-turn (rollout_examples), or multi-turn in the run's environment
    (grpolab.training.agents.agent_rollout), scored while its environments are open, then closed.
    `sampling`: default run.sampling. Returns (rollout, scores, info: the environments' metrics and
    time/score_s)."""
    fns, options = run.reward_fns, scoring_options(run)
    if run.environments is None:
        rollout = rollout_examples(run, examples, G=G, generator=generator, sampling=sampling)
        t0 = time.perf_counter()
        scores = score_rollout(fns, rollout, examples, **options)
        return rollout, scores, {"time/score_s": time.perf_counter() - t0}
    rollout, context, info = agent_rollout(run, examples, G=G, generator=generator, sampling=sampling)
    unstarted = context.pop(UNSTARTED, [])
    t0 = time.perf_counter()
    try:
        scores = score_rollout(fns, rollout, examples, context, **options)
        info |= env_reward_metrics(scores)
    finally:
        close_all(context["environments"])
    for i in unstarted:  # an environment that could not start: the group scores 0 (no advantage within it)
        scores.total[i] = 0.0
    return rollout, scores, {**info, "time/score_s": time.perf_counter() - t0}


def collect(run: Run, step: int) -> Batch:
    """Sample prompts, roll out and score them. With dynamic sampling (DAPO), groups whose rewards are
    all equal are dropped and more prompts are sampled, up to `algo.max_resample_rounds` extra rounds;
    the reward metrics cover every sampled completion, the batch only the kept ones."""
    cfg, algo, task, d = run.cfg, run.cfg.algo, run.task, run.ranks
    prompts_per_step = cfg.batch_size // cfg.G
    rng, generator = step_rng(cfg.seed, step, run.device, d.rank)
    advance_state(run.trainer_state, step, task, prompts_per_step)
    epochs = cfg.num_train_epochs is not None and hasattr(task, "epoch_rows")
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
        if epochs and not n_groups:  # the epochs' next rows
            drawn = task.epoch_rows(
                (step - 1) * need * d.world - run.data_shift,  # ignore_data_skip: grpolab.training.resume
                need * d.world,
                cfg.seed if cfg.data_seed is None else cfg.data_seed,
                cfg.shuffle,
            )
        else:
            drawn = task.sample(need * d.world, rng)
        examples = drawn[rank_slice(need * d.world, d)]  # this rank's share
        t0 = time.perf_counter()
        rollout, scores, info = rollout_and_score(run, examples, G=cfg.G, generator=generator)
        scoring_s = info.pop("time/score_s")
        t_score += scoring_s
        t_generate += time.perf_counter() - t0 - scoring_s
        raw = torch.tensor(scores.total, dtype=torch.float32)  # (n,)
        informative = informative_groups(raw, cfg.G) if algo.dynamic_sampling else None  # (n / G,)
        part = Batch(examples, rollout, raw, scores.per_fn, extra=scores.extra)
        for name, message in scores.first_errors.items():
            first_errors.setdefault(name, message)
        sampled_rewards.append(raw)
        round_metrics.append(({**scores.metrics, **info}, len(rollout.texts)))
        n_groups += len(examples)
        if informative is not None:
            part = part.keep_groups(informative)
        if not part.empty:
            kept.append(part)
    metrics = weighted_mean(round_metrics)
    for k in {k for m, _ in round_metrics for k in m if is_count(k)}:  # counts: sum over rounds, not mean
        metrics[k] = float(sum(m.get(k, 0.0) for m, _ in round_metrics))
    raw = torch.cat(sampled_rewards)  # (every sampled completion,)
    metrics |= {
        "time/generate_s": t_generate,
        "time/score_s": t_score,
        "reward/mean": float(raw.mean()),
        "reward/std": float(raw.std()) if len(raw) > 1 else 0.0,
    }
    n_kept = sum(len(b.examples) for b in kept)
    if algo.dynamic_sampling:
        metrics |= {
            "dapo/groups_sampled": n_groups,
            "dapo/groups_dropped": n_groups - n_kept,
            "dapo/groups_kept": n_kept,
        }
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


def reference(ref: Reference | None, spec: PassSpec, batch: Batch) -> None:
    """batch.ref_logp (N, C): log pi_ref of the completions, one no-grad pass (only with a reference)."""
    if ref is not None:
        with ref.model() as m:  # a frozen copy, or the LoRA policy with its adapter off
            batch.ref_logp = logp_without_grad(spec, m, batch.rollout)


def combined_reward(run: Run, batch: Batch) -> Tensor:
    """(N,) the one reward the shaping starts from: the verifiers' weighted sum (batch.raw_reward), or under
    algo.reward_aggregation normalize_then_sum (GDPO) each verifier's reward z-scored in its group, then the
    weighted sum (grpolab.algo.advantages.REWARD_AGGREGATIONS)."""
    algo = run.cfg.algo
    if algo.reward_aggregation == "sum_then_normalize":
        return batch.raw_reward
    per_fn = torch.tensor([batch.reward_by_fn[f.name] for f in run.reward_fns], dtype=torch.float32).T  # (N, K)
    weights = torch.tensor([f.weight for f in run.reward_fns], dtype=torch.float32)  # (K,)
    return REWARD_AGGREGATIONS[algo.reward_aggregation](per_fn, weights, batch.rollout.G, algo.adv_eps)


def shape(run: Run, batch: Batch) -> None:
    """batch.reward (N,) and batch.token_reward (N, C): every reward change after the verifiers
    (`combined_reward`, grpolab.algo.shaping), plus `groups/zero_std_frac` of the shaped reward."""
    algo, rollout = run.cfg.algo, batch.rollout
    kl_in_reward = batch.ref_logp is not None and algo.kl_in_reward
    sampled = (
        sampled_logp(run.policy, run.pass_spec, rollout, run.plain_sampling, run.engine.samples_from_trainer)
        if kl_in_reward
        else None
    )  # (N, C) log pi_theta of the sampled tokens
    shaped = shape_rewards(
        combined_reward(run, batch),
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
    reference(run.ref, run.pass_spec, batch)
    shape(run, batch)
    batch.adv = run.advantage.targets(run.pass_spec, batch)  # (N,) or (N, C)
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
        **completion_stats(batch),
        "memory/peak_mb": peak_memory_mb(run.device),
        "params/trained": float(run.trained_params()),
        "time/step_s": time.perf_counter() - t_start,
    }
    metrics = reduce_metrics(run.ranks, metrics)  # data parallel: over ranks; one process: as is
    if kl_measured:
        run.kl.update(metrics["kl"], len(batch.reward) * run.ranks.world)
    return metrics, batch


def completion_stats(batch: Batch) -> dict:
    """The statistics of the step's completions TRL logs too (docs/metrics.md): the shortest length, the
    mean, shortest and longest length of the completions that ended (EOS; 0 when none did), the prompt tokens
    (padding left out, one prompt per completion)."""
    rollout = batch.rollout
    lengths = rollout.lengths.float()  # (N,)
    ended = lengths[~rollout.truncated]
    out = {
        "completion/length_min": float(lengths.min()),
        "completion/ended_length_mean": float(ended.mean()) if len(ended) else 0.0,
        "completion/ended_length_min": float(ended.min()) if len(ended) else 0.0,
        "completion/ended_length_max": float(ended.max()) if len(ended) else 0.0,
        "tokens/prompt": float(rollout.prompt_mask.sum()),
    }
    return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: GPU allocator peak on CUDA, process peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
