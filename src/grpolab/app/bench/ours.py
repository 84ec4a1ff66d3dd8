"""grpolab's side of the benchmark: grpolab.training.trainer.setup + grpolab.training.step.train_step, timed per phase.

Every completion is forced to the full length by running with no EOS id (run.eos_ids = set()); the
reward is grpolab.app.bench.spec.bench_reward. The agent setting keeps EOS (a turn must end for its tool
call to run) and loads the model from bench_model_dir (the shared chat template); its rollouts go
through grpolab.training.agents (grpolab.env.rollout) with env.name = BenchCalculator. Phases: generation (time/generate_s), scoring
(time/score_s), reference (the no-grad pass of pi_ref, timed around grpolab.training.step.reference), update
(the rest of time/update_s: shaping, advantages, forward+backward, optimizer step).
"""

from __future__ import annotations

import sys
import tempfile
import time

from grpolab.app.bench.spec import Spec, grpolab_config


class _PhaseClock:
    """Times grpolab.training.step.reference while installed (train_step looks the name up at each call)."""

    def __init__(self):
        import grpolab.training.step as step_mod

        self.mod, self.orig, self.seconds = step_mod, step_mod.reference, 0.0

    def __enter__(self):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self.orig(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        self.mod.reference = timed
        return self

    def __exit__(self, *exc):
        self.mod.reference = self.orig


def setup_run(spec: Spec, out: str, model: str | None = None, engine: str = "native", **overrides):
    """The grpolab Run of the setting, with EOS disabled (every completion runs to new_tokens) except in the
    agent setting; `model`: the directory to load instead of spec.model (bench_model_dir);
    `overrides`: Config fields to change (benchmarks/ab.py phases's --cpu-malloc)."""
    import dataclasses

    from grpolab.training.trainer import setup

    cfg = dataclasses.replace(grpolab_config(spec, out, model=model, engine=engine), **overrides)
    run = setup(cfg, log=lambda *_: None)
    if not spec.agent:
        run.eos_ids = run.engine.eos_ids = set()  # the engine stops on its own copy
    return run


def measure(spec: Spec, engine: str = "native") -> dict:
    """One warm-up step, then spec.steps timed steps; per-step times, phases, tokens and peak memory."""
    from grpolab.app.bench.agent import bench_model_dir
    from grpolab.training.step import peak_memory_mb, train_step

    with tempfile.TemporaryDirectory(prefix="grpolab-bench-") as tmp:
        run = setup_run(spec, f"{tmp}/run", model=bench_model_dir(spec, tmp) if spec.agent else None, engine=engine)
        steps = []
        for step in range(1, spec.steps + 2):
            _sync(run.device)
            with _PhaseClock() as clock:
                t0 = time.perf_counter()
                m, batch = train_step(run, step)
                _sync(run.device)
                wall = time.perf_counter() - t0
            if batch.empty:
                raise RuntimeError("grpolab: a step had no batch (every group skipped); cannot time it")
            gen, score = m["time/generate_s"], m["time/score_s"]
            ref = clock.seconds
            seqs = m.get("update/seqs_computed", float(len(batch.reward)))
            steps.append(
                {
                    "step_s": wall,
                    "generation_s": gen,
                    "score_s": score,
                    "reference_s": ref,
                    "update_s": max(0.0, wall - gen - score - ref),
                    "generated_tokens": float(batch.rollout.completion_mask.sum()),
                    "trained_tokens": float(batch.rollout.completion_mask.sum()) * seqs / len(batch.reward),
                    "seqs_computed": seqs,
                    "seqs": float(len(batch.reward)),
                    "prompt_tokens_mean": float(batch.rollout.prompt_mask.sum(-1).float().mean()),
                    "completion_tokens_mean": float(batch.rollout.lengths.float().mean()),
                }
            )
            if spec.agent:
                steps[-1].update(agent_step(m, batch))
            print(f"grpolab step {step}{' (warm-up)' if step == 1 else ''}: {wall:.2f} s", file=sys.stderr, flush=True)
        phases = phase_precisions(run)
        label = (
            phases["generation"]
            if phases["generation"] == phases["update"]
            else f"{phases['generation']}/{phases['update']}"
        )
        run.engine.close()
        info = {
            "precision": label,
            "phase_precision": phases,
            "engine": run.engine.name,
            "device": str(run.device),
            "trained_params": run.trained_params(),
            "peak_mb": peak_memory_mb(run.device),
            "warmup": steps[0],
            "steps": steps[1:],
        }
        info.update(model_sizes(run.policy))
        return info


def agent_step(m: dict, batch) -> dict:
    """A multi-turn step's shapes, named as trl_side records TRL's: model turns and tool calls per
    trajectory, tokens the environment added, tool-call turns that did not parse or failed."""
    env_tokens = float(batch.rollout.env_mask.sum()) if batch.rollout.env_mask is not None else 0.0
    errors = sum(v for k, v in m.items() if k.startswith("env/errors_"))
    return {
        "turns_mean": m.get("env/turns_mean"),
        "tool_calls_mean": m.get("env/tool_calls_mean"),
        "env_tokens": env_tokens,
        "tool_errors": float(errors),
        "stopped": {k.split("env/stopped_")[1]: v for k, v in m.items() if k.startswith("env/stopped_")},
    }


def phase_precisions(run) -> dict:
    """ "fp32" or "bf16" per phase: precision=auto may choose per phase (grpolab.model.precision)."""

    def name(dtype) -> str:
        return "fp32" if dtype is None else "bf16"

    prec = getattr(run, "precision", None)
    rollout = prec.rollout if prec is not None else run.amp_dtype
    return {"generation": name(rollout), "reference": name(run.amp_dtype), "update": name(run.amp_dtype)}


def model_sizes(model) -> dict:
    """Parameter counts for the floor's formulas: N without the input embedding (and without a tied LM
    head, which is the same matrix), the LM head's V x H, vocabulary and hidden size, and the KV cache's
    bytes per token and row (None where the config does not say)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = base.get_input_embeddings().weight
    head = base.get_output_embeddings()
    head = getattr(head, "base_layer", head).weight  # through a LoRA wrapper, should the head have one
    seen, total = set(), 0
    for name, p in base.named_parameters():
        if id(p) not in seen and "lora_" not in name:  # the base weights; adapters are not in N
            seen.add(id(p))
            total += p.numel()
    tied = head.data_ptr() == emb.data_ptr()
    non_embedding = total - emb.numel() - (0 if tied else head.numel())
    cfg = getattr(base, "config", None)
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or (int(head.shape[1]) // heads if heads else None)
    return {
        "params_non_embedding": int(non_embedding),
        "vocab": int(head.shape[0]),
        "hidden": int(head.shape[1]),
        # keys and values of every layer, per cached token and row, fp32 (the lean step's cache)
        "kv_slot_bytes": 2 * layers * kv * head_dim * 4 if layers and kv and head_dim else None,
    }


def check_sequences(spec: Spec, n_prompts: int = 2, G: int = 2, max_tokens: int = 16):
    """A few sequences sampled by grpolab in fp32 (no EOS) and grpolab's per-token log-probs of them:
    (run, rollout, logp (n, C), chat messages of the prompts)."""
    import torch

    from grpolab.app.bench.spec import step_prompts
    from grpolab.engine.native.generate import generate
    from grpolab.model.logprobs import completion_logp
    from grpolab.model.template import chat_prompts

    check = Spec(**{**spec.to_dict(), "precision": "fp32", "lora_r": 0, "beta": 0.0})
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-") as tmp:
        run = setup_run(check, f"{tmp}/run")
    msgs = step_prompts(Spec(**{**check.to_dict(), "prompts": n_prompts}), run.task, 1)
    ids = chat_prompts(run.tokenizer, msgs, None)  # the messages carry the task's system prompt, if any
    g = torch.Generator(device=run.device).manual_seed(spec.seed)
    run.policy.eval()
    rollout = generate(
        run.policy, run.tokenizer, ids, G=G, max_new_tokens=min(max_tokens, spec.new_tokens), generator=g, eos_ids=set()
    )
    dev = run.device
    with torch.no_grad():
        logp, _ = completion_logp(
            run.policy,
            rollout.prompt_ids.to(dev),
            rollout.prompt_mask.to(dev),
            rollout.completion_ids.to(dev),
            rollout.completion_mask.to(dev),
        )
    return run, rollout, logp.cpu(), msgs, ids


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


__all__ = ["check_sequences", "measure", "model_sizes", "setup_run"]
