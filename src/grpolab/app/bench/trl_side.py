"""TRL's side of the benchmark: trl.GRPOTrainer (1.16) on the same setting, timed per optimizer step.

TRL keeps its own defaults except what makes the work equal to grpolab's: per_device_train_batch_size
= prompts x G, num_generations = G, gradient_accumulation_steps = 1 (so steps_per_generation = 1 and
num_iterations = 1: one generation per optimizer step, checked), max_completion_length = L and
generation_kwargs={"min_new_tokens": L} (no early EOS), the same beta, learning rate, temperature 1,
top_p 1, reward function and prompts (shuffle_dataset=False, in grpolab's order), no vLLM, no
logging, no saving. Its defaults that stay: loss_type "dapo", AdamW; gradient_checkpointing is TRL's
default (True) or False, the bench's two TRL configurations per precision (`checkpointing`).
With LoRA: peft_config=LoraConfig(r, lora_alpha=2r, lora_dropout=0, target_modules="all-linear"), the
same adapter as grpolab's lora.r=r lora.alpha=2r (every linear layer but the LM head).

The agent setting: environment_factory=BenchCalculator, the tokenizer of bench_model_dir (Qwen2.5's template,
TRL's response parser for it), generation_kwargs={"max_new_tokens": T} (one generate call is one turn),
max_tool_calling_iterations = K - 1 and max_completion_length = K T + (K - 1) ENV_REPLY_TOKENS (agent.agent_limits);
no min_new_tokens: a turn ends at EOS, as grpolab's does.
"""

from __future__ import annotations

import sys
import tempfile
import time

from grpolab.app.bench.spec import INSTALL_TRL, Spec, bench_reward


class TrlMissing(Exception):
    """TRL (or one of its dependencies) cannot be imported; the message says how to install it."""


def import_trl():
    """(GRPOConfig, GRPOTrainer), or TrlMissing with the install command."""
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise TrlMissing(f"{INSTALL_TRL} [{type(e).__name__}: {e}]") from e
    if getattr(trl, "__version__", "") != "1.16.0":
        import warnings

        warnings.warn(
            f"grpolab bench was written against trl 1.16.0; this is {getattr(trl, '__version__', '?')}", stacklevel=2
        )
    return GRPOConfig, GRPOTrainer


def make_trainer(
    spec: Spec,
    model_path: str,
    precision: str,
    prompts: list[list],
    out_dir: str,
    max_steps: int,
    callbacks: list | None = None,
    checkpointing: bool = True,
):
    """A GRPOTrainer on the setting; prompts are chat message lists, taken in order."""
    from datasets import Dataset

    GRPOConfig, GRPOTrainer = import_trl()
    on_cpu = _device(spec) == "cpu"
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=spec.completions,
        num_generations=spec.G,
        gradient_accumulation_steps=1,
        beta=spec.beta,
        learning_rate=spec.lr,
        temperature=1.0,
        top_p=1.0,
        bf16=precision == "bf16",
        use_cpu=on_cpu,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        max_steps=max_steps,
        shuffle_dataset=False,
        seed=spec.seed,
        disable_tqdm=True,
        use_vllm=False,
        gradient_checkpointing=checkpointing,
        **trl_shape_args(spec),
    )
    peft_config = None
    if spec.lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=spec.lora_r,
            lora_alpha=2 * spec.lora_r,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    agent = {}
    if spec.agent:
        import os

        from grpolab.app.bench.agent import BenchCalculator

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        agent = {"environment_factory": BenchCalculator, "processing_class": agent_tokenizer(model_path)}
    trainer = GRPOTrainer(
        model=str(model_path),
        reward_funcs=bench_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        peft_config=peft_config,
        callbacks=callbacks,
        **agent,
    )
    if trainer.args.steps_per_generation != 1 or trainer.num_iterations != 1:
        raise RuntimeError(
            f"TRL would not generate at every optimizer step (steps_per_generation="
            f"{trainer.args.steps_per_generation}, num_iterations={trainer.num_iterations})"
        )
    return trainer


