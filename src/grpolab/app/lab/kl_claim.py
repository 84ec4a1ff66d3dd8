"""Claim (lesson, E4): the KL term (beta > 0) keeps the policy near the reference; with beta = 0 a run
long enough drifts further from it. Two `grpolab train` runs that differ only in algo.beta (0 against
--beta), same model, task, steps, seed and a deliberately high learning rate so that drift can show.

Measured after training, on the held-out prompts (completions sampled from the trained policy):
  * KL to the reference: the exact KL(pi || pi_ref) over the vocabulary at each completion position,
    averaged over positions (not an estimator: both distributions are computed in full);
  * reward (the run's last quarter) and held-out accuracy (greedy, from summary.json);
  * capability retention: the mean log-prob per token of a fixed natural-language text that grpolab
    ships (src/grpolab/data/retention_text.json, CC0, written for grpolab) under the trained policy and
    under the reference. The default model is the aha miniature (grpolab lab aha), which never saw
    natural text: there this measures off-task drift (how much the log-probs of text the RL never
    sees moved), not a language skill. --model smollm2-135m --task arithmetic measures the real thing;
  * fluency of the completions: length, repetition (1 - distinct 4-grams / 4-grams of the text) and
    perplexity under the reference.
The verdict says what the KL term prevented here, and says so when it prevented nothing measurable.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

CLAIM = "the KL term keeps the policy near the reference (beta = 0 vs beta > 0)"
TEXT_FILE = Path(__file__).resolve().parents[2] / "data" / "retention_text.json"


def retention_text() -> str:
    return json.loads(TEXT_FILE.read_text())["text"]


def text_logprob(model, tok, text: str, window: int = 200) -> float:
    """Mean log-prob per token of `text` (chunks of `window` tokens, each scored from its start)."""
    import torch

    ids = tok(text, add_special_tokens=False)["input_ids"]
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[s : s + window + 1]])
            if chunk.shape[1] < 2:
                break
            logp = torch.log_softmax(model(input_ids=chunk).logits[0, :-1].float(), -1)
            total += float(logp.gather(-1, chunk[0, 1:, None]).sum())
            n += chunk.shape[1] - 1
    return total / max(1, n)


def repetition(text: str, n: int = 4) -> float:
    grams = [text[i : i + n] for i in range(len(text) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def completion_stats(policy, ref, tok, prompts: list[str], max_new_tokens: int, seed: int) -> dict:
    """Sample one completion per prompt from `policy`; exact KL(policy || ref) per position, the
    reference's perplexity of the completions, their length and repetition."""
    import torch

    from grpolab.engine.native.generate import eos_token_ids, generate
    from grpolab.model.template import chat_prompts

    g = torch.Generator().manual_seed(seed)
    ids = chat_prompts(tok, prompts, None)
    ro = generate(policy, tok, ids, G=1, max_new_tokens=max_new_tokens, generator=g, eos_ids=eos_token_ids(policy, tok))
    full = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask.long()], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        lp = torch.log_softmax(policy(input_ids=full, attention_mask=attn, position_ids=pos).logits.float(), -1)
        lr = torch.log_softmax(ref(input_ids=full, attention_mask=attn, position_ids=pos).logits.float(), -1)
    lp, lr = lp[:, P - 1 : -1], lr[:, P - 1 : -1]  # (N, C, V): the distributions of each completion token
    m = ro.completion_mask
    kl = ((lp.exp() * (lp - lr)).sum(-1) * m).sum() / m.sum()
    ref_tok = lr.gather(-1, ro.completion_ids[..., None]).squeeze(-1)
    ppl = math.exp(-float((ref_tok * m).sum() / m.sum()))
    return {
        "kl": float(kl),
        "ref_ppl": ppl,
        "length": float(ro.lengths.mean()),
        "repetition": sum(repetition(t) for t in ro.texts) / len(ro.texts),
        "samples": ro.texts[:4],
    }


