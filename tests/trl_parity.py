"""Helpers of tests/test_trl_parity.py: one step of TRL 1.16's GRPOTrainer and of grpolab on the same
GRPOConfig, the same tiny model, the same forced completions and the same reward functions; each side
returns (loss, gradient norm, (learning rate of the step's update, learning rate after it)).

`sampler=True` gives both sides the same sampling log-probs of another engine (`sampler_logps`: the
model's own, moved per sequence and per token), as vLLM would return them: TRL reads them as
sampling_per_token_logps (its vLLM importance correction with `vllm=True`, the off-policy mask), grpolab as
the rollout's sample_logp of an engine that is not the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

PROMPTS = ["The cat sat on", "A dog ran to"]  # the same token count: TRL's left padding shifts positions
G = 4
COMPLETION_LEN = 6


def forced_completions(tokenizer) -> dict[tuple[int, ...], list[list[int]]]:
    """prompt ids -> G completions (token ids, some ending early with EOS, some cut at the limit)."""
    eos = tokenizer.eos_token_id
    g = torch.Generator().manual_seed(0)
    out = {}
    for p in PROMPTS:
        ids = tuple(tokenizer(p)["input_ids"])
        rows = []
        for j in range(G):
            n = COMPLETION_LEN if j % 2 == 0 else 2 + j  # 6, 3, 6, 5 tokens
            toks = torch.randint(100, 2000, (n,), generator=g).tolist()
            if n < COMPLETION_LEN:
                toks[-1] = eos  # ended by the model: EOS is part of the completion
            rows.append(toks)
        out[ids] = rows
    return out


def reward(completions, **kwargs):
    """A reward that varies within each group: a function of the completion's text."""
    return [float(sum(map(ord, c)) % 7) / 3.0 for c in completions]


def reward_length(completions, **kwargs):
    """A second reward on another scale (multi-reward runs, GDPO): the text's length in characters / 4."""
    return [len(c) / 4.0 for c in completions]


def sampler_logps(model_dir: Path, tokenizer) -> dict[tuple[int, ...], list[list[float]]]:
    """prompt ids -> the G forced completions' sampling log-probs of a stand-in for another engine: the
    model's own log-prob of each token (fp32, temperature 1) plus a shift per sequence (the k-th of the
    batch: (3k mod 8 - 3.5) x 0.17, from -0.6 to 0.6 in a scrambled order) and a seeded one per token
    (normal, std 0.2), so that importance ratios and the sequences' mean log-ratio fall on both sides of
    the bounds the tests set, for sequences of either advantage sign."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    out, k = {}, 0
    with torch.no_grad():
        for ids, rows in forced_completions(tokenizer).items():
            lps = []
            for c in rows:
                seq_shift, k = ((3 * k) % 8 - 3.5) * 0.17, k + 1
                full = torch.tensor([list(ids) + c])
                logits = model(full).logits[0, len(ids) - 1 : -1]  # (len(c), V)
                own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
                shift = seq_shift + 0.2 * torch.randn(len(c), generator=g)
                lps.append((own + shift).tolist())
            out[ids] = lps
    return out


def trl_config(out: Path, **fields):
    """The shared config: TRL's GRPOConfig (TRL's defaults) made small and fp32 on the CPU."""
    import trl

    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=len(PROMPTS) * G,
        num_generations=G,
        max_completion_length=COMPLETION_LEN,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        max_steps=1,
        disable_tqdm=True,
    )
    base.update(fields)
    return trl.GRPOConfig(**base)


def grad_norm(params) -> float:
    return float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)))


def trl_step(
    model_dir: Path, args, *, rewards=(reward,), sampler: bool = False, vllm: bool = False
) -> tuple[float, float, tuple[float, float]]:
    """TRL: _generate_and_score_completions on the forced completions, compute_loss, backward; then the
    optimizer and schedule Trainer.train builds for args.max_steps, stepped once. sampler: the completions
    come with `sampler_logps`; vllm: TRL treats them as vLLM's (its importance correction applies)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=list(rewards),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    forced = forced_completions(trainer.processing_class)
    logps = sampler_logps(model_dir, trainer.processing_class) if sampler else None
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (
        [list(forced[tuple(p)][i % G]) for i, p in enumerate(prompt_ids)],
        None if logps is None else [list(logps[tuple(p)][i % G]) for i, p in enumerate(prompt_ids)],
    )
    trainer.use_vllm = vllm  # only the importance correction reads it once the completions are given
    rows = [{"prompt": p} for p in PROMPTS for _ in range(G)]  # TRL's sampler repeats each prompt G times
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions(rows)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    norm = grad_norm(trainer.model.parameters())
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    used = trainer.lr_scheduler.get_last_lr()[0]
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    return float(loss.detach()), norm, (used, trainer.lr_scheduler.get_last_lr()[0])


