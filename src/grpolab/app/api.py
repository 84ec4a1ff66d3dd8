"""The Python API: `grpolab.train` and `grpolab.evaluate`, from a script or a notebook.

    import grpolab

    def short(completions, **kwargs):                  # a TRL-style reward function
        return [1.0 if len(c) < 40 else 0.0 for c in completions]

    summary = grpolab.train("recipes/demo.yaml", rewards=[short], steps=5, out="runs/try")
    result = grpolab.evaluate("runs/try")              # greedy held-out accuracy of its newest checkpoint

The config is a `grpolab.training.config.Config`, a dict (the keys of a recipe), a recipe path or name, or
None (the defaults). Keyword arguments are top-level keys (steps=5, task_args={...}, algo="dapo");
`overrides` takes the command line's KEY=VALUE strings ("algo.beta=0.04"). Everything goes through
grpolab.training.config.build_config, so the validation and the error messages (ConfigError) are the CLI's.

rewards: a list whose items are a reward name ("math"), a spec dict ({"name": "math", "weight": 0.5},
"name" may be a function), or a function, in TRL's form `fn(completions, prompts=..., **columns) ->
list[float | None]` or grpolab's `fn(completion, example) -> float`. A function that can be imported
again (defined at the top level of an importable module) is recorded in config.yaml by its import
path, so `grpolab train --resume OUT` finds it; any other (a notebook's, a lambda) is registered in
grpolab.rewards.REWARDS under its name for the duration of the call only (the registry is left as it
was) and such a run is resumed through this API with the same functions.

dataset: a file or `datasets` directory (task=dataset, task_args.path), or rows in memory (a list of
dicts, or a `datasets.Dataset`), which are written to OUT/dataset.jsonl so that the run can be
resumed. task: a task name.

TRL's spellings of GRPOTrainer are accepted as they are (docs/agents.md):

    grpolab.train(environment_factory=WordleEnv, reward_funcs=[won], train_dataset=ds, max_steps=2, ...)

environment_factory (a class or zero-argument callable: env.name; a dict of them: env.factories,
routed by the rows' `environment` column), tools (functions: env.tools beside an environment class,
else the environment itself), reward_funcs (= rewards), train_dataset (= dataset), max_steps (= steps).
Without a dataset, a task or a recipe's task, environment_factory means TRL's train_dataset=None:
task=env, the environment's reset writes every prompt. Objects are recorded as rewards are: by import
path when they can be imported again, else registered by name for the duration of the call.

Output: the CLI's progress and summary, all through one rich Console (`console=`, default a new one
on stdout), so each step line, the evaluation notes and the summary table appear once, and the
summary comes back as the return value, not printed again. Outside a terminal (a notebook, a log
file) the progress is one plain line per step; rich renders in Jupyter cells itself (not tested
here: no Jupyter on the development machine). Hugging Face progress bars are off during the call
and restored after it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError

ConfigLike = Any  # Config | dict | str | Path | None


def _recipe_of(config: ConfigLike) -> dict:
    from grpolab.training.config import Config, to_dict
    from grpolab.training.recipe import load_recipe

    if config is None:
        return {}
    if isinstance(config, Config):
        return to_dict(config)
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, Path)):
        return load_recipe(config)
    raise ConfigError(f"config: expected a Config, a dict, a recipe path or None, got {type(config).__name__}")


def _import_path(fn: Callable) -> str | None:
    """`module:qualname` when `fn` can be imported again by that name in another process."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod == "__main__" or mod.startswith(("grpolab_user_rewards_", "grpolab_env_")) or "<" in qual:
        return None
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - not importable: register it for the call instead
        return None
    return f"{mod}:{qual}" if obj is fn else None


@contextlib.contextmanager
def _registered(rewards: Iterable | None):
    """Reward specs for the config; callables that cannot be imported are registered in REWARDS for
    the duration of the block, and the registry is restored exactly afterwards."""
    from grpolab.rewards import REWARDS, as_factory

    before = dict(REWARDS)
    specs: list[dict] | None = None
    try:
        if rewards is not None:
            if isinstance(rewards, (str, dict)) or callable(rewards):
                rewards = [rewards]
            specs = []
            for i, item in enumerate(rewards):
                spec = {"name": item} if isinstance(item, str) or callable(item) else item
                if not isinstance(spec, dict):
                    raise ConfigError(f"rewards[{i}]: expected a name, a spec dict or a function, got {item!r}")
                spec = dict(spec)
                fn = spec.get("name")
                if callable(fn):
                    ref = _import_path(fn)
                    if ref is not None:
                        spec["name"] = ref
                    else:
                        base = spec.get("label") or getattr(fn, "__name__", "") or "reward"
                        base = base if base.isidentifier() else f"reward_{i}"
                        key, n = base, 2
                        while key in REWARDS:
                            key, n = f"{base}_{n}", n + 1
                        REWARDS[key] = as_factory(fn)
                        spec["name"] = key
                specs.append(spec)
        yield specs
    finally:
        REWARDS.clear()
        REWARDS.update(before)