def arm(beta: float, model: str, task: str, out: Path, steps: int, seed: int, lr: float, max_new_tokens: int) -> dict:
    import contextlib
    import io

    import torch

    from grpolab.model.load import load_policy, load_tokenizer
    from grpolab.tasks import build_task
    from grpolab.training.checkpoint import latest_checkpoint
    from grpolab.training.config import build_config
    from grpolab.training.trainer import train
    from grpolab.util.fileio import read_jsonl

    if out.exists():
        shutil.rmtree(out)
    cfg = build_config(
        {
            "out": str(out),
            "steps": steps,
            "seed": seed,
            "model": model,
            "task": task,
            "algo": {"name": "grpo", "beta": beta},
            "G": 8,
            "batch_size": 32,
            "micro_batch": 32,
            "max_new_tokens": max_new_tokens,
            "lr": lr,
            "eval_size": 32,
            "save_every": 0,
            "samples_per_step": 0,
            "tensorboard": False,
            "progress": False,
            "report": False,
            "threads": 1,
            "reward_workers": 1,
            "rollout": {"engine": "native"},
        },
        [],
    )  # the engine its numbers came from
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train(cfg)
    ms = read_jsonl(out / "metrics.jsonl")
    tok = load_tokenizer(Path(model))
    policy = load_policy(latest_checkpoint(out), torch.device("cpu")).eval()
    ref = load_policy(Path(model), torch.device("cpu")).eval()
    prompts = [e.prompt for e in build_task(task, seed).eval_set()[:32]]
    k = max(1, len(ms) // 4)
    text = retention_text()
    res = {
        "beta": beta,
        "reward_last": sum(m["reward/mean"] for m in ms[-k:]) / k,
        "accuracy": (summary.get("eval_after") or {}).get("accuracy"),
        "text_logp": text_logprob(policy, tok, text),
        "text_logp_ref": text_logprob(ref, tok, text),
        **completion_stats(policy, ref, tok, prompts, max_new_tokens, seed),
    }
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # the numbers are kept, the weights are not
    return res


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(
        prog="grpolab lab kl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="10 steps per arm (for the tests)")
    ap.add_argument("--steps", type=int, help="steps per arm (default 60; 10 with --quick)")
    ap.add_argument("--beta", type=float, default=0.1, help="the KL arm's algo.beta (default 0.1)")
    ap.add_argument(
        "--lr", type=float, help="learning rate (default 1e-3 with the miniature: 5x the aha lab, to drift)"
    )
    ap.add_argument("--model", help="model (default: the aha miniature's pre-trained model)")
    ap.add_argument("--task", help="task (default longsum with the miniature, else arithmetic)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/lab/kl")
    ns = ap.parse_args(argv)
    if ns.steps is not None and ns.steps < 1:
        ap.error("--steps must be >= 1")
    import torch

    torch.set_num_threads(1)
    steps = ns.steps or (10 if ns.quick else 60)
    if ns.model is None:
        from grpolab.app.lab.aha import MODES, pretrained_model

        model = str(pretrained_model("full", MODES["full"]["pretrain_steps"], ns.seed)[0])
        task, lr, mnt = ns.task or "longsum", ns.lr or 1e-3, 64
    else:
        model, task, lr, mnt = ns.model, ns.task or "arithmetic", ns.lr or 2e-5, 32
    out = Path(ns.out)
    a0 = arm(0.0, model, task, out / "beta0", steps, ns.seed, lr, mnt)
    a1 = arm(ns.beta, model, task, out / f"beta{ns.beta:g}", steps, ns.seed, lr, mnt)
    print(f"model={model} task={task}, {steps} steps per arm, lr {lr:g}, seed {ns.seed}; text: {TEXT_FILE.name} (CC0)")
    keys = [
        ("kl", "KL(pi || ref) per token"),
        ("reward_last", "reward, last quarter"),
        ("accuracy", "held-out accuracy"),
        ("text_logp", "text log-prob / token"),
        ("text_logp_ref", "  same under the reference"),
        ("length", "completion length"),
        ("repetition", "repetition (4-grams)"),
        ("ref_ppl", "ref perplexity"),
    ]
    print(
        table(
            ["", "beta=0", f"beta={ns.beta:g}"],
            [
                [label, a0[k] if a0[k] is not None else float("nan"), a1[k] if a1[k] is not None else float("nan")]
                for k, label in keys
            ],
        )
    )
    drift0, drift1 = a0["text_logp"] - a0["text_logp_ref"], a1["text_logp"] - a1["text_logp_ref"]
    prevented = []
    if a0["kl"] > 1.5 * a1["kl"] and a0["kl"] - a1["kl"] > 0.01:
        prevented.append(f"KL to the reference {a0['kl']:.3g} (beta=0) vs {a1['kl']:.3g}")
    if abs(drift0) > 1.5 * abs(drift1) and abs(drift0) - abs(drift1) > 0.01:
        prevented.append(f"text log-prob change {drift0:+.3g} vs {drift1:+.3g} nats/token")
    if a0["ref_ppl"] > 1.2 * a1["ref_ppl"]:
        prevented.append(f"reference perplexity of completions {a0['ref_ppl']:.3g} vs {a1['ref_ppl']:.3g}")
    cost = f"reward {a0['reward_last']:.2f} (beta=0) vs {a1['reward_last']:.2f} (beta={ns.beta:g})"
    if prevented:
        verdict = "holds here: the KL term kept the policy nearer the reference: " + "; ".join(prevented) + f"; {cost}"
    else:
        verdict = f"does not hold here: the KL term prevented nothing measurable on this budget ({cost})"
    print(verdict)
    return {"model": model, "task": task, "steps": steps, "beta0": a0, "beta": a1, "verdict": verdict}