def trl_shape_args(spec: Spec) -> dict:
    """GRPOConfig's length arguments: forced length (single-turn), or the agent setting's limits."""
    if not spec.agent:
        return {"max_completion_length": spec.new_tokens, "generation_kwargs": {"min_new_tokens": spec.new_tokens}}
    from grpolab.app.bench.agent import agent_limits

    lim = agent_limits(spec)
    return {
        "max_completion_length": lim["trl_max_completion_length"],
        "generation_kwargs": {"max_new_tokens": lim["trl_max_new_tokens"]},
        "max_tool_calling_iterations": lim["trl_tool_iterations"],
    }


def agent_tokenizer(model_path: str):
    """The tokenizer TRL would load itself (AutoProcessor, left padding and truncation) from the agent setting's
    model directory, with the response parser TRL has for Qwen2.5's template (add_response_schema)."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import add_response_schema

    tok = AutoProcessor.from_pretrained(str(model_path), truncation_side="left", padding_side="left")
    return add_response_schema(tok)  # ValueError if the template is not the one TRL ships as Qwen2.5's


def _device(spec: Spec) -> str:
    import torch

    if spec.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec.device


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _Clock:
    """Accumulated seconds and counts of the wrapped trainer methods."""

    def __init__(self):
        self.v = {
            "generation_s": 0.0,
            "score_s": 0.0,
            "gen_and_score_s": 0.0,
            "generations": 0,
            "rollouts": 0,
            "generated_tokens": 0.0,
            "trained_tokens": 0.0,
            "prompt_tokens": 0.0,
            "seqs": 0.0,
            "turn_rows": 0.0,
            "tool_calls": 0.0,
            "tool_failures": 0.0,
            "env_tokens": 0.0,
        }

    def wrap(self, trainer) -> None:
        v = self.v
        gen, rew, both = (
            trainer._generate_single_turn,
            trainer._calculate_rewards,
            trainer._generate_and_score_completions,
        )

        def timed_gen(*a, **k):
            _sync()
            t = time.perf_counter()
            out = gen(*a, **k)
            _sync()
            v["generation_s"] += time.perf_counter() - t
            v["generations"] += 1
            v["turn_rows"] += float(len(out[0]))  # one turn of each row in this generate call
            v["generated_tokens"] += float(sum(len(c) for c in out[0]))
            return out

        def timed_rew(*a, **k):
            t = time.perf_counter()
            out = rew(*a, **k)
            v["score_s"] += time.perf_counter() - t
            return out

        def timed_both(*a, **k):
            _sync()
            t = time.perf_counter()
            out = both(*a, **k)
            _sync()
            v["gen_and_score_s"] += time.perf_counter() - t
            v["rollouts"] += 1
            cmask = out["completion_mask"]
            if "tool_mask" in out:  # multi-turn: the model's tokens are completion_mask * tool_mask
                model = cmask * out["tool_mask"]
                v["env_tokens"] += float((cmask - model).sum())
                cmask = model
            v["trained_tokens"] += float(cmask.sum())
            v["prompt_tokens"] += float(out["prompt_mask"].sum())
            v["seqs"] += float(out["completion_mask"].shape[0])
            return out

        trainer._generate_single_turn, trainer._calculate_rewards = timed_gen, timed_rew
        trainer._generate_and_score_completions = timed_both
        if getattr(trainer, "tools", None):
            loop = trainer._tool_call_loop

            def counted_loop(*a, **k):
                out = loop(*a, **k)
                v["tool_calls"] += float(out[4])
                v["tool_failures"] += float(out[5])
                return out

            trainer._tool_call_loop = counted_loop


def _step_clock(clock: _Clock, steps: list, agent: bool = False):
    """A TrainerCallback recording each optimizer step: on_step_begin (after the data loader) to
    on_step_end (after the optimizer and scheduler step), with the wrapped methods' share of it."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            _sync()
            self.t, self.before = time.perf_counter(), dict(clock.v)

        def on_step_end(self, args, state, control, **kw):
            _sync()
            wall = time.perf_counter() - self.t
            d = {k: clock.v[k] - self.before[k] for k in clock.v}
            rest = d["gen_and_score_s"] - d["generation_s"] - d["score_s"]  # tokenising, the reference pass
            seqs = max(d["seqs"], 1.0)
            steps.append(
                {
                    "step_s": wall,
                    "generation_s": d["generation_s"],
                    "score_s": d["score_s"],
                    "reference_s": max(0.0, rest),
                    "update_s": max(0.0, wall - d["gen_and_score_s"]),
                    "generated_tokens": d["generated_tokens"],
                    "trained_tokens": d["trained_tokens"],
                    "generations": d["generations"],
                    "rollouts": d["rollouts"],
                    "seqs": d["seqs"],
                    "prompt_tokens_mean": d["prompt_tokens"] / seqs,
                }
            )
            if agent:
                steps[-1].update(
                    {
                        "turns_mean": d["turn_rows"] / seqs,
                        "tool_calls_mean": d["tool_calls"] / seqs,
                        "env_tokens": d["env_tokens"],
                        "tool_errors": d["tool_failures"],
                    }
                )
            print(
                f"TRL step {len(steps)}{' (warm-up)' if len(steps) == 1 else ''}: {wall:.2f} s",
                file=sys.stderr,
                flush=True,
            )

    return StepClock()


