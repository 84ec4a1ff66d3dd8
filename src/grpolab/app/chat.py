"""The trained model, out: `grpolab chat` (talk to it in the terminal) and `grpolab sample` (k samples of
one prompt with their rewards).

    grpolab chat runs/demo                     # the run's newest checkpoint, in its chat template
    grpolab chat smollm2-135m                  # or any model= value (a HF directory, a .gguf)
    grpolab sample runs/demo --prompt "What is 17 + 25?" --answer 42 -k 4

A run directory means its newest checkpoint (a plain Hugging Face directory: it also loads with
`AutoModelForCausalLM.from_pretrained(path)`), and for `sample` the run's config (task, rewards,
sampling settings). Nothing is downloaded.

chat: each reply is streamed token by token as it is generated, with the whole conversation in the
model's chat template. With --env, the environment's tools are shown to the model (in templates that
show tools) and every tool call it writes is run, its result shown and given back, up to --max-turns
model turns per message. /reset starts a new conversation, /quit (or Ctrl-D) leaves; Ctrl-C stops a
reply early. When the conversation outgrows the model's context, the oldest turns are dropped (and
the console says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from grpolab.batch import Example
from grpolab.util.fields import ConfigError

HELP = "/reset clears the conversation, /quit (or Ctrl-D) leaves"


def resolve_target(target: str) -> tuple[Path, dict | None, str]:
    """(model directory, the run's config or None, a description) for a run directory or a model= value."""
    from grpolab.training.config import config_from_run

    p = Path(target).expanduser()
    if (p / "config.yaml").exists():
        from grpolab.training.checkpoint import latest_checkpoint

        ck = latest_checkpoint(p)
        if ck is None:
            raise ConfigError(f"{target}: the run has no checkpoint yet")
        return ck, config_from_run(p), f"{target} ({ck.name})"
    from grpolab.model.load import model_dir

    return model_dir(target, log=lambda msg: print(msg, file=sys.stderr)), None, target


def _fit(
    tokenizer, history: list[dict], system: str | None, limit: int, tools: list[dict] | None = None
) -> tuple[list[int], int]:
    """Prompt ids of the conversation (with the environment's tool schemas, for templates that show
    them), dropping the oldest exchanges until it fits in `limit` tokens. Returns (ids, messages dropped)."""
    from grpolab.model.template import chat_prompts, render

    dropped = 0
    while True:
        if tools:
            msgs = ([{"role": "system", "content": system}] if system else []) + history[dropped:]
            ids = tokenizer(render(tokenizer, msgs, add_generation_prompt=True, tools=tools), add_special_tokens=False)[
                "input_ids"
            ]
        else:
            (ids,) = chat_prompts(tokenizer, [history[dropped:]], system)
        if len(ids) <= limit or len(history) - dropped <= 1:
            return ids, dropped
        dropped += 2  # one user turn and the reply to it


def _environment(spec: str | None):
    """One environment for the chat session (--env), reset with no example fields; None without --env."""
    if spec is None:
        return None
    from grpolab.env import EnvConfigError, load_environment

    try:
        env = load_environment(spec)()
    except EnvConfigError as e:
        raise ConfigError(f"--env: {e}") from None
    try:
        env.reset({})
    except Exception as e:  # noqa: BLE001 (an environment that needs a task's fields, e.g. guess_number)
        raise ConfigError(
            f"--env {spec}: its reset() needs an example's fields ({type(e).__name__}: {e}); chat "
            f"takes environments whose tools work without a task, e.g. calculator_python"
        ) from None
    return env


def _env_reply(env, text: str) -> list[dict]:
    """What the environment adds after the model's turn (tool results, feedback), printed; [] when the
    turn made no call or the environment ended the exchange."""
    if env is None:
        return []
    from grpolab.env import run_turns

    (reply,) = run_turns([env], [text])
    if reply.done:
        return []
    for m in reply.messages:
        print(f"{m['role']}> {m['content']}", flush=True)
    return list(reply.messages)


def chat_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="grpolab chat",
        description="Talk to a model or a run's newest checkpoint "
        f"in the terminal, in the model's chat template ({HELP}).",
    )
    ap.add_argument(
        "target",
        metavar="RUN_OR_MODEL",
        help="a run directory (its newest checkpoint) or a model= "
        "value: smollm2-135m, a local Hugging Face directory or a .gguf file",
    )
    ap.add_argument("--system", default=None, help="system message (default: the chat template's own)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="longest reply in tokens (default 256)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 = greedy (default 0.7)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    ap.add_argument(
        "--env",
        default=None,
        help="an environment whose tools the model may call, as env.name takes "
        "it (calculator_python, a TRL environment class file.py:Name, ...; docs/agents.md)",
    )
    ap.add_argument("--max-turns", type=int, default=4, help="with --env: most model turns per message (default 4)")
    ns = ap.parse_args(argv)
    if ns.max_new_tokens < 1 or ns.max_turns < 1:
        raise ConfigError("--max-new-tokens and --max-turns: must be >= 1")
    if ns.temperature < 0 or not 0 < ns.top_p <= 1:
        raise ConfigError("--temperature must be >= 0 and --top-p in (0, 1]")
    path, _, name = resolve_target(ns.target)
    env = _environment(ns.env)
    tools = list(getattr(env, "tools", None) or []) or None

    import torch
    from transformers import TextStreamer
    from transformers.utils import logging as hf_logging

    from grpolab.engine.native.generate import eos_token_ids
    from grpolab.model.load import load_policy, load_tokenizer, pick_device

    hf_logging.disable_progress_bar()
    torch.manual_seed(ns.seed)
    tokenizer = load_tokenizer(path)
    model = load_policy(path, pick_device(ns.device))
    model.eval()
    eos = sorted(eos_token_ids(model, tokenizer))
    context = getattr(model.config, "max_position_embeddings", None) or 2048
    limit = max(1, context - ns.max_new_tokens)
    print(f"grpolab chat: {name}. {HELP}.", flush=True)
    history: list[dict] = []
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            history = []
            print("(conversation cleared)", flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]!r}; {HELP}", flush=True)
            continue
        history.append({"role": "user", "content": line})
        for _ in range(ns.max_turns):  # without --env: one turn
            ids, dropped = _fit(tokenizer, history, ns.system, limit, tools)
            if dropped:
                history = history[dropped:]
                print(
                    f"(the conversation outgrew the model's context of {context} tokens: "
                    f"dropped the oldest {dropped} messages)",
                    flush=True,
                )
            print("model> ", end="", flush=True)
            input_ids = torch.tensor([ids], device=model.device)
            streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            try:
                with torch.no_grad():
                    out = model.generate(
                        input_ids,
                        attention_mask=torch.ones_like(input_ids),
                        streamer=streamer,
                        max_new_tokens=ns.max_new_tokens,
                        do_sample=ns.temperature > 0,
                        temperature=ns.temperature if ns.temperature > 0 else None,
                        top_p=ns.top_p if ns.temperature > 0 else None,
                        top_k=None,
                        eos_token_id=eos,
                        pad_token_id=tokenizer.pad_token_id,
                    )
                reply_ids = out[0, len(ids) :].tolist()
            except KeyboardInterrupt:  # stop this reply; keep the conversation
                reply_ids = list(streamer.token_cache)
                print(" (stopped)", end="")
            print(flush=True)
            text = tokenizer.decode(reply_ids, skip_special_tokens=True)
            history.append({"role": "assistant", "content": text})
            added = _env_reply(env, text)
            if not added:
                break
            history += added


