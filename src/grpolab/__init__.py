"""grpolab: reinforcement learning from verifiable rewards, from REINFORCE to GRPO and its refinements.

    import grpolab
    summary = grpolab.train("recipes/demo.yaml", steps=5, out="runs/try", rewards=[my_reward_fn])
    grpolab.evaluate("runs/try")
    grpolab.train(..., callbacks=[MyCallback()])    # grpolab.Callback hooks, or a transformers TrainerCallback

`import grpolab` is cheap: the attributes below load their modules (and torch) on first use.
See grpolab.app.api for the arguments. A TRL script runs with `from grpolab import GRPOConfig, GRPOTrainer`
(grpolab.app.trl_compat; docs/migrating-from-trl.md).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "train": "grpolab.app.api:train",
    "evaluate": "grpolab.app.api:evaluate",
    "build_config": "grpolab.training.config:build_config",
    "Config": "grpolab.training.config:Config",
    "ConfigError": "grpolab.util.fields:ConfigError",
    "Example": "grpolab.batch:Example",
    "REWARDS": "grpolab.rewards:REWARDS",
    "GRPOConfig": "grpolab.app.trl_compat:GRPOConfig",
    "GRPOTrainer": "grpolab.app.trl_compat:GRPOTrainer",
    "Callback": "grpolab.training.callbacks:Callback",
    "TrainingState": "grpolab.training.callbacks:TrainingState",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'grpolab' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