@contextlib.contextmanager
def _environments(environment_factory, tools):
    """The env.* settings for TRL's environment_factory= and tools= objects (see the module docstring);
    objects that cannot be imported by name are registered (grpolab.env.loading.registered) for the block."""
    from grpolab.env.loading import registered

    with contextlib.ExitStack() as stack:

        def spec(obj, base: str) -> str:
            if isinstance(obj, str):
                return obj
            ref = _import_path(obj)
            return ref if ref is not None else stack.enter_context(registered(obj, base))

        if tools is not None and (callable(tools) or isinstance(tools, str)):
            tools = [tools]
        env: dict = {}
        tool_specs = [spec(t, getattr(t, "__name__", "tool")) for t in (tools or [])]
        if isinstance(environment_factory, dict):
            if not environment_factory:
                raise ConfigError("environment_factory: an empty dict; map environment names to classes")
            env["factories"] = {str(k): spec(v, getattr(v, "__name__", str(k))) for k, v in environment_factory.items()}
        elif environment_factory is not None:
            if not callable(environment_factory) and not isinstance(environment_factory, str):
                raise ConfigError(
                    f"environment_factory: expected a class or a zero-argument function, got "
                    f"{type(environment_factory).__name__}"
                )
            env["name"] = spec(environment_factory, getattr(environment_factory, "__name__", "environment"))
        if tool_specs and env:
            env["tools"] = tool_specs
        elif tool_specs:
            env["name"] = stack.enter_context(registered(_tool_objects(tools), "tools"))
        yield env


def _tool_objects(tools) -> list:
    """Tool functions (a spec string resolved to its function)."""
    from grpolab.env.loading import load_tools

    return load_tools(list(tools))


def _trl_settings(settings: dict, rewards, dataset, reward_funcs, train_dataset):
    """TRL's names folded into grpolab's: (rewards, dataset, settings); both spellings at once is an error."""
    if reward_funcs is not None:
        if rewards is not None:
            raise ConfigError("reward_funcs: TRL's name for rewards; give one of rewards= and reward_funcs=")
        rewards = reward_funcs
    if train_dataset is not None:
        if dataset is not None:
            raise ConfigError("train_dataset: TRL's name for dataset; give one of dataset= and train_dataset=")
        dataset = train_dataset
    if "max_steps" in settings:
        if "steps" in settings:
            raise ConfigError("max_steps: TRL's name for steps; give one of steps= and max_steps=")
        settings = {**settings, "steps": settings["max_steps"]}
        del settings["max_steps"]
    return rewards, dataset, settings


def _write_rows(rows, out: Path, name: str = "dataset.jsonl") -> Path:
    """Rows in memory -> OUT/dataset.jsonl (atomic), so the run's config names a file. A map-style
    dataset (a torch Dataset: __len__ and __getitem__) is read by index up to its length."""
    from grpolab.util.fileio import atomic_write

    if hasattr(rows, "to_list"):
        rows = rows.to_list()
    elif not isinstance(rows, (list, tuple)) and hasattr(rows, "__len__") and hasattr(rows, "__getitem__"):
        rows = [rows[i] for i in range(len(rows))]
    rows = list(rows)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError("dataset: expected a path, a datasets.Dataset or a non-empty list of dicts (one per row)")
    try:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"dataset: rows must be JSON data (strings, numbers, lists, dicts): {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    atomic_write(path, text)
    return path


