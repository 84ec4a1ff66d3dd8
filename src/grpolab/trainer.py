"""The training loop: rollout -> reward -> advantage -> update, composed from plain functions.

    for step in 1..steps:
        examples = task.sample(B)                          # B prompts
        rollout  = generate(policy, examples, G)           # N = B*G completions   (rollout.py)
        r        = score(rollout.texts, examples)          # (N,) verifiable rewards (rewards/)
        A        = compute_advantages(r, G, algo)          # (N,) or (N, C) with a critic (advantages.py)
        for _ in range(mu):                                # inner updates
            loss = sum over micro-batches of policy_loss(logp, logp_old, A, ...)   (losses.py)
            AdamW step
        log metrics, samples, checkpoint

Everything the loop needs lives in a `Run` (models, optimizer, task, reward functions); the loop
keeps no global state, so the same functions serve one process or one data-parallel rank.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from grpolab import advantages as adv_mod
from grpolab import losses as loss_mod
from grpolab.config import Config, save_config
from grpolab.metrics import JsonlWriter, MetricsLogger, weighted_mean
from grpolab.models import frozen_copy, load_policy, load_tokenizer, model_dir, pick_device, pick_dtype
from grpolab.rewards import build_rewards, score_completions
from grpolab.rollout import Rollout, chat_prompts, concat_rollouts, eos_token_ids, generate
from grpolab.logprobs import grouped_completion_logp
from grpolab.tasks import build_task
from grpolab.types import ConfigError, Example


@dataclass
class Run:
    """What one training run holds. Built by `setup`, used by the step functions."""

    cfg: Config
    out: Path
    device: torch.device
    amp_dtype: torch.dtype | None
    tokenizer: Any
    policy: Any
    ref: Any | None
    critic: Any | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic_optimizer: torch.optim.Optimizer | None
    task: Any
    reward_fns: list
    eos_ids: set[int]
    log: Callable[[str], None] = print
    kl_ctl: Any = None
    last_batch: tuple | None = None  # (rollout, examples, rewards, per-function scores) of the latest step

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)


def check_out_dir(out: Path, resume: bool) -> None:
    """Refuse to overwrite an existing run (exit 2) unless resuming it."""
    if resume:
        if not (out / "config.yaml").exists():
            raise ConfigError(f"--resume {out}: not a grpolab run directory (no config.yaml)")
        return
    if out.exists() and any((out / n).exists() for n in ("metrics.jsonl", "config.yaml", "checkpoints")):
        raise ConfigError(f"out: {out} already holds a run; continue it with `grpolab train --resume {out}` "
                          f"or choose another out=DIR (nothing was written)")


def warmup_lambda(warmup: int) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warm-up over `warmup` updates, then 1."""
    return lambda i: min(1.0, (i + 1) / warmup) if warmup > 0 else 1.0


def setup(cfg: Config, *, resume: bool = False, training: bool = True,
          log: Callable[[str], None] = print) -> Run:
    """Load models, task, rewards and optimizer. Raises ConfigError before writing anything.

    training=False (evaluation) writes nothing and loads neither a reference model nor a critic.
    """
    out = Path(cfg.out)
    if training:
        check_out_dir(out, resume)
    task = build_task(cfg.task, cfg.seed, cfg.task_args)
    reward_fns = build_rewards(cfg.rewards or task.default_rewards)
    device = pick_device(cfg.device)
    amp_dtype = pick_dtype(cfg.precision, device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    path = model_dir(cfg.model, log=log)
    torch.manual_seed(cfg.seed)
    tok = load_tokenizer(path)
    policy = load_policy(path, device)
    policy.train()
    algo = cfg.algo
    ref = frozen_copy(policy) if training and (algo.beta > 0 or algo.adaptive_kl) else None
    critic = critic_opt = None
    if training and algo.uses_critic:
        from grpolab.critic import ValueModel

        critic = ValueModel(policy).to(device)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=algo.critic_lr or cfg.lr,
                                       betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_lambda(cfg.warmup_steps * algo.mu))
    kl_ctl = None
    if algo.adaptive_kl:
        from grpolab.kl import AdaptiveKL

        kl_ctl = AdaptiveKL.from_algo(algo)
    return Run(cfg, out, device, amp_dtype, tok, policy, ref, critic, optimizer, scheduler, critic_opt, task,
               reward_fns, eos_token_ids(policy, tok), log=log, kl_ctl=kl_ctl)


