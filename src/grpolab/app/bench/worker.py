"""One measurement of `grpolab bench`, in a process of its own (so that each side starts cold and its
peak memory is its own):

    python -m grpolab.app.bench.worker grpolab SPEC.json OUT.json          grpolab: warm-up + timed steps
    python -m grpolab.app.bench.worker trl SPEC.json OUT.json --precision bf16 [--checkpointing off]
    python -m grpolab.app.bench.worker check SPEC.json OUT.json [--trl-model DIR]   the log-prob check
    python -m grpolab.app.bench.worker rate SPEC.json OUT.json [--precisions fp32,bf16] [--bytes N]
                                                                 matmul rates, memory bandwidth

The result is a JSON object written to OUT.json. Exit codes: 0 done, 1 the log-prob check failed or a
measurement broke, 2 TRL is missing (the message says how to install it) or a setting is invalid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the hub: the model is a local directory
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from grpolab.app.bench.agent import ENV_NAME, bench_model_dir
from grpolab.app.bench.spec import LOGP_TOL, Spec, bench_task, step_prompts
from grpolab.util.fields import ConfigError


class CheckFailed(Exception):
    """grpolab and TRL do not compute the same per-token log-probs (or prompt tokens)."""


def logp_difference(a, b, mask) -> float:
    """max |a - b| over the positions where mask (n, C) is 1; a, b: (n, C) log-probs."""
    if a.shape != b.shape:
        raise CheckFailed(f"log-prob shapes differ: grpolab {tuple(a.shape)}, TRL {tuple(b.shape)}")
    m = mask.bool()
    if not bool(m.any()):
        return 0.0
    d = (a.float() - b.float()).abs()
    return float(d[m].max())  # a NaN anywhere stays NaN: judge() fails it


def judge(diff: float, tol: float = LOGP_TOL) -> str:
    """The check's one-line verdict; CheckFailed when diff > tol (or not a number)."""
    line = f"max |log pi_grpolab - log pi_TRL| = {diff:.2e} per token (fp32, tolerance {tol:g})"
    if not diff <= tol:
        raise CheckFailed(
            f"log-prob check failed: {line}: the two sides do not compute the same model, so their "
            f"times would not measure the same work"
        )
    return line


def _model_path(name: str) -> str:
    from grpolab.model.load import model_dir

    return str(model_dir(name, log=lambda *_: None))


def run_grpolab(spec: Spec, engine: str = "native") -> dict:
    from grpolab.app.bench.ours import measure

    return measure(spec, engine)


def run_trl(spec: Spec, precision: str, checkpointing: bool = True) -> dict:
    import tempfile

    from grpolab.app.bench.trl_side import import_trl, measure

    import_trl()  # before loading anything: a missing TRL says so at once
    prompts = step_prompts(spec, bench_task(spec), spec.steps + 1)
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-model-") as tmp:
        return measure(spec, bench_model_dir(spec, tmp), precision, prompts, checkpointing)


def run_check(spec: Spec, trl_model: str | None = None) -> dict:
    """grpolab samples a few sequences (fp32, no EOS); grpolab and TRL score them; compare. The agent setting
    checks the same on single-turn sequences of the same weights, then its own prompt and tool-reply tokens."""
    import torch

    from grpolab.app.bench.ours import check_sequences
    from grpolab.app.bench.trl_side import import_trl, trl_logps

    import_trl()
    agent, spec = spec, Spec(**{**spec.to_dict(), "agent": False, "max_turns": Spec.max_turns})
    run, rollout, ours, msgs, ids = check_sequences(spec)
    G = rollout.G
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    C = rollout.completion_ids.shape[1]
    theirs, trl_prompt_ids = trl_logps(spec, _model_path(trl_model or spec.model), msgs, input_ids, attention_mask, C)
    diff = logp_difference(ours, theirs, rollout.completion_mask)
    same_prompts = trl_prompt_ids == [list(p) for p in ids]
    res = {
        "max_abs_diff": diff,
        "tolerance": LOGP_TOL,
        "tokens": int(rollout.completion_mask.sum()),
        "sequences": len(rollout.texts),
        "G": G,
        "same_prompt_tokens": same_prompts,
        # the rollout's own record (the lean decode step, cached, one token at a time) vs the update's pass
        "rollout_vs_update_max_abs_diff": logp_difference(rollout.sample_logp, ours, rollout.completion_mask),
    }
    if not same_prompts:
        raise CheckFailed("prompt check failed: TRL's chat template gives other prompt tokens than grpolab's")
    res["verdict"] = judge(diff)
    if agent.agent:
        res.update(agent_token_check(agent))
    return res