def build(
    config: ConfigLike = None,
    *,
    rewards=None,
    task: str | None = None,
    dataset=None,
    overrides: list[str] | None = None,
    resume: str | Path | None = None,
    trl_env: dict | None = None,
    env_task: bool = False,
    eval_dataset=None,
    **settings,
):
    """The validated Config that `train` would run, and the rows to write for an in-memory dataset.

    trl_env: env.* settings from TRL's environment_factory= / tools= (see _environments); env_task (an
    environment_factory was given): with no dataset, task or recipe task, the task is `env`. Returns (cfg, rows or None). Raises ConfigError exactly as
    the CLI does."""
    from grpolab.training.config import build_config, config_from_run
    from grpolab.training.recipe import deep_update

    if resume is not None:
        if config is not None:
            raise ConfigError("resume: give a run directory to resume or a config, not both")
        recipe = config_from_run(Path(resume))
        recipe["out"] = str(resume)
    else:
        recipe = _recipe_of(config)
    deep_update(recipe, copy.deepcopy(settings))
    env = trl_env
    if env:
        given = recipe.get("env") if isinstance(recipe.get("env"), dict) else {}
        clash = sorted(k for k in env if given.get(k) and k in ("name", "factories", "tools"))
        if clash or (given.get("name") and "factories" in env) or (given.get("factories") and "name" in env):
            raise ConfigError(
                f"environment_factory: the config already sets env.{(clash or ['name'])[0]}; give the "
                "environment one way"
            )
        recipe["env"] = {**given, **env}
        if env_task and task is None and dataset is None and "task" not in recipe:
            recipe["task"] = "env"  # TRL's train_dataset=None: the environment writes the prompts
    if task is not None:
        if not isinstance(task, str):
            raise ConfigError(f"task: expected a task name, got {type(task).__name__} (use dataset= for data)")
        recipe["task"] = task
    rows = None
    if dataset is not None:
        if task not in (None, "dataset"):
            raise ConfigError(f"dataset: reads data with task=dataset; got task={task!r} as well")
        recipe["task"] = "dataset"
        args = recipe.get("task_args") if isinstance(recipe.get("task_args"), dict) else {}
        recipe["task_args"] = args
        if isinstance(dataset, (str, Path)):
            args["path"] = str(dataset)
        else:
            rows = dataset
            args["path"] = "dataset.jsonl"  # replaced by OUT/dataset.jsonl below
    if eval_dataset is not None:
        if recipe.get("task") != "dataset":
            raise ConfigError("eval_dataset: goes with a dataset (task=dataset)")
        if isinstance(eval_dataset, (str, Path)):
            recipe.setdefault("task_args", {})["eval_path"] = str(eval_dataset)
        else:
            recipe.setdefault("task_args", {})["eval_path"] = (
                "eval_dataset.jsonl"  # replaced by OUT/eval_dataset.jsonl below
            )
            recipe.setdefault("eval_size", len(eval_dataset))
    if rewards is not None:
        recipe["rewards"] = rewards
    cfg = build_config(recipe, overrides or [])
    if rows is not None:
        cfg.task_args["path"] = str(Path(cfg.out) / "dataset.jsonl")
    if eval_dataset is not None and not isinstance(eval_dataset, (str, Path)):
        cfg.task_args["eval_path"] = str(Path(cfg.out) / "eval_dataset.jsonl")
    return cfg, rows


