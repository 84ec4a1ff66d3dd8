"""Task registry. A task makes `Example`s: a training stream and a fixed held-out evaluation set.

Interface every task class follows:

    class MyTask:
        name: str
        system_prompt: str | None        # None: the chat template's default
        default_rewards: list[dict]      # used when the recipe's `rewards` list is empty
        def __init__(self, seed: int, **task_args): ...   # raise ConfigError on bad task_args
        def sample(self, n: int, rng: random.Random) -> list[Example]   # training prompts
        def eval_set(self) -> list[Example]                             # held out, fixed by seed
"""

from __future__ import annotations

import importlib
import inspect

from grpolab.util.fields import ConfigError

TASKS: dict[str, str] = {
    "arithmetic": "grpolab.tasks.arithmetic:ArithmeticTask",
    "countdown": "grpolab.tasks.countdown:CountdownTask",
    "qa": "grpolab.tasks.qa:QATask",
    "code": "grpolab.tasks.code:CodeTask",
    "tools": "grpolab.tasks.tools:ToolsTask",
    "dataset": "grpolab.tasks.dataset:DatasetTask",
    "longsum": "grpolab.tasks.longsum:LongSumTask",
    "env": "grpolab.tasks.env_prompts:EnvironmentTask",
}


def build_task(name: str, seed: int, task_args: dict | None = None, *, environment: bool = False):
    """Instantiate the task registered under `name` (raises ConfigError listing known names).

    environment: the run has an environment, which may write the prompts (dataset, env); passed to the
    task classes whose constructor takes `environment`."""
    if name not in TASKS:
        raise ConfigError(f"task: unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    module, cls = TASKS[name].split(":")
    try:
        task_cls = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:  # a registered task whose module is missing
        raise ConfigError(f"task: {name!r} is not available in this install ({e})") from e
    args = dict(task_args or {})
    if "environment" in args:
        raise ConfigError("task_args.environment: reserved (set env.name for a run with an environment)")
    if environment and "environment" in inspect.signature(task_cls).parameters:
        args["environment"] = True
    try:
        return task_cls(seed=seed, **args)
    except TypeError as e:
        raise ConfigError(f"task_args: {e}") from e