def agent_token_check(spec: Spec, n_prompts: int = 2) -> dict:
    """The agent setting: both sides' token ids of the first prompts (the few-shot conversation, the tools section
    of the shared template) and of a tool reply between turns (grpolab's addition_ids, TRL's _get_tool_suffix_ids)
    must be the same; CheckFailed names which differ."""
    import tempfile

    import torch

    from grpolab.app.bench.trl_side import make_trainer
    from grpolab.env.rollout import prompt_messages
    from grpolab.env.settings import EnvConfig
    from grpolab.model.load import load_tokenizer
    from grpolab.model.template import addition_ids, render
    from grpolab.training.agents import load_environments
    from grpolab.training.run import step_rng

    task = bench_task(spec)
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-model-") as tmp:
        path = bench_model_dir(spec, tmp)
        tok = load_tokenizer(path)
        envs = load_environments(EnvConfig(name=ENV_NAME), tok, task.system_prompt)
        tools = envs.tools or None
        rng, _ = step_rng(spec.seed, 1, torch.device("cpu"))
        examples = task.sample(n_prompts, rng)
        ours = [
            list(
                tok(
                    render(tok, prompt_messages(e, None, task.system_prompt), add_generation_prompt=True, tools=tools),
                    add_special_tokens=False,
                )["input_ids"]
            )
            for e in examples
        ]
        history = prompt_messages(examples[0], None, task.system_prompt) + [
            {
                "role": "assistant",
                "content": '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
            }
        ]
        reply = [{"role": "tool", "name": "add", "content": "3"}]
        our_reply = addition_ids(tok, history, reply, tools)
        msgs = step_prompts(Spec(**{**spec.to_dict(), "prompts": n_prompts}), task, 1)
        trainer = make_trainer(spec, path, "fp32", msgs, f"{tmp}/trl", 1)
        trainer._batch_environments = [None] * len(msgs)  # what _generate_and_score_completions sets per batch
        theirs = [list(p) for p in trainer._tokenize_prompts(msgs)[0]]
        their_reply = list(trainer._get_tool_suffix_ids(reply))
    out = {
        "agent_same_prompt_tokens": ours == theirs,
        "agent_same_tool_reply_tokens": our_reply == their_reply,
        "agent_prompt_tokens": [len(p) for p in ours],
        "agent_tool_reply_tokens": len(our_reply),
    }
    if not out["agent_same_prompt_tokens"]:
        raise CheckFailed("agent prompt check failed: grpolab and TRL render the tool prompt as other tokens")
    if not out["agent_same_tool_reply_tokens"]:
        raise CheckFailed(f"agent tool-reply check failed: grpolab adds {our_reply}, TRL {their_reply}")
    return out


def run_rate(spec: Spec, precisions: list[str], nbytes: int) -> dict:
    """The matmul rate of each precision in `precisions` (the phases'), and of bf16 also where bf16 can
    pay on this device (grpolab.model.precision.bf16_can_pay, decided in milliseconds: it says why not
    otherwise), and the memory bandwidth of reading `nbytes` (grpolab.app.bench.floor)."""
    from grpolab.app.bench.floor import matmul_rates, memory_bandwidth
    from grpolab.model.load import pick_device
    from grpolab.model.precision import bf16_can_pay

    device = pick_device(spec.device)
    timed, why_not = list(precisions), None
    if "bf16" not in timed:
        can, why = bf16_can_pay(device)
        if can:
            timed.append("bf16")
        else:
            why_not = why
    rates = matmul_rates(device, timed)
    rates["bandwidth"], rates["bandwidth_bytes"] = memory_bandwidth(device, nbytes)
    rates["bf16_not_timed"] = why_not
    return rates


MODES = {  # what one worker process measures: mode -> fn(spec, parsed arguments) -> result dict
    "grpolab": lambda spec, a: run_grpolab(spec, a.engine),
    "trl": lambda spec, a: run_trl(spec, a.precision, a.checkpointing == "on"),
    "check": lambda spec, a: run_check(spec, a.trl_model),
    "rate": lambda spec, a: run_rate(spec, a.precisions.split(","), a.bytes),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpolab.app.bench.worker")
    ap.add_argument("mode", choices=list(MODES))
    ap.add_argument("spec", help="the Spec as a JSON file (written by grpolab bench)")
    ap.add_argument("out", help="where the result JSON goes")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="TRL's precision (mode trl)")
    ap.add_argument(
        "--engine", default="native", choices=["native", "vllm"], help="grpolab's rollout engine (mode grpolab)"
    )
    ap.add_argument("--trl-model", help="mode check: give TRL this model instead (a check that must fail)")
    ap.add_argument("--checkpointing", default="on", choices=["on", "off"], help="TRL's gradient_checkpointing")
    ap.add_argument("--precisions", default="fp32", help="mode rate: the precisions to time, comma-separated")
    ap.add_argument("--bytes", type=int, default=1 << 28, help="mode rate: the bandwidth buffer's bytes")
    a = ap.parse_args(argv)
    with open(a.spec) as f:
        spec = Spec.from_dict(json.load(f))
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)  # both sides alike (grpolab's setup sets it again from threads=)
    from grpolab.app.bench.trl_side import TrlMissing

    try:
        res = MODES[a.mode](spec, a)
    except TrlMissing as e:
        print(f"grpolab bench: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"grpolab bench: error: {e}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"grpolab bench: {e}", file=sys.stderr)
        return 1
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