@contextlib.contextmanager
def _quiet_hub_bars():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # grpolab's own progress is the one to watch
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def train(
    config: ConfigLike = None,
    *,
    rewards=None,
    task: str | None = None,
    dataset=None,
    overrides: list[str] | None = None,
    resume: str | Path | None = None,
    console=None,
    environment_factory=None,
    tools=None,
    reward_funcs=None,
    train_dataset=None,
    eval_dataset=None,
    args=None,
    callbacks=None,
    policy=None,
    tokenizer=None,
    reference=None,
    **settings,
) -> dict:
    """Train and return the summary (the dict written to OUT/summary.json).

    config: a Config, a dict, a recipe path or name, or None; settings: top-level keys (steps=5,
    out="runs/x", task_args={...}); overrides: KEY=VALUE strings as on the command line; rewards,
    task, dataset: see the module docstring; resume: a run directory to continue (its config.yaml,
    then the settings), or "auto" (the resume=auto setting: a new run where `out` holds none, else
    the run there continued; docs/distributed.md); console: a rich Console (default: a new one on stdout).
    environment_factory, tools, reward_funcs, train_dataset (and max_steps= among the settings): TRL's
    GRPOTrainer spellings (the module docstring); rows given as train_dataset are read as GRPOTrainer reads
    them (grpolab.app.trl_compat.data.trl_reading: no answer column needed, a string prompt is the model's
    input as it is, a stream read only as far as max_steps goes), rows given as dataset grpolab's way. eval_dataset: a file, or rows (written to
    OUT/eval_dataset.jsonl), evaluated instead of a share of the training rows. args: a GRPOConfig (grpolab's
    or trl's), mapped by grpolab.app.trl_compat (docs/migrating-from-trl.md); TRL field names among the
    settings (learning_rate=, per_device_train_batch_size=, ...) are mapped by the same table. callbacks: objects with any of the hooks on_train_begin,
    on_step_begin, on_step_end, on_log, on_evaluate, on_save, on_train_end (subclass grpolab.Callback), or
    transformers TrainerCallbacks; one stops the run by returning True (control.should_training_stop for a
    TrainerCallback): the run then ends as at its last step, with a checkpoint, summary and report
    (grpolab.training.callbacks). report_to= (a setting) picks the trackers (docs/metrics.md, "Trackers").
    policy, tokenizer: a model object and its tokenizer, trained in place instead of loading `model`
    (which then only records where it came from; grpolab.app.trl_compat's GRPOTrainer passes them); reference:
    a frozen copy of that model, the reference of the KL term (the GRPOTrainer's ref_model).
    """
    from rich.console import Console

    from grpolab.training import trainer
    from grpolab.training.callbacks import as_callbacks
    from grpolab.training.trackers import check_installed

    if isinstance(resume, str) and resume == "auto":  # the setting, not a directory named auto
        overrides, resume = [*(overrides or []), "resume=auto"], None
    rewards, dataset, settings = _trl_settings(settings, rewards, dataset, reward_funcs, train_dataset)
    from grpolab.app.trl_compat.config import trl_overrides, trl_recipe

    if args is not None:
        if config is not None:
            raise ConfigError("args: a TRL GRPOConfig is the config; give args= or config=, not both")
        config = trl_recipe(args)[0]
    settings, notes = trl_overrides(settings)
    if train_dataset is not None and not isinstance(train_dataset, (str, Path)):  # TRL's name: TRL's reading
        from grpolab.app.trl_compat.data import trl_reading

        known = {**(config if isinstance(config, dict) else {}), **settings}
        dataset, reading = trl_reading(
            train_dataset, known, environment=environment_factory is not None, eval_given=eval_dataset is not None
        )
        given_args = settings.get("task_args") if isinstance(settings.get("task_args"), dict) else {}
        settings = {**reading, **settings, "task_args": {**reading["task_args"], **given_args}}
    console = console or Console()
    for note in notes:
        console.print(f"TRL compatibility: {note}")
    with _registered(rewards) as specs, _environments(environment_factory, tools) as env:
        cfg, rows = build(
            config,
            rewards=specs,
            task=task,
            dataset=dataset,
            overrides=overrides,
            resume=resume,
            trl_env=env,
            env_task=environment_factory is not None,
            eval_dataset=eval_dataset,
            **settings,
        )
        hooks = as_callbacks(callbacks)  # before writing anything: a bad callback or a tracker's missing extra
        check_installed(cfg.report_to)
        out = Path(cfg.out)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"out: {cfg.out} exists and is not a directory; choose another out=DIR")
        trainer.check_out_dir(out, resume is not None, auto=cfg.resume == "auto")  # before writing anything into OUT
        if rows is not None:
            _write_rows(rows, out)
        if eval_dataset is not None and not isinstance(eval_dataset, (str, Path)):
            _write_rows(eval_dataset, out, "eval_dataset.jsonl")
        from grpolab.app.report import write_run_report

        with _quiet_hub_bars():
            return trainer.train(
                cfg,
                resume=resume is not None,
                console=console or Console(),
                report=write_run_report,
                callbacks=hooks,
                policy=policy,
                tokenizer=tokenizer,
                reference=reference,
            )


def evaluate(
    target: ConfigLike = None,
    *,
    rewards=None,
    task: str | None = None,
    dataset=None,
    overrides: list[str] | None = None,
    console=None,
    **settings,
) -> dict:
    """Held-out accuracy, like `grpolab eval`: of a run's newest checkpoint (target = a run
    directory, with its config) or of a model (target = a Config, dict, recipe or None; model=...).
    Greedy, or eval_num_generations=n samples per prompt for pass@k (docs/evaluation.md).

    Returns {"accuracy", "accuracy_ci", "reward", "length", "n", "main_reward", "pass@k", "extraction",
    "per_prompt", ...} (grpolab.training.evaluation.evaluate); eval_size (default 64) prompts.
    """
    from rich.console import Console

    from grpolab.training import trainer
    from grpolab.training.config import config_from_run
    from grpolab.training.evaluation import evaluate as evaluate_run

    recipe: ConfigLike = target
    if isinstance(target, (str, Path)) and Path(target, "config.yaml").exists():
        from grpolab.training.checkpoint import latest_checkpoint

        recipe = config_from_run(Path(target))
        ck = latest_checkpoint(Path(target))
        if ck is None:
            raise ConfigError(f"{target}: the run has no checkpoint yet")
        recipe["model"] = str(ck)
    console = console or Console()
    with _registered(rewards) as specs:
        cfg, rows = build(recipe, rewards=specs, task=task, dataset=dataset, overrides=overrides, **settings)
        if rows is not None:
            raise ConfigError("dataset: evaluate reads a file or datasets directory (rows in memory are for train)")
        with _quiet_hub_bars():
            run = trainer.setup(cfg, training=False, log=console.print)
            return evaluate_run(run, run.task.eval_set()[: cfg.eval_size or 64])


__all__ = ["build", "evaluate", "train"]
