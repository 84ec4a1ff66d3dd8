"""`grpolab plan [RECIPE] [KEY=VALUE ...] --memory 32GB`: what a run would hold and cost before it runs.

Prints, per phase of one step, the bytes it holds (grpolab.training.plan.memory: generation with its KV cache
or an inference engine's share, the reference pass, the update with its activations per
micro-batch and the pending gradients, the LM head's logits chunks, AdamW's state, a critic), the
peak and the phase that sets it, the seconds of each phase from its FLOPs and the device's rate
(grpolab.training.plan.estimate), and, when the peak does not fit, the changes that do. Nothing is loaded
but the tokenizer (to count the prompt's tokens); `model=` may also name a published architecture
(grpolab.training.plan.shapes.SHAPES: qwen2.5-7b, llama-3.1-8b, ...), planned from its shape alone.

--memory takes a size (24GB, 80GiB) or a card (CARDS: rtx4090, rtx5090, a100-80gb, h100-80gb); a
size is planned with the card of that size (24 GB: RTX 4090, 32 GB: RTX 5090, 80 GB: A100 80GB).
Without --memory: this machine (its CUDA GPU, else its CPU: the memory it has and its measured
matmul rate).
"""

from __future__ import annotations

import argparse
import json
import sys

from grpolab.training.plan.describe import report_json, report_lines
from grpolab.training.plan.devices import CARDS, parse_memory, this_machine
from grpolab.training.plan.estimate import fitting, plan, planned_prompt_tokens
from grpolab.util.fields import ConfigError

USAGE = """grpolab plan [RECIPE.yaml | RECIPE_NAME] [KEY=VALUE ...] [--memory 32GB | --memory rtx5090]

Peak memory per phase of one step, the time from FLOPs, and settings that fit, before anything runs.
KEY=VALUE as for grpolab train; model= may also be a published shape: """


def main(argv: list[str]) -> int:
    from grpolab.training.config import build_config
    from grpolab.training.plan.shapes import SHAPES
    from grpolab.training.recipe import load_recipe

    ap = argparse.ArgumentParser(
        prog="grpolab plan",
        usage=USAGE + ", ".join(SHAPES),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("args", nargs="*", help="a recipe (first) and KEY=VALUE overrides")
    ap.add_argument("--memory", help="a size (24GB, 32GB, 80GB) or a card: " + ", ".join(CARDS))
    ap.add_argument("--prompt-tokens", type=int, help="prompt length to plan for (default: the task's longest)")
    ap.add_argument(
        "--engine-share",
        type=float,
        default=0.0,
        help="fraction of the device an inference engine reserves for generation (vLLM's "
        "gpu_memory_utilization when colocated); 0: grpolab's own rollout",
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ns = ap.parse_intermixed_args(argv)  # options and KEY=VALUE in any order
    if ns.prompt_tokens is not None and ns.prompt_tokens < 1:
        raise ConfigError("--prompt-tokens: must be >= 1")
    if not 0 <= ns.engine_share < 1:
        raise ConfigError("--engine-share: must be in [0, 1)")
    args = list(ns.args)
    recipe = load_recipe(args.pop(0)) if args and "=" not in args[0] else {}
    bad = [a for a in args if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]!r}: expected KEY=VALUE (only the first argument may be a recipe file)")
    cfg = build_config(recipe, args)
    device = parse_memory(ns.memory) if ns.memory else this_machine()
    tokens, source = planned_prompt_tokens(cfg, ns.prompt_tokens)
    kw = {"prompt_tokens": tokens, "engine_share": ns.engine_share}
    p = plan(cfg, device, **kw)
    alternatives = [] if p.fits else fitting(cfg, args, device, recipe, **kw)
    if ns.json:
        print(json.dumps(report_json(p, tokens, source, alternatives), indent=2))
    else:
        print("\n".join(report_lines(p, tokens, source, alternatives)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