def grpolab_step(
    model_dir: Path, args, out: Path, monkeypatch, *, rewards=(reward,), sampler: bool = False
) -> tuple[float, float, tuple[float, float]]:
    """grpolab: the config the mapping table gives for `args`, one train_step on the forced completions;
    the loss is the sum of policy_loss's micro-batch losses, the norm clip_grad_norm_'s (before clipping).
    sampler: the rollout carries `sampler_logps` and the engine is not the trainer (as vLLM)."""
    from grpolab import rewards as rewards_mod
    from grpolab.app.trl_compat import trl_recipe
    from grpolab.batch import Rollout
    from grpolab.training import step as step_mod
    from grpolab.training import trainer
    from grpolab.training import update as update_mod
    from grpolab.training.config import build_config

    weights = args.reward_weights or [1.0] * len(rewards)
    for i, fn in enumerate(rewards):
        monkeypatch.setitem(rewards_mod.REWARDS, f"parity_reward{i}", rewards_mod.as_factory(fn))
    data = out.parent / f"{out.name}-prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    recipe = trl_recipe(args)[0]
    recipe.update(
        model=str(model_dir),
        out=str(out),
        task="dataset",
        eval_size=0,
        progress=False,
        report=False,
        rewards=[{"name": f"parity_reward{i}", "weight": float(w)} for i, w in enumerate(weights)],
        task_args={
            "path": str(data),
            "prompt_column": "prompt",
            "answer_column": None,
            "string_prompts": "raw",
            "eval_size": 0,
        },
    )
    cfg = build_config(recipe)
    run = trainer.setup(cfg, log=lambda *_: None)
    tok = run.tokenizer
    forced = forced_completions(tok)
    logps = sampler_logps(model_dir, tok) if sampler else None

    def generate(prompt_ids, sampling, *, G, generator=None):
        P = max(len(p) for p in prompt_ids)
        rows = [(p, c) for p in prompt_ids for c in forced[tuple(p)]]
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        pids = torch.tensor([[pad] * (P - len(p)) + list(p) for p, _ in rows])
        pmask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p, _ in rows])
        cids = torch.tensor([c + [pad] * (COMPLETION_LEN - len(c)) for _, c in rows])
        cmask = torch.tensor([[1.0] * len(c) + [0.0] * (COMPLETION_LEN - len(c)) for _, c in rows])
        truncated = torch.tensor([c[-1] != tok.eos_token_id for _, c in rows])
        texts = tok.batch_decode([c for _, c in rows], skip_special_tokens=True)
        slp = torch.zeros(cmask.shape)
        if logps is not None:
            for r, (p, _) in enumerate((p, j) for p in prompt_ids for j in range(G)):
                lp = logps[tuple(p)][r % G]
                slp[r, : len(lp)] = torch.tensor(lp)
        return Rollout(pids, pmask, cids, cmask, slp, truncated, texts, G)

    monkeypatch.setattr(run.engine, "generate", generate)
    if sampler:
        monkeypatch.setattr(type(run.engine), "samples_from_trainer", False)
    losses = []
    real = update_mod.policy_loss

    def recording(*a, **k):
        loss, info = real(*a, **k)
        losses.append(float(loss.detach()))
        return loss, info

    monkeypatch.setattr(update_mod, "policy_loss", recording)
    used = run.optimizer.param_groups[0]["lr"]
    metrics, _ = step_mod.train_step(run, 1)
    assert metrics["lr"] == used  # metrics' lr: the one the step's update used, as TRL logs it
    return sum(losses), metrics["grad_norm"], (used, run.optimizer.param_groups[0]["lr"])