def step_rng(seed: int, step: int) -> tuple[random.Random, torch.Generator]:
    """Per-step generators derived from (seed, step): a resumed run draws exactly what it would have."""
    s = (seed * 1_000_003 + step) % (2**63)
    g = torch.Generator()
    g.manual_seed(s)
    return random.Random(s), g


def rollout_examples(run: Run, examples: list[Example], *, G: int, greedy: bool = False,
                     generator: torch.Generator | None = None) -> Rollout:
    """G completions for each example, in the model's chat template."""
    ids = chat_prompts(run.tokenizer, [e.prompt for e in examples], run.task.system_prompt)
    gen = generator
    if gen is not None and run.device.type != "cpu":
        gen = torch.Generator(device=run.device)
        gen.manual_seed(int(generator.initial_seed()))
    return generate(run.policy, run.tokenizer, ids, G=G, max_new_tokens=run.cfg.max_new_tokens,
                    temperature=run.cfg.temperature, top_p=run.cfg.top_p, greedy=greedy,
                    autocast_dtype=run.amp_dtype, generator=gen, eos_ids=run.eos_ids)


def score(run: Run, rollout: Rollout, examples: list[Example]):
    """Verifiable rewards for every completion (examples repeated G times to match the layout)."""
    per_completion = [e for e in examples for _ in range(rollout.G)]
    return score_completions(run.reward_fns, rollout.texts, per_completion, timeout_s=run.cfg.reward_timeout_s,
                             workers=run.cfg.reward_workers)


def collect(run: Run, step: int) -> tuple[Rollout, list[Example], torch.Tensor, dict, dict]:
    """Sample prompts, roll out and score them. With dynamic sampling (DAPO), groups whose rewards are
    all equal are dropped and more prompts are sampled, up to `algo.max_resample_rounds` extra rounds."""
    cfg, algo = run.cfg, run.cfg.algo
    B = cfg.batch_size // cfg.G
    rng, gen = step_rng(cfg.seed, step)
    dynamic = algo.dynamic_sampling
    rounds = 1 + (algo.max_resample_rounds if dynamic else 0)
    kept_r: list[Rollout] = []
    kept_e: list[Example] = []
    kept_rewards: list[torch.Tensor] = []
    per_fn: dict[str, list[float]] = {}
    rmetrics: list[tuple[dict, float]] = []
    t_gen = t_score = 0.0
    n_groups = n_dropped = 0
    all_rewards = []
    for _ in range(rounds):
        need = B - len(kept_e)
        if need <= 0:
            break
        examples = run.task.sample(need if dynamic else B, rng)
        t0 = time.perf_counter()
        ro = rollout_examples(run, examples, G=cfg.G, generator=gen)
        t1 = time.perf_counter()
        sc = score(run, ro, examples)
        t_score += time.perf_counter() - t1
        t_gen += t1 - t0
        r = torch.tensor(sc.total, dtype=torch.float32)  # (n,)
        all_rewards.append(r)
        rmetrics.append((sc.metrics, len(ro.texts)))
        n_groups += len(examples)
        if dynamic:
            keep = adv_mod.dynamic_sampling_keep(r, cfg.G)  # (n/G,) bool
            n_dropped += int((~keep).sum())
            rows = keep.repeat_interleave(cfg.G).nonzero().squeeze(-1)
            if len(rows) == 0:
                continue
            ro, r = ro.select(rows), r[rows]
            examples = [e for e, k in zip(examples, keep.tolist()) if k]
            sc_fn = {k: [v[i] for i in rows.tolist()] for k, v in sc.per_fn.items()}
        else:
            sc_fn = sc.per_fn
        kept_r.append(ro)
        kept_e.extend(examples)
        kept_rewards.append(r)
        for k, v in sc_fn.items():
            per_fn.setdefault(k, []).extend(v)
    metrics = weighted_mean(rmetrics)
    for k in ("reward/errors", "reward/timeouts"):  # counts: sum, not mean
        metrics[k] = float(sum(m.get(k, 0.0) for m, _ in rmetrics))
    raw = torch.cat(all_rewards)
    metrics.update({"time/generate_s": t_gen, "time/score_s": t_score,
                    "reward/mean": float(raw.mean()), "reward/std": float(raw.std()) if len(raw) > 1 else 0.0})
    if dynamic:
        metrics.update({"dapo/groups_sampled": n_groups, "dapo/groups_dropped": n_dropped,
                        "dapo/groups_kept": len(kept_e)})
    if not kept_r:
        return None, [], torch.zeros(0), metrics, {}  # type: ignore[return-value]
    return concat_rollouts(kept_r), kept_e, torch.cat(kept_rewards), metrics, per_fn


