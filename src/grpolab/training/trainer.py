"""The loop around the training step: setup, evaluation before and after, checkpoints, the summary.

    run = setup(cfg)                          policy, reference (beta > 0), critic (PPO), optimizer, task,
                                              verifiers   (grpolab.training.run.Run)
    evaluate(run, held_out)                   held-out accuracy and pass@k before training
    for step in start+1..steps:                    (grpolab.training.evaluation)
        metrics, batch = train_step(run, step)     collect -> reference -> shape -> advantages -> update
                                                   (grpolab.training.step)
        every eval_steps: metrics += eval/...      (and the best model, a stop at eval_stop_at)
        log metrics, samples; checkpoint every save_every steps
    evaluate(run, held_out); summary.json     with the paired before/after change and its interval

The step itself is grpolab.training.step; this file owns everything a step does not, with what the loop
writes after a step and at its end (checkpoints, stops, summary, report) in grpolab.training.finish.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from grpolab.algo.entropy import AdaptiveEntropy
from grpolab.algo.kl import AdaptiveKL
from grpolab.engine import EngineContext, EngineError, build_engine, rollout_precision, rollout_probe
from grpolab.engine.kv_cache import call_tokens
from grpolab.engine.native.generate import eos_token_ids
from grpolab.model import precision
from grpolab.model.load import (
    load_policy,
    load_tokenizer,
    local_dir,
    model_dir,
    pick_device,
    prepare_policy,
    prepare_tokenizer,
)
from grpolab.model.lora import attach, is_peft, trainable_parameters
from grpolab.model.loss_scale import LOSS_SCALE, fp16_refusal, loss_scaler
from grpolab.model.moe import router_aux_of
from grpolab.model.numerics import start_numerics
from grpolab.model.optim import adamw, build_scheduler
from grpolab.model.reference import FrozenCopy, reference_for, reference_kind, synced_reference
from grpolab.model.template import set_template_kwargs
from grpolab.parallel import distributed
from grpolab.parallel import fsdp as sharding
from grpolab.parallel.allocator import keep_freed_memory
from grpolab.rewards import build_rewards, check_rewards
from grpolab.rewards.contract import trainer_state
from grpolab.rewards.reward_model import place_reward_models
from grpolab.tasks import build_task
from grpolab.training.agents import ENV_REWARD, env_reward, load_environments
from grpolab.training.callbacks import Callbacks
from grpolab.training.components import GroupBaseline
from grpolab.training.config import Config, fold_report_to, save_config, to_dict
from grpolab.training.diagnostics import CollapseWatcher
from grpolab.training.evaluation import Evaluator, summary_fields
from grpolab.training.finish import (
    ReportWriter,
    check_nonfinite,
    resume_command,
    save_or_stop,
    summarise,
    write_run_report,
    write_summary,
)
from grpolab.training.metrics import JsonlWriter, MetricsLogger, NoFile, check_out_dir, make_out_dir, sample_table
from grpolab.training.options import check_engine_kwargs, lr_updates
from grpolab.training.plan.check import check_run
from grpolab.training.resume import resume_state
from grpolab.training.run import (
    Run,
    check_epochs,
    check_same_lora,
    choose_engine,
    pass_spec_of,
    rollout_sampling,
    samples_plainly,
)
from grpolab.training.step import train_step
from grpolab.training.stops import RunStopped, StopSignals, check_reward_failures
from grpolab.training.token_credit import sample_records
from grpolab.training.trackers import check_installed
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write, read_jsonl
from grpolab.util.threads import FILE as THREADS_FILE
from grpolab.util.threads import (
    LoadFollower,
    choose_threads,
    cores,
    current,
    describe_threads,
    follows_load,
    recorded_threads,
    start_load,
)


def setup(
    cfg: Config,
    *,
    resume: bool = False,
    training: bool = True,
    log: Callable[[str], None] = print,
    dist=None,
    policy=None,
    tokenizer=None,
    reference=None,
) -> Run:
    """Load models, task, rewards and optimizer. Raises ConfigError before writing anything.

    training=False (evaluation) writes nothing and loads neither a reference model nor a critic.
    With lora.r > 0 the policy is a peft model whose adapter alone is trained; its reference is the
    same network with the adapter off (grpolab.model.reference). policy, tokenizer: a model object and its
    tokenizer built by the caller (TRL's model= and processing_class=), trained in place instead of loading
    cfg.model (grpolab.model.load.prepare_policy); a peft model keeps its adapter and trains it, its
    reference the adapter off. cfg.model then only names where it came from (a directory, or not). reference:
    the caller's frozen copy of that model (TRL's trainer.ref_model), used as the reference of a KL term.
    """
    out = Path(cfg.out)
    if training:
        check_out_dir(out, resume)
        if resume:
            check_same_lora(out, cfg)
    task = build_task(cfg.task, cfg.seed, cfg.task_args, environment=cfg.env.enabled)
    check_epochs(cfg, task, log)
    reward_fns = build_rewards(cfg.rewards or task.default_rewards)
    device = pick_device(cfg.device)
    wait = current(cfg.thread_wait)
    threads, why = choose_threads(
        cfg.threads, recorded_threads(out) if resume else None, measured=start_load(), per_thread=wait.sleeps_soon
    )
    torch.set_num_threads(threads)
    log(describe_threads(threads, wait, why=why))  # the first line (util.threads)
    if device.type == "cpu" and cfg.cpu_malloc == "keep":
        keep_freed_memory()
    given = policy is not None
    if given and tokenizer is None:
        raise ConfigError("processing_class: a model object needs its tokenizer (processing_class=...)")
    path = local_dir(cfg.model) if given else model_dir(cfg.model, log=log)
    start_numerics(cfg.seed, cfg.tf32, cfg.full_determinism)  # torch.manual_seed; TF32, deterministic algorithms
    tokenizer = prepare_tokenizer(tokenizer) if given else load_tokenizer(path)
    environments = load_environments(cfg.env, tokenizer, task.system_prompt, log)  # checked before any model load
    if environments is not None and environments.has_reward and cfg.env.reward_weight > 0:
        if any(f.name == ENV_REWARD for f in reward_fns):
            raise ConfigError(
                f"rewards: the label {ENV_REWARD!r} is the environment's own reward; give yours another label"
            )
        reward_fns.append(env_reward(cfg.env.reward_weight))  # the environment's own reward, one reward column
    if not reward_fns:
        raise ConfigError(
            "rewards: no reward source: the task has no default reward and the environment gives none "
            "(TRL's get_reward); list rewards=[...] (e.g. a function file.py:fn), or give the "
            "environment class a get_reward(self) method"
        )
    check_rewards(reward_fns, task, environment=environments is not None)  # exit 2 for a keyword nothing provides
    engine_name, why = choose_engine(cfg, path, device, dist)
    check_engine_kwargs(cfg, engine_name)
    log(f"rollout engine: {engine_name} ({why})")
    set_template_kwargs(tokenizer, cfg.chat_template_kwargs)  # every prompt and conversation rendered
    fsdp = dist is not None and dist.fsdp  # FSDP2: loaded on the CPU, each rank's shard then moves to the device
    if cfg.precision == "fp16" and (why := fp16_refusal(device, sharded=fsdp, critic=cfg.algo.uses_critic)):
        raise ConfigError(why)  # before any model is loaded
    place = torch.device("cpu") if fsdp else device
    policy = prepare_policy(policy, place) if given else load_policy(path, place)
    policy.train()
    adapter = given and is_peft(policy)  # a peft model handed in: its adapter is what trains
    algo = cfg.algo
    router = router_aux_of(policy, algo.router_aux_loss_coef)  # an MoE's load-balancing term, or None
    advantage = GroupBaseline(algo)
    components = {}
    if training and algo.uses_critic:  # before the adapter: the critic copies the plain backbone
        from grpolab.model.critic import Critic

        advantage = components["critic"] = Critic(
            policy, algo, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay, device=device
        )
    if training and not adapter:
        policy = attach(policy, cfg.lora)  # lora.r > 0: a peft model, only the adapter trainable
    lora_r = cfg.lora.r or int(adapter)
    kind = reference_kind(algo.beta, algo.adaptive_kl, lora_r)
    ref = reference_for(policy, kind, reference if kind == "copy" else None) if training else None
    if training and algo.adaptive_entropy:  # its coefficient goes into each checkpoint (entropy_control.pt)
        components["entropy_control"] = AdaptiveEntropy.from_algo(algo)
    if ref is not None and algo.sync_ref_model:  # its moving weights go into each checkpoint (reference.pt)
        components["reference"] = synced_reference(ref, fsdp)
    if training and cfg.precision == "fp16":  # its scale goes into each checkpoint (loss_scale.pt)
        components[LOSS_SCALE] = loss_scaler(device)
    if fsdp:
        ref = sharding.shard_models(policy, ref, dist, device)
    prec = precision.choose(
        cfg.precision,
        policy,
        device,
        training=training,
        distributed=dist is not None and dist.active,
        rollout_probe=rollout_probe(engine_name, cfg.decoder),
        recorded=out / precision.FILE if resume else None,
        rows=cfg.batch_size,
        tokens=cfg.max_new_tokens,
        engine_rollout=rollout_precision(engine_name),
        log=log,
    )
    log(prec.describe())
    place_reward_models(reward_fns, device, prec.update, cfg.chat_template_kwargs)  # the policy's device and autocast
    if isinstance(ref, FrozenCopy) and prec.update is not None:  # its passes run under run.pass_spec's autocast
        ref.store_linear_in(prec.update)
    optimizer = scheduler = None  # evaluation updates nothing (a loaded LoRA adapter has no trainable weight)
    if training:
        optimizer = adamw(
            trainable_parameters(policy),
            lr=cfg.lr,
            betas=tuple(cfg.adam_betas),
            weight_decay=cfg.weight_decay,
            sharded=fsdp,
        )
        scheduler = build_scheduler(optimizer, cfg.lr_scheduler, **lr_updates(cfg), options=cfg.lr_scheduler_kwargs)
    eos_ids = eos_token_ids(policy, tokenizer)
    ctx = EngineContext(
        cfg.rollout,
        policy,
        tokenizer,
        path,
        device,
        prec.rollout,
        cfg.decoder,
        eos_ids,
        max_model_len=None,
        seed=cfg.seed,
        kv_tokens=call_tokens(
            max(cfg.batch_size, cfg.eval_size, cfg.eval_num_generations),
            cfg.max_completion_tokens + (cfg.env.max_env_tokens if cfg.env.enabled else 0),
        ),
    )
    try:
        engine = build_engine(engine_name, ctx)
    except EngineError as e:  # nothing written yet
        raise RunStopped(f"rollout engine: {e}", 1) from e
    if engine_name != "native":
        log(f"rollout engine ready: {engine.describe()}")
    sampling = rollout_sampling(cfg)
    return Run(
        cfg=cfg,
        out=out,
        device=device,
        amp_dtype=prec.update,
        tokenizer=tokenizer,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        task=task,
        reward_fns=reward_fns,
        eos_ids=eos_ids,
        advantage=advantage,
        kl=AdaptiveKL.from_algo(algo),
        sampling=sampling,
        pass_spec=pass_spec_of(cfg, device, prec.update, router),
        plain_sampling=samples_plainly(sampling),
        ref=ref,
        log=log,
        components=components,
        dist=dist,
        precision=prec,
        environments=environments,
        engine=engine,
        trainer_state=trainer_state(0, cfg.steps),
    )


def train(
    cfg: Config,
    *,
    resume: bool = False,
    console=None,
    report: ReportWriter | None = None,
    callbacks=None,
    policy=None,
    tokenizer=None,
    reference=None,
) -> dict:
    """Run `cfg.steps` steps (continuing the newest checkpoint when resuming). Returns the summary.

    report: writes OUT/report.html when cfg.report (the command line and grpolab.train pass
    grpolab.app.report.write_run_report); None writes none. callbacks: objects with hooks, or transformers
    TrainerCallbacks (grpolab.training.callbacks); one can stop the run after a step. policy, tokenizer: a
    model object and its tokenizer to train in place instead of loading cfg.model (`setup`); reference: its frozen
    copy, the KL term's reference (`setup`)."""
    from grpolab.training.progress import Progress, print_summary

    hooks = Callbacks(callbacks)  # checked before anything runs (ConfigError, exit 2)
    fold_report_to(cfg)
    check_installed(cfg.report_to)  # a tracker's missing extra: exit 2 before anything is loaded or written
    d = distributed.from_environment(cfg.device, cfg.fsdp)  # torchrun: this process's rank; else one process
    distributed.check_supported(cfg, d)
    log = (console.print if console is not None else print) if d.main else _quiet
    how = "--resume" if resume else "resume=auto"
    # resume=auto: continue the run in OUT if there is one (every rank decides before the barrier
    # below, so before rank 0 writes anything: all see the same OUT); otherwise a new run
    resume = check_out_dir(Path(cfg.out), resume, auto=cfg.resume == "auto")
    run = setup(cfg, resume=resume, log=log, dist=d, policy=policy, tokenizer=tokenizer, reference=reference)
    check_run(run, log)  # before step 1: a warning when grpolab plan puts the peak over the device's memory
    distributed.barrier(d)  # every rank has checked OUT before rank 0 writes into it
    start = resume_state(run, how) if resume else 0
    run.engine.sync(run.policy, start)  # an engine with its own weights serves the checkpoint's
    main = d.main  # only rank 0 writes files, evaluates and shows progress
    if main:
        make_out_dir(run.out)
    if main and (not resume or start < cfg.steps):  # a resumed run records its new steps= (and other overrides)
        save_config(cfg, run.out / "config.yaml")
        atomic_write(run.out / precision.FILE, json.dumps(run.precision.to_json(), indent=2) + "\n")
        atomic_write(run.out / THREADS_FILE, json.dumps({"threads": torch.get_num_threads()}) + "\n")
    if start >= cfg.steps:
        log(f"{run.out} already finished {start} steps (steps={cfg.steps}); nothing to do")
    logger = (
        NoFile()
        if not main
        else MetricsLogger(
            run.out,
            cfg.report_to,
            start if resume else None,
            log=log,
            config=to_dict(cfg),
            run_name=cfg.run_name,
            project=cfg.project,
            listeners=[hooks.listener],
        )
    )
    samples = JsonlWriter(run.out / "samples.jsonl", keep_until_step=start if resume else None) if main else NoFile()
    summary_path = run.out / "summary.json"
    prior = json.loads(summary_path.read_text()) if resume and summary_path.exists() else {}
    eval_set = run.task.eval_set()[: cfg.eval_size] if cfg.eval_size and main else []
    hooks.begin(
        cfg,
        run.out,
        start,
        is_main=main,
        rows=len(run.task) if hasattr(run.task, "epoch_rows") else None,
        objects={
            "model": run.policy,
            "processing_class": run.tokenizer,
            "optimizer": run.optimizer,
            "lr_scheduler": run.scheduler,
            "reward_names": [f.name for f in run.reward_fns],
        },
    )
    # the one place an evaluation happens: Evaluator.evaluate_at; with eval_steps=0 the evaluations before
    # and after training are in no metrics row, so the trackers and callbacks get them on their own
    evaluator = Evaluator(
        run,
        eval_set,
        logger,
        on_evaluate=None if cfg.eval_steps else lambda step, metrics, res: logger.track({"step": step, **metrics}),
    )
    prior_before = prior.get("eval_before") if resume else None
    before = evaluator.at_start(prior_before)
    if main and before is not None and prior_before is None:
        write_summary(summary_path, {"eval_before": before})
    distributed.barrier(d)
    progress = Progress(cfg.steps, start, enabled=cfg.progress and main, console=console)
    watcher = CollapseWatcher.for_run(cfg, log, run.out / "metrics.jsonl", start)  # a resumed run continues it
    follower = load_follower(run)
    stopped = None
    try:
        with StopSignals(log=log) as signals:
            for step in range(start + 1, cfg.steps + 1):
                hooks.step_begin(step)
                run.updates = []  # filled by the step's update (none when dynamic sampling kept no group)
                m, batch = engine_step(run, step)
                m["threads"] = float(torch.get_num_threads())
                watcher.update(m, batch)  # rolling length-reward correlation, collapse alerts
                if evaluator.due(step):
                    m.update(evaluator.evaluate_at(step))
                hooks.step_end(step, m, run.updates)
                logger.log(m)
                if cfg.samples_per_step and not batch.empty:
                    records = sample_records(batch, step, cfg.samples_per_step, run=run)
                    for rec in records:
                        samples.write(rec)
                    logger.log_table("samples", sample_table(records), step)
                progress.advance(m)
                follow_load(run, follower, log)
                check_nonfinite(run, step)
                # any rank signalled; any rank's callback asked to stop, or to save
                stop, halt, keep = distributed.global_counts(
                    d, float(signals.requested or 0), float(hooks.should_stop), float(hooks.should_save)
                )
                if (
                    (cfg.save_every and step % cfg.save_every == 0)
                    or step == cfg.steps
                    or stop
                    or halt
                    or keep
                    or evaluator.stop_reason
                ):
                    if step == cfg.steps:  # the run's tail says what it does: checkpoint, evaluation, report
                        log(f"saving the checkpoint of step {step}, the last...")
                    hooks.saved(save_or_stop(run, step))
                if evaluator.stop_reason:  # eval_stop_at: finished early, summary and report as at the end
                    log(f"stopping: {evaluator.stop_reason}")
                    break
                if halt and not stop:  # a callback: end as at the last step (evaluation, summary, report), exit 0
                    stopped = {"step": step, "reason": hooks.state.stop_reason or "a callback on another rank"}
                    log(f"stopped after step {step}: {stopped['reason']}; checkpoint written")
                    break
                if stop:
                    if main:
                        write_run_report(run, log, report)
                    name, code = (
                        signals.name or "a signal to another rank",
                        signals.exit_code if signals.requested else 143,
                    )
                    raise RunStopped(
                        f"stopped by {name} after step {step}; checkpoint written. "
                        f"Continue with: {resume_command(run)}",
                        code,
                    )
                check_reward_failures(run, step, m, batch, log, save=save_or_stop, resume=resume_command(run))
        progress.close()
        after = evaluator.final(stopped["step"] if stopped else cfg.steps)  # before the trackers close
    finally:
        progress.close()
        logger.close()
        samples.close()
    run.engine.close()
    if not main:  # the other ranks are done: rank 0 writes the summary
        hooks.end({})
        distributed.barrier(d)
        return {}
    history = read_jsonl(run.out / "metrics.jsonl")
    summary = summarise(history, before, after, run.out, report=cfg.report)
    summary.update(summary_fields(before, after, evaluator, cfg.seed))
    summary["stopped"] = stopped  # None, or the step and reason of a callback's stop
    write_summary(summary_path, summary)
    write_run_report(run, log, report)
    print_summary(summary, console=console)
    hooks.end(summary)
    distributed.barrier(d)
    return summary


