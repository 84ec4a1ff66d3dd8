"""Claim (the lesson's verifiable rewards, "tool-calling", taken to its end): trained with GRPO on the
final answer alone, a model learns to call a tool where the tool decides success, and to read its
result -- tool use is selected by the reward, as reasoning length is in `grpolab lab aha`, here in
miniature on a CPU.

1. A tiny character-level Llama (grpolab.app.lab.tinychar) whose tokenizer has a chat template that
   renders tool calls and results Hermes/Qwen style is pre-trained by supervised next-token training
   on sums. Worked examples ("347+589?") are answered with a tool trace:
   `<tool_call>{"name":"add","arguments":{"a":347,"b":589}}</tool_call>`, EOS, the tool's
   `<tool_response>936</tool_response>`, then a final answer that copies the result (or, a quarter of
   the time, ignores it and writes an estimate). After the task's prompt ("347+589=") most texts answer
   directly -- three-digit sums with an estimate, the sum rounded to ten ("940": what one does in one's
   head; right only when the sum ends in 0), one-digit sums ("3+5=") exactly -- and a fifth with a tool
   trace. The pre-trained model is cached ($GRPOLAB_CACHE/lab), keyed by its settings.
2. It is then trained with the real `grpolab train` (trainer, multi-turn rollout, GRPO) on three-digit
   sums, with a calculator written as a TRL environment_factory class
   (grpolab.app.lab.tools_env.Calculator). The only reward is the final answer's number (math,
   extract=last_number, on the last model turn). Nothing rewards calling the tool.
3. Printed per block of steps: the reward, the share of trajectories that call the tool, the share
   whose final answer is the tool's result, model turns per trajectory, model tokens; a verdict with
   the numbers. OUT/tools.json holds every number, OUT/tools.png the curves, OUT/calc/ the run (its
   report.html shows env/tool_calls_mean per step beside reward and length).

What it shows: RL on an answer-only reward selects tool use where the tool decides success, and the
reading of its result. What it does not show: tool use discovered from nothing -- the traces were in
the pre-training texts, as aha's step-by-step solutions were (docs/lab.md).

--ablate adds four arms on the same pre-trained model: a broken calculator (its answers unrelated to
the sum: calls should not rise); a cost of 0.1 per call on a mix of one-digit sums (which the model
gets right alone) and three-digit ones (calls should fall on the first and rise on the second), with
algo=grpo and again with algo=dr_grpo (GRPO divides by the group's reward std, which makes a small
cost a full-size penalty in a group that is otherwise all right); and THE WRONG SETTING: the tool's
result tokens left in the loss (grpolab masks them; this arm marks them as the model's own tokens, in
this module only, to measure what that does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

from grpolab.app.lab.tools_results import ablation_verdict, per_step, plot, samples_at, summary, verdict

CLAIM = "tool use emerges where the tool decides success: calls and reading the result rise with reward"

EXTRA_CHARS = '<>/_{}"'
WORDS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", '"name"', '"arguments"', '"add"')
"""Multi-character tokens, as a BPE vocabulary would merge them (Qwen's has <tool_call> as one token)."""
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}{{ m['content'] }}{{ eos_token }}"
    "{%- elif m['role'] == 'tool' -%}<tool_response>{{ m['content'] }}</tool_response>"
    "{%- else -%}{{ m['content'] }}"
    "{%- endif -%}{%- endfor -%}"
)
"""Append-only: user text as is, each model turn then EOS, each tool result in <tool_response> tags.
The stream of a tool-using trajectory: 347+589=<tool_call>{...}</tool_call><eos><tool_response>936</tool_response>936<eos>."""