def micro_batches(ro: Rollout, groups: torch.Tensor, seqs_per_batch: int) -> list[torch.Tensor]:
    """Split prompt groups into micro-batches of whole groups (a group shares its prompt pass), longest
    completions first so that each micro-batch carries little padding. Returns row indices per batch."""
    G = ro.G
    if len(groups) == 0:
        return []
    longest = ro.completion_mask.sum(-1).view(-1, G).amax(-1)[groups]  # (g,)
    groups = groups[torch.argsort(longest, descending=True)]
    per = max(1, seqs_per_batch // G)
    offs = torch.arange(G)
    return [(groups[s:s + per, None] * G + offs).reshape(-1) for s in range(0, len(groups), per)]


def _trim(ro: Rollout, rows: torch.Tensor, device) -> tuple[torch.Tensor, ...]:
    """Whole groups `rows` of the rollout: one prompt row per group (B', P') and the completions
    (B'*G, C'), cut to their longest completion and their shortest prompt padding."""
    prow = rows[::ro.G]
    pm = ro.prompt_mask[prow]
    cm = ro.completion_mask[rows]
    first = int((pm.sum(0) > 0).nonzero().min())  # drop all-padding prompt columns
    C = int((cm.sum(0) > 0).nonzero().max()) + 1
    return (ro.prompt_ids[prow, first:].to(device), pm[:, first:].to(device),
            ro.completion_ids[rows, :C].to(device), cm[:, :C].to(device))


def group_logp(run: Run, model, ro: Rollout, rows: torch.Tensor, *, with_entropy: bool = False):
    """log pi (and entropy) of the completion tokens of whole groups `rows`, each prompt computed once."""
    p, pm, c, cm = _trim(ro, rows, run.device)
    with run.autocast():
        logp, ent = grouped_completion_logp(model, p, pm, c, cm, ro.G, temperature=run.cfg.temperature,
                                            with_entropy=with_entropy)
    return logp.float(), ent, (p, pm, c, cm)


@torch.no_grad()
def frozen_logp(run: Run, model, ro: Rollout) -> torch.Tensor:
    """log pi of every completion token under a model without gradients (the reference), (N, C) on CPU."""
    N, C = ro.completion_ids.shape
    out = torch.zeros((N, C))
    for rows in micro_batches(ro, torch.arange(N // ro.G), run.cfg.micro_batch):
        lp, _, _ = group_logp(run, model, ro, rows)
        out[rows, :lp.shape[1]] = lp.cpu()
    return out


def update(run: Run, ro: Rollout, adv: torch.Tensor, ref_logp: torch.Tensor | None,
           returns: torch.Tensor | None = None, old_values: torch.Tensor | None = None) -> dict:
    """`algo.mu` optimizer updates on one rollout batch. adv: (N,) or (N, C).

    The first pass of the first update records log pi_old = log pi_theta (detached): the weights have
    not moved yet, so no separate old-log-prob pass is needed. Micro-batches hold whole groups (the
    prompt is computed once per group). A group whose sequences all have zero advantage adds nothing to
    the policy gradient and is not computed at all (unless a KL term or a critic needs it); the
    normalisers n_seq / n_tok still count it, so the loss is unchanged.
    """
    cfg, algo = run.cfg, run.cfg.algo
    N, C = ro.completion_ids.shape
    mask = ro.completion_mask  # (N, C)
    n_tok = int(mask.sum())
    kl_in_loss = ref_logp is not None and algo.kl_placement == "in_loss"
    adv_tok = adv if adv.dim() == 2 else adv[:, None].expand(N, C)  # (N, C)
    busy = (adv_tok.abs() * mask).sum(-1) > 0  # (N,)
    if kl_in_loss or run.critic is not None:
        busy = torch.ones(N, dtype=torch.bool)
    batches = micro_batches(ro, busy.view(-1, ro.G).any(-1).nonzero().squeeze(-1), cfg.micro_batch)
    n_rows = sum(len(b) for b in batches)
    old_logp = torch.zeros((N, C))
    infos: list[tuple[dict, float]] = []
    ent_items: list[tuple[dict, float]] = []
    grad_norms = []
    beta = run.kl_ctl.value if run.kl_ctl is not None else algo.beta
    for it in range(algo.mu):
        if not batches:
            break
        for idx in batches:
            logp, ent, (p, pm, c, cm) = group_logp(run, run.policy, ro, idx, with_entropy=(it == 0))  # (b, Cb)
            Cb = c.shape[1]
            if it == 0:
                old_logp[idx, :Cb] = logp.detach().cpu()
                ntok_mb = float(cm.sum())
                ent_items.append(({"entropy": float((ent * cm).sum() / cm.sum().clamp(min=1))}, ntok_mb))
            old = old_logp[idx, :Cb].to(run.device)
            a = adv_tok[idx, :Cb].to(run.device)
            ref = ref_logp[idx, :Cb].to(run.device) if kl_in_loss else None
            loss, info = loss_mod.policy_loss(logp, old, a if adv.dim() == 2 else a[:, 0], cm, algo, beta=beta,
                                              ref_logp=ref, n_seq=N, n_tok=n_tok, max_len=cfg.max_new_tokens)
            if run.critic is not None:
                from grpolab.critic import completion_values, value_loss

                with run.autocast():
                    v = run.critic(*_full_sequences(p, pm, c, cm, ro.G))
                v = completion_values(v.float(), p.shape[1], Cb)  # (b, Cb): V(s_t) for each completion token
                vl, vinfo = value_loss(v, old_values[idx, :Cb].to(run.device), returns[idx, :Cb].to(run.device),
                                       cm, algo.value_clip, n_tok=n_tok)
                loss = loss + algo.vf_coef * vl
                info = {**info, **vinfo}
            loss.backward()
            infos.append((info, float(cm.sum())))
        if cfg.max_grad_norm > 0:
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(run.policy.parameters(), cfg.max_grad_norm)))
            if run.critic is not None:
                torch.nn.utils.clip_grad_norm_(run.critic.parameters(), cfg.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()  # warm-up counts optimizer updates actually made
        if run.critic_optimizer is not None:
            run.critic_optimizer.step()
            run.critic_optimizer.zero_grad(set_to_none=True)
    m = weighted_mean(infos)
    m.update(weighted_mean(ent_items))
    m["update/seqs_computed"] = float(n_rows)
    m["update/skipped"] = float(n_rows == 0)
    if grad_norms:
        m["grad_norm"] = sum(grad_norms) / len(grad_norms)
    m["lr"] = run.scheduler.get_last_lr()[0]
    m["kl/beta"] = beta
    return m


def _full_sequences(p, pm, c, cm, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion ids and mask per sequence (the critic reads whole sequences)."""
    return (torch.cat([p.repeat_interleave(G, 0), c], 1),
            torch.cat([pm.repeat_interleave(G, 0), cm.long()], 1))


def critic_targets(run: Run, ro: Rollout, r: torch.Tensor, kl_pen_tok: torch.Tensor | None):
    """PPO: values V(s_t) of every completion token (no grad), then GAE advantages and returns."""
    from grpolab.critic import completion_values, ppo_advantages

    N, C = ro.completion_ids.shape
    values = torch.zeros((N, C))
    with torch.no_grad():
        for idx in micro_batches(ro, torch.arange(N // ro.G), run.cfg.micro_batch):
            p, pm, c, cm = _trim(ro, idx, run.device)
            with run.autocast():
                v = run.critic(*_full_sequences(p, pm, c, cm, ro.G))
            values[idx, :c.shape[1]] = completion_values(v.float(), p.shape[1], c.shape[1]).cpu()
    adv, ret = ppo_advantages(r, values, ro.completion_mask, run.cfg.algo, token_penalty=kl_pen_tok)
    return adv, ret, values


def train_step(run: Run, step: int) -> dict:
    """One step: collect, score, advantages, update. Returns the step's metrics."""
    cfg, algo = run.cfg, run.cfg.algo
    t_start = time.perf_counter()
    run.last_batch = None
    ro, examples, r, metrics, per_fn = collect(run, step)
    if ro is None:  # dynamic sampling found no informative group
        metrics.update({"step": step, "update/skipped": 1.0, "time/step_s": time.perf_counter() - t_start})
        return metrics
    lengths = ro.lengths
    buffer = algo.overlong_buffer
    if buffer > 0:
        pen = adv_mod.overlong_penalty(lengths, cfg.max_new_tokens, buffer, algo.overlong_penalty)
        r = r + pen
        metrics["reward/overlong_penalty_mean"] = float(pen.mean())
    t0 = time.perf_counter()
    ref_logp = None
    kl_pen_tok = None
    if run.ref is not None:
        ref_logp = frozen_logp(run, run.ref, ro)
        if algo.kl_placement == "in_reward":
            from grpolab.kl import kl_per_token

            pol = frozen_logp(run, run.policy, ro)
            beta = run.kl_ctl.value if run.kl_ctl is not None else algo.beta
            kl_tok = kl_per_token(pol, ref_logp, ro.completion_mask, algo.kl_estimator)  # (N, C), 0 on padding
            kl_pen_tok = beta * kl_tok
            if not algo.uses_critic:
                r = r - kl_pen_tok.sum(-1)
            metrics["kl"] = float(kl_tok.sum() / ro.completion_mask.sum())
    G = cfg.G
    groups = r.view(-1, G)
    metrics["groups/zero_std_frac"] = float((groups.std(-1, unbiased=False) == 0).float().mean()) if G > 1 else 1.0
    returns = old_values = None
    if run.critic is not None:
        adv, returns, old_values = critic_targets(run, ro, r, kl_pen_tok)
    else:
        adv = adv_mod.compute_advantages(r, G, algo)  # (N,)
    metrics["adv/abs_mean"] = float(adv.abs().mean())
    um = update(run, ro, adv, ref_logp, returns, old_values)
    if "kl" in metrics and "kl" in um and algo.kl_placement == "in_reward":
        um.pop("kl")
    metrics.update(um)
    if run.kl_ctl is not None and "kl" in metrics:
        run.kl_ctl.update(metrics["kl"], len(r))
    metrics.setdefault("kl", 0.0)
    metrics.setdefault("clip/frac", 0.0)
    metrics.setdefault("entropy", float("nan"))
    metrics["time/update_s"] = time.perf_counter() - t0
    metrics.update({
        "step": step,
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": float(ro.truncated.float().mean()),
        "tokens/generated": float(lengths.sum()),
        "memory/peak_mb": peak_memory_mb(run.device),
        "params/trained": float(trained_params(run)),
        "time/step_s": time.perf_counter() - t_start,
    })
    run.last_batch = (ro, examples, r, per_fn)
    return {"step": step, **metrics}  # step first in metrics.jsonl


def trained_params(run: Run) -> int:
    n = sum(p.numel() for p in run.policy.parameters() if p.requires_grad)
    if run.critic is not None:
        n += sum(p.numel() for p in run.critic.parameters() if p.requires_grad)
    return n


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: GPU allocator peak on CUDA, process peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample_records(run: Run, step: int, k: int) -> list[dict]:
    """The first `k` completions of the step, with prompt, answer and reward per function."""
    ro, examples, r, per_fn = run.last_batch
    out = []
    for i in range(min(k, len(ro.texts))):
        ex = examples[i // ro.G]
        out.append({"step": step, "id": ex.id, "prompt": ex.prompt, "answer": ex.answer, "completion": ro.texts[i],
                    "reward": float(r[i]), "rewards": {k2: v[i] for k2, v in per_fn.items()},
                    "length": int(ro.completion_mask[i].sum()), "truncated": bool(ro.truncated[i])})
    return out


def evaluate(run: Run, examples: list[Example]) -> dict:
    """Greedy completions on held-out prompts. accuracy = mean of the main (highest-weight) reward."""
    if not examples:
        return {}
    main = max(run.reward_fns, key=lambda f: f.weight).name
    totals, mains, lengths = [], [], []
    for s in range(0, len(examples), run.cfg.eval_batch):
        chunk = examples[s:s + run.cfg.eval_batch]
        ro = rollout_examples(run, chunk, G=1, greedy=True)
        sc = score(run, ro, chunk)
        totals += sc.total
        mains += sc.per_fn[main]
        lengths += ro.lengths.tolist()
    return {"accuracy": sum(mains) / len(mains), "reward": sum(totals) / len(totals),
            "length": sum(lengths) / len(lengths), "n": len(examples), "main_reward": main}


def save(run: Run, step: int) -> Path:
    from grpolab.checkpoint import save_checkpoint

    state = {"step": step}
    if run.critic is not None:
        torch.save({"critic": run.critic.state_dict(), "opt": run.critic_optimizer.state_dict()},
                   run.out / "critic.pt.tmp")
        os.replace(run.out / "critic.pt.tmp", run.out / "critic.pt")
    if run.kl_ctl is not None:
        state["kl_beta"] = run.kl_ctl.value
    return save_checkpoint(run.out, step, run.policy, run.tokenizer, run.optimizer, run.scheduler, state,
                           keep_last=run.cfg.keep_checkpoints)


def resume_state(run: Run) -> int:
    """Load the newest checkpoint of run.out; returns the step it ended at (0 if none)."""
    from grpolab.checkpoint import latest_checkpoint, load_checkpoint

    ck = latest_checkpoint(run.out)
    if ck is None:
        return 0
    state = load_checkpoint(ck, run.policy, run.optimizer, run.scheduler)
    if run.critic is not None and (run.out / "critic.pt").exists():
        blob = torch.load(run.out / "critic.pt", weights_only=True)
        run.critic.load_state_dict(blob["critic"])
        run.critic_optimizer.load_state_dict(blob["opt"])
    if run.kl_ctl is not None and "kl_beta" in state:
        run.kl_ctl.value = state["kl_beta"]
    return int(state["step"])


def train(cfg: Config, *, resume: bool = False, console=None) -> dict:
    """Run `cfg.steps` steps (continuing the newest checkpoint when resuming). Returns the summary."""
    from grpolab.progress import Progress, print_summary

    log = console.print if console is not None else print
    run = setup(cfg, resume=resume, log=log)
    run.out.mkdir(parents=True, exist_ok=True)
    start = resume_state(run) if resume else 0
    if not resume or start < cfg.steps:  # a resumed run records its new steps= (and other overrides)
        save_config(cfg, run.out / "config.yaml")
    if start >= cfg.steps:
        log(f"{run.out} already finished {start} steps (steps={cfg.steps}); nothing to do")
    logger = MetricsLogger(run.out, cfg.tensorboard, resume_step=start if resume else None)
    samples = JsonlWriter(run.out / "samples.jsonl", keep_until_step=start if resume else None)
    summary_path = run.out / "summary.json"
    prior = json.loads(summary_path.read_text()) if resume and summary_path.exists() else {}
    eval_set = run.task.eval_set()[: cfg.eval_size] if cfg.eval_size else []
    before = prior.get("eval_before") if resume else None
    if before is None and eval_set:
        log(f"evaluating {len(eval_set)} held-out prompts before training (greedy)...")
        before = evaluate(run, eval_set)
        _write_summary(summary_path, {"eval_before": before})
    progress = Progress(cfg.steps, start, enabled=cfg.progress, console=console)
    try:
        for step in range(start + 1, cfg.steps + 1):
            m = train_step(run, step)
            logger.log(m)
            if cfg.samples_per_step and run.last_batch is not None:
                for rec in sample_records(run, step, cfg.samples_per_step):
                    samples.write(rec)
            progress.advance(m)
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
                save(run, step)
    finally:
        progress.close()
        logger.close()
        samples.close()
    after = evaluate(run, eval_set) if eval_set else None
    from grpolab.metrics import read_jsonl

    history = read_jsonl(run.out / "metrics.jsonl")
    summary = summarise(history, before, after, run.out)
    _write_summary(summary_path, summary)
    print_summary(summary, console=console)
    return summary


def _write_summary(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(history: list[dict], before: dict | None, after: dict | None, out: Path, k: int = 5) -> dict:
    """Start vs end: mean reward and length over the first and last k steps, held-out accuracy."""
    first, last = history[:k], history[-k:]
    return {
        "steps": len(history),
        "reward_first": _mean([h.get("reward/mean") for h in first]),
        "reward_last": _mean([h.get("reward/mean") for h in last]),
        "length_first": _mean([h.get("completion/length_mean") for h in first]),
        "length_last": _mean([h.get("completion/length_mean") for h in last]),
        "eval_before": before,
        "eval_after": after,
        "time_s": sum(h.get("time/step_s", 0.0) for h in history),
        "out": str(out),
        "files": {n: str(out / n) for n in ("metrics.jsonl", "samples.jsonl", "config.yaml", "tb", "checkpoints")},
    }
