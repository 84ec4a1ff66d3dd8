"""grpolab command line: train, eval, lab, report, chat, sample, audit, export, bench, plan.

Exit codes: 0 success, 1 a failure during the run, 2 a usage error (bad key, type, value, path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpolab.training.stops import RunStopped, StopNow
from grpolab.util.fields import ConfigError

USAGE_TRAIN = """grpolab train [RECIPE.yaml | RECIPE_NAME] [KEY=VALUE ...]
       grpolab train --resume OUT [KEY=VALUE ...]
       grpolab train --trl [KEY=VALUE ...]            # TRL's GRPOConfig defaults (docs/migrating-from-trl.md)
       grpolab train --trl model_name_or_path=DIR dataset_name=DIR [dataset_config=NAME] [KEY=VALUE ...]
                                                      # `trl grpo`'s script arguments, local paths only

Train a policy with reinforcement learning from verifiable rewards. Settings: defaults <- recipe <-
KEY=VALUE overrides (dotted for nested keys: algo.beta=0.04, task_args.digits=2).
Examples:
  grpolab train recipes/demo.yaml                 # the demo (make demo): SmolLM2-135M, arithmetic, GRPO
  grpolab train steps=5 out=runs/try              # the defaults below (GRPO preset: beta 0.04)
  grpolab train algo=dapo task=countdown out=runs/cd
  grpolab train --resume runs/try steps=40        # continue a stopped run (steps may be raised)
  grpolab train max_steps=10 learning_rate=1e-6   # TRL's field names work too (docs/migrating-from-trl.md)
  grpolab train RECIPE --help                     # the options with the values that run would use
  torchrun --max-restarts 3 ... -m grpolab train recipes/demo.yaml out=/shared/run resume=auto
                                                  # resume=auto: the same command starts the run or, after a
                                                  # restart, continues its newest verified checkpoint
                                                  # (recorded in OUT/restarts.jsonl; docs/distributed.md)
