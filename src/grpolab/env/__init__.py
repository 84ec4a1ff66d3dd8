"""Environments for multi-turn rollouts: what the model's turns are answered with.

The environment layer: no model of its own. A rollout loop gives each trajectory an Environment,
passes it the model's turns as text, and appends the chat messages it returns; `rollout` is that loop,
turning the messages into tokens for a rollout engine it is handed.

- `base`      the contract: Environment (reset / step / reward, tools), Reply, the error types.
- `calls`     parse Hermes/Qwen `<tool_call>{json}</tool_call>` blocks: ToolCall / ParseError.
- `schema`    OpenAI function schemas from type hints and docstrings; argument checking.
- `runner`    run a turn's calls (timeouts, errors as messages, counted events); run_turns for a batch.
- `timeouts`  one call under its time limit (a thread, the calling thread, a child process); stuck calls.
- `budget`    tool time: a budget per trajectory and per step; a call's deadline and events, seen by its tool.
- `adapters`  FunctionTools (TRL tools=), FactoryEnvironment (TRL environment_factory=), GymAdapter.
- `openenv`   OpenEnvAdapter: OpenEnv-style environments (pydantic actions, observation objects).
- `skyrl`     SkyRLAdapter: SkyRL-gym-style environments ((env_config, extras), init, step -> dict).
- `loading`   load_environment("module:Name" | "file.py:Name" | built-in name | object).
- `builtin`   retry_arithmetic, guess_number, calculator_python (ENVIRONMENTS).
- `reward`    the environment's own reward as the reward function `env` (env_reward).
- `rollout`   roll_out: a batch's multi-turn trajectories (environments, chat template, an engine's
              generate_turns); Environments (a run's factories and tools); not re-exported here.
- `settings`  the recipe's env.* keys (EnvConfig); not re-exported here, so that importing the
              environment layer does not import the config layer.
"""

from grpolab.env.adapters import FactoryEnvironment, FunctionTools, GymAdapter, InstancePool, tool_method_names
from grpolab.env.base import (
    ERROR_KINDS,
    EnvConfigError,
    Environment,
    EnvironmentShapeError,
    Reply,
    close_environment,
    is_environment,
)
from grpolab.env.calls import MAX_BLOCK_CHARS, MAX_CALLS, ParseError, ToolCall, parse_tool_calls
from grpolab.env.loading import EnvironmentFactory, EnvironmentNotFound, environment_factory, load_environment
from grpolab.env.runner import ToolRunner, run_turns
from grpolab.env.schema import SchemaError, check_arguments, function_schema, prepare_arguments
from grpolab.env.timeouts import stuck_calls

__all__ = [
    "ERROR_KINDS",
    "MAX_BLOCK_CHARS",
    "MAX_CALLS",
    "EnvConfigError",
    "Environment",
    "EnvironmentFactory",
    "EnvironmentNotFound",
    "EnvironmentShapeError",
    "FactoryEnvironment",
    "FunctionTools",
    "GymAdapter",
    "InstancePool",
    "ParseError",
    "Reply",
    "SchemaError",
    "ToolCall",
    "ToolRunner",
    "check_arguments",
    "close_environment",
    "environment_factory",
    "function_schema",
    "is_environment",
    "load_environment",
    "parse_tool_calls",
    "prepare_arguments",
    "run_turns",
    "stuck_calls",
    "tool_method_names",
]