def measure(spec: Spec, model_path: str, precision: str, prompts: list[list], checkpointing: bool = True) -> dict:
    """TRL trains 1 warm-up + spec.steps steps; per-step times, phases, tokens and peak memory."""
    import torch

    from grpolab.training.step import peak_memory_mb

    clock, steps = _Clock(), []
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-trl-") as tmp:
        trainer = make_trainer(
            spec,
            model_path,
            precision,
            prompts,
            tmp,
            spec.steps + 1,
            callbacks=[_step_clock(clock, steps, spec.agent)],
            checkpointing=checkpointing,
        )
        clock.wrap(trainer)
        trainer.train()
        trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    # one rollout per optimizer step; single-turn: one generate call in it, multi-turn: one per turn
    if len(steps) != spec.steps + 1 or any(
        s["rollouts"] != 1 or (s["generations"] != 1 and not spec.agent) for s in steps
    ):
        raise RuntimeError(
            f"TRL ran {len(steps)} steps with {[s['rollouts'] for s in steps]} rollouts and "
            f"{[s['generations'] for s in steps]} generate calls each; expected {spec.steps + 1} "
            f"steps with one rollout each"
        )
    device = torch.device(_device(spec))
    return {
        "precision": precision,
        "device": str(device),
        "trained_params": int(trained),
        "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "loss_type": trainer.loss_type,
        "peak_mb": peak_memory_mb(device),
        "warmup": steps[0],
        "steps": steps[1:],
    }


def trl_logps(spec: Spec, model_path: str, prompts: list[list], input_ids, attention_mask, n_completion: int):
    """TRL's own per-token log-probs (GRPOTrainer._get_per_token_logps_and_entropies, fp32) of the
    sequences input_ids (n, P+C) (left-padded prompt + completion), and TRL's prompt token ids of the
    chat messages `prompts` (its _tokenize_prompts)."""
    import torch

    with tempfile.TemporaryDirectory(prefix="grpolab-bench-trl-") as tmp:
        trainer = make_trainer(
            Spec(**{**spec.to_dict(), "lora_r": 0, "beta": 0.0}), model_path, "fp32", prompts, tmp, 1
        )
        model = trainer.model
        model.eval()
        dev = next(model.parameters()).device
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                model, input_ids.to(dev), attention_mask.to(dev), n_completion
            )
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
    return logps.float().cpu(), [list(p) for p in prompt_ids]


__all__ = ["TrlMissing", "import_trl", "make_trainer", "measure", "trl_logps"]