MIX = {"worked": 0.5, "hard": 0.6, "hard_tool": 0.2, "easy_tool": 0.2, "reads": 0.75}
"""Pre-training texts: the share of worked examples (a three-digit sum after another prompt, "347+589?",
always answered with a tool trace: where the skill is learnt, as aha's step-by-step texts teach adding);
after the task's prompt ("347+589="), the share of three-digit sums (the rest one-digit sums), the share
of each written as a tool trace (the rest direct answers: for three-digit sums an estimate, the sum
rounded to ten; for one-digit sums the sum); and the share of three-digit traces whose final answer
copies the tool's result (the rest write the estimate, ignoring it)."""
MODEL = {"hidden": 96, "layers": 3, "heads": 4}
N_TEXTS = 20_000
PRETRAIN_STEPS = 1500
VERSION = 2  # bump when the corpus, the tokenizer or the model recipe changes (invalidates the cache)
COST = 0.1
ENV = {"max_turns": 3, "max_turn_tokens": 40, "max_model_tokens": 80, "max_env_tokens": 32}
ARMS = {  # name: (environment class in grpolab.app.lab.tools_env, its options, problems, algo, env tokens in the loss)
    "calc": ("Calculator", {}, "hard", "grpo", False),
    "broken_tool": ("BrokenCalculator", {}, "hard", "grpo", False),
    "cost_per_call": ("CostlyCalculator", {"cost": COST}, "mixed", "grpo", False),
    "cost_per_call_dr_grpo": ("CostlyCalculator", {"cost": COST}, "mixed", "dr_grpo", False),
    "env_tokens_in_loss": ("Calculator", {}, "hard", "grpo", True),
}


# ----------------------------------------------------------------------------- the tokenizer and the texts


def tool_tokenizer():
    """The character-level tokenizer of tinychar, with the characters of JSON tool calls, the WORDS as
    single tokens and TEMPLATE as its chat template."""
    from tokenizers import AddedToken

    from grpolab.app.lab import tinychar

    tok = tinychar.char_tokenizer(tinychar.CHARS + EXTRA_CHARS)
    tok.add_tokens([AddedToken(w, normalized=False) for w in WORDS])
    tok.chat_template = TEMPLATE
    return tok


def draw(kind: str, rng: random.Random) -> tuple[int, int]:
    """Two terms: three-digit ("hard", too long to add in one's head) or one-digit ("easy")."""
    lo, hi = (100, 999) if kind == "hard" else (1, 9)
    return rng.randint(lo, hi), rng.randint(lo, hi)


