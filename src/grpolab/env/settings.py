"""The `env.*` keys of a recipe: which environment answers the model's turns, and the limits of a
multi-turn trajectory. env.name empty (the default) keeps the single-turn rollout."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from grpolab.env.loading import EnvKind
from grpolab.util.fields import ConfigError

ToolThread = Literal["worker", "main"]
"""The `env.tool_thread` setting: where a synchronous tool call runs (grpolab.env.runner.ToolRunner)."""
TOOL_THREADS: tuple[str, ...] = typing.get_args(ToolThread)


@dataclass
class EnvConfig:
    """Multi-turn rollouts (docs/agents.md)."""

    name: str = ""
    """Environment: a built-in name (retry_arithmetic, guess_number, calculator_python), `module:Name` or `file.py:Name` (a TRL environment_factory class, a list of tool functions, a gym-style, OpenEnv-style or SkyRL-gym-style class); empty = single-turn."""
    factories: dict[str, str] = field(default_factory=dict)
    """Several environments by name, as TRL's dict environment_factory: each example picks one by its `environment` column, e.g. env.factories.math=envs.py:MathEnv env.factories.game=envs.py:Game (instead of env.name)."""
    kind: Literal["", EnvKind] = ""
    """The adapter, when the guess from the object's shape is wrong: factory (TRL's environment_factory), tools, gym, openenv, skyrl or environment; empty = guess."""
    tools: list[str] = field(default_factory=list)
    """Standalone tool functions offered besides an environment class's methods, as TRL's tools= next to environment_factory: `module:fn` or `file.py:fn` each."""
    tool_thread: ToolThread = "worker"
    """Where a synchronous tool call (and a gym-style step) runs: worker (a daemon thread, with env.tool_timeout_s) or main (the main thread, one call after another, no timeout: as TRL runs them, so a tool may use signal.alarm)."""
    max_turns: int = 3
    """Most model turns per trajectory; a trajectory still going after this many is stopped (env/stopped_max_turns)."""
    max_turn_tokens: int = 64
    """Most tokens the model may write in one turn; a turn that reaches it without EOS ends its trajectory."""
    max_model_tokens: int = 128
    """The trajectory's token budget: every token the model writes, over all its turns (env/stopped_budget when spent)."""
    max_env_tokens: int = 256
    """Most tokens the environment may add to one trajectory (tool results, feedback, role headers); a reply past it ends the trajectory (env/stopped_env_tokens)."""
    tool_timeout_s: float = 5.0
    """Time limit of one tool call; past it the model gets an error message and the run goes on (env/errors_timeout)."""
    tool_budget_s: float = 60.0
    """Tool time of one trajectory, all its calls over all its turns (a call's wall time, waiting for a sandbox slot included); once spent, further calls are refused with an error message (env/errors_budget, env/tool_s_mean)."""
    step_tool_budget_s: float = 300.0
    """Wall-clock time one step's rollout may spend waiting for its environments' tool calls, all turns together (per collect round: DAPO's dynamic sampling gives each resampling round its own); once spent, every call still running is stopped and further ones refused (env/errors_budget, env/tool_wait_s)."""
    tool_process: bool = False
    """Run every tool call in a child process (forked), killed with what it started at its limit: the one hard bound for a tool that holds the GIL in one long C operation (`a ** b`, a catastrophic regex), which no thread can interrupt. The call's changes to its object's state stay in the child (env/errors_process_state_lost counts them): for tools that compute a result from their arguments. Tool calls only (tools= lists and environment classes); POSIX only."""
    tool_memory_mb: int = 1024
    """With env.tool_process: the memory (MiB of address space, RLIMIT_AS) a tool call's child process may add to what it inherits from the trainer; past it an allocation fails (MemoryError: the model reads the error). What the call starts gets the same limit each. 0: no limit."""
    max_stuck_calls: int = 4
    """Most tool calls (and environment steps) that ran past their limit may still be running in their threads, process-wide; while that many are, further calls on threads are not started: the model reads an error and env/errors_stuck counts them."""
    reset_timeout_s: float = 60.0
    """Time limit of creating and resetting one trajectory's environment; an example whose environment raises there or runs past it has its trajectories score 0 (env/errors_reset, env/errors_reset_timeout), and the run goes on."""
    max_result_chars: int = 2000
    """A tool result longer than this is cut, with a visible marker (env/errors_truncated)."""
    reward_weight: float = 1.0
    """Weight of the environment's own reward (its reward() / TRL's get_reward()), logged as reward/env; 0 ignores it."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment class's constructor, e.g. env.options.max_value=100."""

    @property
    def enabled(self) -> bool:
        return bool(self.name) or bool(self.factories)


def validate_env(env: EnvConfig) -> None:
    """ConfigError (exit 2) naming the key for an impossible value."""
    checks = [
        (env.max_turns >= 1, "env.max_turns", "must be >= 1"),
        (env.max_turn_tokens >= 1, "env.max_turn_tokens", "must be >= 1"),
        (
            env.max_model_tokens >= env.max_turn_tokens,
            "env.max_model_tokens",
            f"must be >= env.max_turn_tokens ({env.max_turn_tokens}): the budget covers at least one whole turn",
        ),
        (env.max_env_tokens >= 1, "env.max_env_tokens", "must be >= 1"),
        (env.tool_timeout_s > 0, "env.tool_timeout_s", "must be > 0 seconds"),
        (env.tool_budget_s > 0, "env.tool_budget_s", "must be > 0 seconds"),
        (env.step_tool_budget_s > 0, "env.step_tool_budget_s", "must be > 0 seconds"),
        (env.max_result_chars >= 16, "env.max_result_chars", "must be >= 16"),
        (env.max_stuck_calls >= 1, "env.max_stuck_calls", "must be >= 1"),
        (env.tool_memory_mb >= 0, "env.tool_memory_mb", "must be >= 0 MiB (0: no limit)"),
        (env.reset_timeout_s > 0, "env.reset_timeout_s", "must be > 0 seconds"),
        (env.reward_weight >= 0, "env.reward_weight", "must be >= 0"),
        (
            not (env.name and env.factories),
            "env.factories",
            "give env.name (one environment) or env.factories (several, routed by the `environment` column), not both",
        ),
        (
            all(k and v for k, v in env.factories.items()),
            "env.factories",
            "must map environment names to specs, e.g. env.factories.math=envs.py:MathEnv",
        ),
        (all(env.tools), "env.tools", "must list `module:fn` or `file.py:fn` specs"),
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
