"""Multi-turn rollouts with an environment: the collect stage of a step when `env.name` is set.

    load_environments(cfg.env, tokenizer, system prompt)   at setup: each environment loads, and the
                                        chat template renders a conversation with its tools append-only
    agent_rollout(run, examples, G=...)  the run's environments, engine, tokenizer, sampling and turn
                                        limits handed to grpolab.env.rollout.roll_out, the loop itself
    env_reward(weight)                  the environment's own reward as the reward function `env`
                                        (grpolab.env.reward; ENV_REWARD, env_reward_metrics too)

The step scores the rollout while its environments are open (TRL-form functions read `environments`
and `prompts`), then closes them (grpolab.env.rollout.close_all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpolab.batch import Example, Rollout
from grpolab.engine.base import Sampling, TurnLimits
from grpolab.env import close_environment, load_environment
from grpolab.env.base import EnvConfigError
from grpolab.env.process import limit_memory as limit_process_memory
from grpolab.env.reward import ENV_REWARD, env_reward, env_reward_metrics
from grpolab.env.rollout import Environments, roll_out
from grpolab.env.settings import EnvConfig
from grpolab.env.timeouts import limit_stuck_calls, short_error
from grpolab.model.families import template_for_turns
from grpolab.util.fields import ConfigError

if TYPE_CHECKING:
    from grpolab.training.run import Run

PROCESS_KINDS = ("tools", "factory")
"""The environment kinds whose tool calls env.tool_process runs in a child process."""


def _load_one(spec: str, s: EnvConfig, tokenizer, system_prompt: str | None, key: str, log=print):
    """(factory, tools, has_reward) of one environment spec, checked: it loads, and the chat template renders
    a conversation with its tools append-only, the model's own or its family's training template, said by
    `log` (grpolab.model.families.template_for_turns; else ConfigError, exit 2)."""
    try:
        factory = load_environment(
            spec,
            kind=s.kind or None,
            timeout_s=s.tool_timeout_s,
            max_result_chars=s.max_result_chars,
            options=s.options or None,
            tools=s.tools,
            here=s.tool_thread == "main",
            process=s.tool_process,
        )
        probe = factory()
    except EnvConfigError as e:
        raise ConfigError(f"{key}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's class failed before training: say so, exit 2
        raise ConfigError(
            f"{key}={spec}: creating the environment raised {short_error(e)}; it must be creatable "
            "with the given env.options before training starts"
        ) from e
    if s.tool_process and factory.kind not in PROCESS_KINDS:
        close_environment(probe)
        raise ConfigError(
            f"env.tool_process: {key}={spec} is a {factory.kind}-style environment, whose steps are its "
            "state and run in this process; tool calls in a child process need tool functions or an "
            "environment class whose methods are tools. Set env.tool_process=false"
        )
    tools = list(getattr(probe, "tools", None) or [])
    has_reward = bool(getattr(probe, "has_reward", True))
    close_environment(probe)
    problem, note = template_for_turns(tokenizer, tools or None, system_prompt)
    if note:
        log(note)
    if problem:
        raise ConfigError(
            f"{key}={spec}: {problem}. A multi-turn trajectory is trained on the "
            f"tokens the template renders, so it must only ever append; use a model whose chat "
            f"template does (the bundled SmolLM2's, Qwen2.5's, Qwen3's and Llama 3.1/3.2's do)"
        )
    return factory, tools, has_reward


def load_environments(settings: EnvConfig, tokenizer, system_prompt: str | None, log=print) -> Environments | None:
    """The run's environments (None when env.name and env.factories are empty), checked before training; `log`
    says which chat template renders their conversations when it is not the model's own."""
    if not settings.enabled:
        return None
    limit_stuck_calls(settings.max_stuck_calls)
    limit_process_memory(settings.tool_memory_mb)
    if settings.name:
        factory, tools, has_reward = _load_one(settings.name, settings, tokenizer, system_prompt, "env.name", log)
        return Environments(factory, tools, settings, has_reward=has_reward)
    routes, rewarded = {}, []
    for name, spec in settings.factories.items():
        factory, tools, has_reward = _load_one(spec, settings, tokenizer, system_prompt, f"env.factories.{name}", log)
        routes[name] = (factory, tools)
        rewarded.append(has_reward)
    first = next(iter(routes.values()))
    return Environments(first[0], first[1], settings, routes=routes, has_reward=any(rewarded))


def agent_rollout(
    run: Run,
    examples: list[Example],
    *,
    G: int,
    generator: torch.Generator | None = None,
    sampling: Sampling | None = None,
) -> tuple[Rollout, dict[str, list], dict]:
    """G multi-turn trajectories per example in the run's environments (grpolab.env.rollout.roll_out).
    Returns (rollout, context, metrics) as roll_out does. `sampling`: how to draw tokens (default: the
    run's, run.sampling; the evaluation passes its own)."""
    s = run.environments.settings
    return roll_out(
        run.environments,
        examples,
        engine=run.engine,
        tokenizer=run.tokenizer,
        sampling=sampling or run.sampling,
        limits=TurnLimits(s.max_turn_tokens, s.max_model_tokens, s.max_env_tokens, s.max_turns),
        G=G,
        generator=generator,
        system_prompt=run.task.system_prompt,
    )


__all__ = ["ENV_REWARD", "PROCESS_KINDS", "agent_rollout", "env_reward", "env_reward_metrics", "load_environments"]