"""


def _train(argv: list[str]) -> int:
    from grpolab.training.config import build_config, config_from_run, help_text, thread_wait_of
    from grpolab.training.recipe import load_recipe
    from grpolab.util.threads import prepare

    ap = argparse.ArgumentParser(
        prog="grpolab train", usage=USAGE_TRAIN, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-h", "--help", action="store_true")
    ap.add_argument("--resume", metavar="OUT")
    ap.add_argument("--trl", action="store_true")
    ap.add_argument("args", nargs="*")
    ns = ap.parse_args(argv)
    args = list(ns.args)
    recipe: dict = {}
    if ns.resume:
        recipe = config_from_run(Path(ns.resume))
        recipe["out"] = ns.resume
    elif args and "=" not in args[0]:
        if ns.trl:
            raise ConfigError(f"{args[0]!r}: --trl starts from TRL's defaults; it takes no recipe")
        recipe = load_recipe(args.pop(0))
    bad = [a for a in args if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]!r}: expected KEY=VALUE (only the first argument may be a recipe file)")
    # before anything imports torch (build_config, TRL's names and values read through transformers):
    # OpenMP reads its settings once; `auto` measures the load first
    prepare(thread_wait_of(recipe, args), measure=not ns.help)
    data: tuple = (None, None)
    if ns.trl and not ns.resume:
        from grpolab.app.trl_compat.script_args import trl_command

        recipe, args, notes, *data = trl_command(args)  # TRL's fields, trl grpo's script arguments
    else:
        args, notes = _trl_names(args)
    if ns.help:
        print(USAGE_TRAIN)
        print(help_text(build_config(recipe, args)))
        return 0
    for note in notes:
        print(f"TRL compatibility: {note}")
    cfg = build_config(recipe, args)
    if Path(cfg.out).exists() and not Path(cfg.out).is_dir():
        raise ConfigError(f"out: {cfg.out} exists and is not a directory; choose another out=DIR")
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from grpolab.app.report import write_run_report
    from grpolab.training.trainer import train

    hf_logging.disable_progress_bar()  # our own progress bar is the one to watch
    if data[0] is not None:  # dataset_name: the rows as GRPOTrainer reads train_dataset
        from grpolab.app.api import train as api_train

        api_train(recipe, overrides=args, train_dataset=data[0], eval_dataset=data[1], console=Console())
        return 0
    train(cfg, resume=bool(ns.resume), console=Console(), report=write_run_report)
    return 0


def _trl_names(args: list[str]) -> tuple[list[str], list[str]]:
    """KEY=VALUE overrides whose key is a TRL GRPOConfig field (and not grpolab's) converted through the
    mapping table (grpolab.app.trl_compat) into grpolab's KEY=VALUE; (overrides, notes)."""
    import dataclasses

    import yaml

    from grpolab.app.trl_compat.config import trl_overrides, trl_value
    from grpolab.app.trl_compat.fields import TABLE
    from grpolab.training.config import Config
    from grpolab.training.recipe import parse_overrides

    top = [a for a in args if "." not in a.split("=", 1)[0]]
    parsed = parse_overrides(top)
    own = {f.name for f in dataclasses.fields(Config)}
    for a in top:  # a TRL name's text read as TRL's parser reads it (save_strategy=no is "no", not False)
        key, _, raw = a.partition("=")
        if key in TABLE and key not in own:
            parsed[key] = trl_value(key, raw)
    converted, notes = trl_overrides(parsed)
    if converted == parsed:
        return args, notes
    out = [a for a in args if a not in top]
    flat: list[str] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and prefix != "task_args" and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append(
                f"{prefix}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            )

    walk("", converted)
    return flat + out, notes


def _eval(argv: list[str]) -> int:
    """Held-out evaluation of a model, a run or two of them paired (grpolab eval --help)."""
    from grpolab.app.evaluation import eval_main

    return eval_main(argv)


def _lab(argv: list[str]) -> int:
    """Measure one of the lesson's claims: grpolab lab CLAIM [options]; no claim lists them."""
    import grpolab.app.lab as lab

    listing = "usage: grpolab lab CLAIM [options]   (grpolab lab CLAIM --help for a claim's options)\n\n" + "\n".join(
        f"  {name:10}{claim}" for name, (claim, _) in lab.LABS.items()
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(listing)
        return 0
    entry = lab.LABS.get(argv[0])
    if entry is None:
        print(f"grpolab lab: unknown claim {argv[0]!r}; known: {', '.join(lab.LABS)}\n\n{listing}", file=sys.stderr)
        return 2
    lab.last_result.clear()
    lab.last_result.update(entry[1](argv[1:]))
    return 0


def _report(argv: list[str]) -> int:
    """One self-contained HTML page (plots, samples, token-level credit) of one run or several overlaid."""
    ap = argparse.ArgumentParser(
        prog="grpolab report",
        description="Write one self-contained HTML report "
        "(and a PNG per plot beside it) of a run, or of several runs overlaid.",
    )
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (several: their curves overlay)")
    ap.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the HTML file (default: RUN_DIR/report.html for one run, ./report.html for several)",
    )
    ns = ap.parse_args(argv)
    from grpolab.app.report import load_runs, write_report
    from grpolab.app.report.plots import MissingPlotting

    out = (
        Path(ns.output)
        if ns.output
        else (Path(ns.runs[0]) / "report.html" if len(ns.runs) == 1 else Path("report.html"))
    )
    runs = load_runs(ns.runs)  # a directory that is not a run: ConfigError, exit 2
    try:
        path = write_report(ns.runs, out, runs=runs)
    except MissingPlotting as e:
        print(f"grpolab report: {e}", file=sys.stderr)
        return 1
    for run in runs:
        for name, places in run.skipped.items():
            print(
                f"grpolab report: {run.path}/{name}: skipped {len(places)} line(s) that are not complete "
                f"JSON objects: {', '.join(places[:3])}",
                file=sys.stderr,
            )
    print(f"wrote {path} (PNGs in {path.with_name(path.stem + '_plots')})")
    return 0


def _chat(argv: list[str]) -> int:
    """Talk to a model or a run's newest checkpoint in the terminal (grpolab chat --help)."""
    from grpolab.app.chat import chat_main

    return chat_main(argv)


def _sample(argv: list[str]) -> int:
    """k samples of one prompt with their rewards (grpolab sample --help)."""
    from grpolab.app.chat import sample_main

    return sample_main(argv)


def _audit(argv: list[str]) -> int:
    """Pre-flight check of a task, model and config (grpolab.app.audit); exit 1 when a run would learn nothing."""
    from grpolab.app.audit import main

    return main(argv)


def _export(argv: list[str]) -> int:
    """A run's newest checkpoint as a plain Hugging Face model, LoRA merged (grpolab export --help)."""
    from grpolab.app.export import export_main

    return export_main(argv)


def _bench(argv: list[str]) -> int:
    """grpolab vs TRL on the same setting, or grpolab against the FLOP floor (grpolab bench --help)."""
    from grpolab.app.bench import main

    return main(argv)


def _plan(argv: list[str]) -> int:
    """Peak memory per phase, time and settings that fit, before a run (grpolab plan --help)."""
    from grpolab.app.plan import main

    return main(argv)


COMMANDS = {
    "train": _train,
    "eval": _eval,
    "lab": _lab,
    "report": _report,
    "chat": _chat,
    "sample": _sample,
    "audit": _audit,
    "export": _export,
    "bench": _bench,
    "plan": _plan,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: grpolab {" + ",".join(COMMANDS) + "} ...\n\n"
            "  train   train a policy (grpolab train --help lists every option)\n"
            "  eval    score a model or a run on held-out prompts (pass@k, 95% intervals; two: paired)\n"
            "  lab     measure one of the lesson's claims (grpolab lab lists them)\n"
            "  report  one self-contained HTML page of a run, or several overlaid\n"
            "  chat    talk to a run's newest checkpoint (or any model) in the terminal\n"
            "  sample  print k samples of a prompt with their rewards\n"
            "  audit   pre-flight check of a task, model and config before a long run\n"
            "  export  write a run's checkpoint as a plain Hugging Face model (--merged OUT: LoRA merged)\n"
            "  bench   step time and memory, grpolab vs TRL on the same setting (docs/performance.md)\n"
            "  plan    peak memory per phase, time and settings that fit on a device, before a run"
        )
        return 0 if argv else 2
    cmd = COMMANDS.get(argv[0])
    if cmd is None:
        print(f"grpolab: unknown command {argv[0]!r}; known: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if argv[0] not in ("train", "eval"):  # those two read thread_wait from their settings first
        from grpolab.util.threads import prepare

        prepare("auto")  # before any torch import: OpenMP reads its wait policy once (grpolab.util.threads)
    try:
        return cmd(argv[1:])
    except ConfigError as e:
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:  # a signal (after a checkpoint), repeated non-finite updates, a full disk
        print(f"grpolab: {e}", file=sys.stderr)
        return e.exit_code
    except StopNow as e:  # a second signal: out at once; checkpoints are atomic, the last complete one stands
        print(f"grpolab: {e}; the last complete checkpoint is intact: continue with --resume OUT", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:  # before training started (loading the model, ...)
        print(
            "grpolab: interrupted; continue with --resume OUT (checkpoints are written every save_every steps)",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