def estimate(total: int) -> str:
    """A direct answer to a three-digit sum, as one gives it without a calculator: the sum rounded to
    ten (half up). Right only when the sum ends in 0."""
    return str((total + 5) // 10 * 10)


def call_text(a: int, b: int) -> str:
    return f'<tool_call>{{"name":"add","arguments":{{"a":{a},"b":{b}}}}}</tool_call>'


def text(a: int, b: int, style: str, prompt_end: str = "=") -> tuple[str, str]:
    """(prompt, completion) of one pre-training text: the stream the template renders, EOS between turns.
    style: direct, tool (the final answer copies the result) or tool_ignored (it writes the estimate)."""
    total = a + b
    easy = max(a, b) < 10
    direct = str(total) if easy else estimate(total)
    prompt = f"{a}+{b}{prompt_end}"
    if style == "direct":
        return prompt, direct
    final = str(total) if style == "tool" else direct
    return prompt, f"{call_text(a, b)}<eos><tool_response>{total}</tool_response>{final}"


def corpus(mix: dict, n: int, seed: int) -> list[tuple[str, str]]:
    """The pre-training (prompt, completion) pairs (see MIX)."""
    rng = random.Random(f"grpolab/app/lab/tools/corpus/{seed}")
    out = []
    for _ in range(n):
        worked = rng.random() < mix["worked"]
        kind = "hard" if worked or rng.random() < mix["hard"] else "easy"
        a, b = draw(kind, rng)
        if worked or rng.random() < mix[f"{kind}_tool"]:
            style = "tool" if kind == "easy" or rng.random() < mix["reads"] else "tool_ignored"
        else:
            style = "direct"
        out.append(text(a, b, style, "?" if worked else "="))
    return out


def pretrained_model(pretrain_steps: int, seed: int, log=print) -> tuple[Path, dict]:
    """The cached pre-trained model (built once). Returns (directory, info)."""
    from grpolab.app.lab import tinychar
    from grpolab.app.lab.miniature import cached_model

    spec = {
        "mix": MIX,
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "model": MODEL,
        "n_texts": N_TEXTS,
        "version": VERSION,
    }

    def build(directory: Path, target: Path) -> dict:
        log(f"pre-training the tiny model ({pretrain_steps} steps; cached in {target})")
        tok = tool_tokenizer()
        model = tinychar.tiny_llama(tok, seed=seed, **MODEL)
        info = tinychar.pretrain(
            model,
            tok,
            corpus(MIX, N_TEXTS, seed),
            steps=pretrain_steps,
            seed=seed,
            log=log,
            log_every=max(1, pretrain_steps // 5),
        )
        info.update({"params": tinychar.n_params(model), "spec": spec})
        tinychar.save(model, tok, directory)
        return info

    return cached_model("tools", spec, build, log)


def write_problems(
    directory: Path, problems: str, seed: int, n_train: int = 4000, n_eval: int = 64
) -> tuple[Path, Path]:
    """The RL data as JSONL files for task=dataset: prompt, answer, kind, a, b. problems: "hard" (three-digit
    sums) or "mixed" (half one-digit sums). The held-out problems are never training ones."""
    rng = random.Random(f"grpolab/app/lab/tools/problems/{problems}/{seed}")
    kinds = ["hard"] if problems == "hard" else ["easy", "hard"]

    def row(i: int, seen: set) -> dict:
        while True:
            kind = kinds[i % len(kinds)]
            a, b = draw(kind, rng)
            if (a, b) not in seen:
                seen.add((a, b))
                return {"prompt": f"{a}+{b}=", "answer": str(a + b), "kind": kind, "a": a, "b": b}

    seen: set = set()
    held = [row(i, seen) for i in range(n_eval)]
    held_pairs = {(r["a"], r["b"]) for r in held}
    train = []
    for i in range(n_train):
        kind = kinds[i % len(kinds)]
        a, b = draw(kind, rng)
        if (a, b) not in held_pairs:
            train.append({"prompt": f"{a}+{b}=", "answer": str(a + b), "kind": kind, "a": a, "b": b})
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / f"train_{problems}.jsonl", directory / f"eval_{problems}.jsonl"
    for path, rows in zip(paths, (train, held)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def rl_config(
    model: Path,
    run_dir: Path,
    data: tuple[Path, Path],
    env_class: str,
    options: dict,
    *,
    steps: int,
    seed: int,
    threads: int,
    lr: float,
    report: bool,
    algo: str = "grpo",
):
    from grpolab.training.config import build_config

    recipe = {
        "out": str(run_dir),
        "steps": steps,
        "seed": seed,
        "model": str(model),
        "task": "dataset",
        "task_args": {"path": str(data[0]), "eval_path": str(data[1])},
        "rewards": [{"name": "math", "weight": 1.0, "extract": "last_number"}],
        "env": {"name": f"grpolab.app.lab.tools_env:{env_class}", "options": options, **ENV},
        "algo": {"name": algo, "beta": 0.0},
        "G": 8,
        "batch_size": 64,
        "micro_batch": 64,
        "temperature": 1.0,
        "lr": lr,
        "warmup_steps": 2,
        "eval_size": 64,
        "samples_per_step": 64,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "threads": threads,
        "reward_workers": 1,
        "report": report,
        "sample_tokens": 0,
        "rollout": {"engine": "native"},
    }  # the lab measures a claim, on the engine its numbers came from
    return build_config(recipe, [])


# ----------------------------------------------------------------------------- the wrong setting, and a probe


def _policy_logp(run, rollout):
    """log pi of every token after the prompt (model's and environment's), no gradient, (N, C)."""
    import torch

    from grpolab.model.logprobs import grouped_completion_logp

    G = rollout.G
    with torch.no_grad():
        logp, _ = grouped_completion_logp(
            run.policy,
            rollout.prompt_ids[::G],
            rollout.prompt_mask[::G],
            rollout.completion_ids,
            rollout.attention_mask,
            G,
            temperature=run.cfg.temperature,
        )
    return logp.float().cpu()


@contextlib.contextmanager
def instrumented(env_tokens_in_loss: bool):
    """While active, every training rollout of `grpolab train` in this process is measured, and with
    env_tokens_in_loss=True also CHANGED INTO THE WRONG SETTING.

    Measured (logged in metrics.jsonl): lab/result_logp, the policy's mean log-prob of the tool's result
    tokens (the environment's tokens other than the <tool_response> tags: how well the model predicts
    the calculator); lab/model_tokens_mean, the model's own tokens per trajectory.

    THE WRONG SETTING (ablation only; no recipe key reaches it): the environment's tokens are marked as
    the model's (completion_mask += env_mask, env_mask = None) before the update, with their log-probs
    under the policy as their sampling log-probs (so the importance ratio is 1 there, as at the model's
    tokens). Every algorithm then reads them as samples: they enter the loss, the length normaliser
    and the length metrics (lab/env_token_share: their share of the loss's tokens). grpolab's own
    setting, the right one, keeps them as context only (docs/agents.md, "The masks")."""
    import torch

    from grpolab.training import step as step_module

    original = step_module.agent_rollout

    def measured(run, examples, *, G, generator=None, sampling=None):
        rollout, rewards, info = original(run, examples, G=G, generator=generator, sampling=sampling)
        if (sampling is not None and sampling.greedy) or rollout.env_mask is None:  # held-out evaluation: left alone
            return rollout, rewards, info
        env = rollout.env_mask.bool()
        tags = {run.tokenizer.convert_tokens_to_ids(t) for t in ("<tool_response>", "</tool_response>")}
        result = env & ~torch.isin(rollout.completion_ids, torch.tensor(sorted(tags)))
        logp = _policy_logp(run, rollout)
        info = dict(info)
        info["lab/model_tokens_mean"] = float(rollout.completion_mask.sum(-1).mean())
        if bool(result.any()):
            info["lab/result_logp"] = float(logp[result].mean())
        if env_tokens_in_loss:
            rollout.sample_logp = torch.where(env, logp, rollout.sample_logp)
            rollout.completion_mask = rollout.completion_mask + rollout.env_mask
            info["lab/env_token_share"] = float(env.sum() / rollout.completion_mask.sum())
            rollout.env_mask = None
        return rollout, rewards, info

    step_module.agent_rollout = measured
    try:
        yield
    finally:
        step_module.agent_rollout = original


# ----------------------------------------------------------------------------- the command


def run(argv: list[str]) -> dict:
    from grpolab.app.lab.miniature import finish, train_run
    from grpolab.app.lab.tables import table

    ap = argparse.ArgumentParser(
        prog="grpolab lab tools", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="also run: a broken tool; a cost per call on mixed problems (grpo and dr_grpo); tool results "
        "in the loss (the wrong setting)",
    )
    ap.add_argument("--out", default="runs/lab/tools", help="where the runs, tools.json and tools.png go")
    ap.add_argument("--steps", type=int, default=60, help="RL steps per arm (default 60)")
    ap.add_argument(
        "--pretrain-steps",
        type=int,
        default=PRETRAIN_STEPS,
        help=f"pre-training steps (default {PRETRAIN_STEPS}; another value is another cached model)",
    )
    ap.add_argument("--blocks", type=int, default=6, help="blocks of steps in the tables (default 6)")
    ap.add_argument("--lr", type=float, default=5e-4, help="RL learning rate (default 5e-4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: a 0.3M-parameter model runs fastest on one core)",
    )
    ns = ap.parse_args(argv)
    for name in ("steps", "pretrain_steps", "blocks", "threads"):
        if getattr(ns, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    import torch

    torch.set_num_threads(ns.threads)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, pinfo = pretrained_model(ns.pretrain_steps, ns.seed)
    print(
        f"tiny char-level Llama: {pinfo['params']:,} parameters, pre-trained {pinfo['steps']} steps (loss "
        f"{pinfo['loss_first']:.2f} -> {pinfo['loss_last']:.2f}, {pinfo['time_s']:.0f} s when built) on {N_TEXTS:,} "
        f"texts: {MIX['worked']:.0%} worked examples ('347+589?' -> a tool trace); after the task's prompt "
        f"('347+589='): {MIX['hard']:.0%} three-digit sums, {MIX['hard_tool']:.0%} of them a tool trace, the rest "
        f"direct estimates (the sum rounded to ten); {1 - MIX['hard']:.0%} one-digit sums, {MIX['easy_tool']:.0%} "
        f"tool traces, the rest direct and right; {MIX['reads']:.0%} of three-digit traces copy the tool's "
        f"result, the rest write the estimate"
    )
    names = list(ARMS) if ns.ablate else ["calc"]
    res: dict = {"pretrain": pinfo, "model": str(model), "steps": ns.steps, "lr": ns.lr, "arms": {}}
    rows_by_arm: dict[str, list[dict]] = {}
    for name in names:
        env_class, options, problems, algo, wrong = ARMS[name]
        data = write_problems(out / "data", problems, ns.seed)
        cfg = rl_config(
            model,
            out / name,
            data,
            env_class,
            options,
            steps=ns.steps,
            seed=ns.seed,
            threads=ns.threads,
            lr=ns.lr,
            report=name == "calc",
            algo=algo,
        )
        what = {"hard": "three-digit sums", "mixed": "one- and three-digit sums, half each"}[problems]
        print(
            f"\n[{name}] grpolab train: task=dataset ({what}) env.name=grpolab.app.lab.tools_env:{env_class}"
            f"{''.join(f' env.options.{k}={v}' for k, v in options.items())} algo={algo} steps={ns.steps} G=8 "
            f"batch_size=64 lr={ns.lr:g} (reward: the final answer's number only)"
            + (
                "\n  THE WRONG SETTING: the tool's result tokens are left in the loss (grpolab masks them)"
                if wrong
                else ""
            )
        )
        with instrumented(env_tokens_in_loss=wrong):
            metrics, samples, secs = train_run(name, cfg)
        rows = per_step(metrics, samples)
        rows_by_arm[name] = rows
        s = summary(rows, min(ns.blocks, len(rows)))
        cols = ["steps", "reward", "calls", "uses", "uses_if_called", "turns", "tokens"]
        head = ["steps", "reward", "calls", "uses", "uses|call", "turns", "tokens"]
        if problems == "mixed":
            cols += ["calls_easy", "calls_hard", "right_easy"]
            head += ["calls_1dig", "calls_3dig", "right_1dig"]
        cols.append("result_logp")
        head.append("logp_result")
        print(table(head, [[b[c] for c in cols] for b in s["blocks"]]))
        summ = json.loads((out / name / "summary.json").read_text())
        s["eval_before"] = (summ.get("eval_before") or {}).get("accuracy")
        s["eval_after"] = (summ.get("eval_after") or {}).get("accuracy")
        s["samples_start"] = samples_at(samples, rows[0]["step"])
        s["samples_end"] = samples_at(samples, rows[-1]["step"])
        s["verdict"] = verdict(s)
        s["time_s"] = secs
        res["arms"][name] = s
        print(f"samples at step {rows[0]['step']}:  " + " || ".join(s["samples_start"][:3]))
        print(f"samples at step {rows[-1]['step']}: " + " || ".join(s["samples_end"][:3]))
        if s["eval_before"] is not None and s["eval_after"] is not None:
            print(f"held-out accuracy (greedy, in the environment): {s['eval_before']:.1%} -> {s['eval_after']:.1%}")
        print(f"[{name}] {s['verdict']} ({secs:.0f} s)")
    if ns.ablate:
        print("\nablation (first -> last block)")
        print(
            table(
                ["arm", "reward", "", "calls", " ", "uses", "  ", "turns", "   ", "logp_result", "    "],
                [
                    [
                        n,
                        a["first"]["reward"],
                        a["last"]["reward"],
                        a["first"]["calls"],
                        a["last"]["calls"],
                        a["first"]["uses"],
                        a["last"]["uses"],
                        a["first"]["turns"],
                        a["last"]["turns"],
                        a["first"]["result_logp"],
                        a["last"]["result_logp"],
                    ]
                    for n, a in res["arms"].items()
                ],
            )
        )
        res["ablation_verdict"] = ablation_verdict(res["arms"], COST)
        print(res["ablation_verdict"])
    return finish(res, "calc", rows_by_arm, out, "tools", plot, t0, also=(out / "calc" / "report.html",))