def load_follower(run: Run) -> LoadFollower | None:
    """threads=0 on a CPU in one process follows the load between steps (grpolab.util.threads.LoadFollower);
    None where the count is fixed (threads=N, OMP_NUM_THREADS, torchrun, a GPU)."""
    if not follows_load(run.cfg.threads) or run.device.type != "cpu" or run.ranks.world > 1:
        return None
    follower = LoadFollower(torch.get_num_threads(), cores(), per_thread=current(run.cfg.thread_wait).sleeps_soon)
    follower.start()
    return follower


def follow_load(run: Run, follower: LoadFollower | None, log) -> None:
    """After a step: the count the load calls for, set, said and written to OUT/threads.json (a resumed run
    starts from the latest count)."""
    change = follower.after_step() if follower is not None else None
    if change is None:
        return
    threads, note = change
    torch.set_num_threads(threads)
    log(note)
    atomic_write(run.out / THREADS_FILE, json.dumps({"threads": threads}) + "\n")


def engine_step(run: Run, step: int):
    """train_step, with an engine that fails (vLLM refusing the new weights) stopping the run with its
    reason (exit 1): the step was not checkpointed, the previous checkpoint is intact."""
    try:
        return train_step(run, step)
    except EngineError as e:
        raise RunStopped(f"step {step}: {e}. Continue with: {resume_command(run)}", 1) from e


def _quiet(*args, **kwargs) -> None:
    """The console of a rank other than 0: says nothing."""