def sample_main(argv: list[str]) -> int:
    from grpolab.training.config import build_config
    from grpolab.training.recipe import load_recipe

    ap = argparse.ArgumentParser(
        prog="grpolab sample",
        description="Print k samples of one prompt with their "
        "rewards: from a run's newest checkpoint with its config (task, rewards, "
        "sampling settings), or from a recipe / model.",
    )
    ap.add_argument("target", nargs="?", help="a run directory, or a recipe (default: the defaults; model=...)")
    ap.add_argument("args", nargs="*", help="KEY=VALUE overrides, as for train (model=, rewards=, temperature=, ...)")
    ap.add_argument("--prompt", help="the user message (default: the task's first held-out prompt)")
    ap.add_argument("--answer", default="", help="the reference answer the rewards compare against (with --prompt)")
    ap.add_argument("--index", type=int, default=0, help="which held-out prompt, without --prompt (default 0)")
    ap.add_argument("-k", type=int, default=4, help="samples (default 4)")
    ap.add_argument("--greedy", action="store_true", help="greedy decoding (k identical samples: use -k 1)")
    ap.add_argument("--json", action="store_true", help="one JSON object per sample instead of text")
    ns = ap.parse_intermixed_args(argv)
    if ns.k < 1:
        raise ConfigError("-k: must be >= 1")
    args, target, recipe = list(ns.args), ns.target, {}
    if target and "=" in target:
        args.insert(0, target)
        target = None
    if target and Path(target, "config.yaml").exists():
        path, recipe, _ = resolve_target(target)
        recipe["model"] = str(path)
    elif target:
        recipe = load_recipe(target)
    cfg = build_config(recipe, args)

    import torch
    from transformers.utils import logging as hf_logging

    from grpolab.training.step import rollout_examples, score
    from grpolab.training.trainer import setup

    hf_logging.disable_progress_bar()
    run = setup(cfg, training=False, log=lambda msg: print(msg, file=sys.stderr))
    if ns.prompt is not None:
        example = Example(prompt=ns.prompt, answer=ns.answer, id="prompt")
    else:
        held = run.task.eval_set()
        if not held:
            raise ConfigError(f"task {cfg.task!r} has no held-out prompts; give --prompt")
        if not 0 <= ns.index < len(held):
            raise ConfigError(f"--index: must be in [0, {len(held) - 1}] (the task's held-out prompts)")
        example = held[ns.index]
    generator = torch.Generator(device=run.device).manual_seed(cfg.seed)
    sampling = dataclasses.replace(run.sampling, greedy=True) if ns.greedy else run.sampling
    rollout = rollout_examples(run, [example], G=ns.k, generator=generator, sampling=sampling)
    scores = score(run, rollout, [example])
    records = [
        {
            "sample": i,
            "completion": text,
            "reward": scores.total[i],
            "rewards": {name: v[i] for name, v in scores.per_fn.items()},
            "length": int(rollout.completion_mask[i].sum()),
            "truncated": bool(rollout.truncated[i]),
        }
        for i, text in enumerate(rollout.texts)
    ]
    if ns.json:
        for rec in records:
            print(json.dumps(rec, ensure_ascii=False))
    else:
        prompt = example.prompt if isinstance(example.prompt, str) else json.dumps(example.prompt, ensure_ascii=False)
        print(f"prompt: {prompt}\nanswer: {example.answer}")
        for rec in records:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in rec["rewards"].items())
            flag = ", truncated" if rec["truncated"] else ""
            print(
                f"\n--- sample {rec['sample'] + 1}/{ns.k}: reward {rec['reward']:.3f} ({parts}; "
                f"{rec['length']} tokens{flag})\n{rec['completion']}"
            )
    for msg in scores.messages:
        print(f"grpolab sample: {msg}", file=sys.stderr)
    return 0


__all__ = ["chat_main", "resolve_target", "sample_main"]
