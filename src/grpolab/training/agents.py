"""Multi-turn rollouts with an environment: the collect stage of a step when `env.name` is set.

    envs = [factory() for each of the N = B*G trajectories];  env.reset(example fields)
    prompt = the user message (+ what reset returned), in the chat template, tools shown where it can
    run.engine.generate_turns(...)  (grpolab.engine: native or vLLM): the model writes a turn;
        respond: the batch's environments step concurrently (grpolab.env.run_turns); each reply's
                 messages become tokens by the template (grpolab.model.template.addition_ids)
    env rewards = env.reward() per trajectory; metrics: turns, calls, errors by kind, stop reasons

The model's tokens stay the ids it sampled; the environment's are marked in Rollout.env_mask, so
every algorithm reads the model's tokens only (docs/agents.md, "The masks").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from grpolab.batch import Example, Rollout
from grpolab.env import close_environment, load_environment, run_turns
from grpolab.env.base import EnvConfigError
from grpolab.env.budget import ToolBudget
from grpolab.env.settings import EnvConfig
from grpolab.engine.base import TurnLimits
from grpolab.model.template import addition_ids, append_only_problem, render
from grpolab.util.fields import ConfigError
from grpolab.util.text import safe_text

STOPS = ("answer", "max_turns", "budget", "env_tokens")
ENV_REWARD = "env"
"""Name of the environment's own reward among the run's rewards (reward/env/mean)."""


@dataclass
class Environments:
    """What a run needs to roll out in an environment: the factory, its tools, the settings."""

    factory: object
    tools: list[dict]
    settings: EnvConfig

    @property
    def name(self) -> str:
        return self.settings.name


def load_environments(settings: EnvConfig, tokenizer, system_prompt: str | None) -> Environments | None:
    """The run's environments (None when env.name is empty), checked before training: the environment
    loads, and the chat template renders a tool conversation append-only (else ConfigError, exit 2)."""
    if not settings.enabled:
        return None
    try:
        factory = load_environment(settings.name, timeout_s=settings.tool_timeout_s,
                                   max_result_chars=settings.max_result_chars, options=settings.options or None)
        probe = factory()
    except EnvConfigError as e:
        raise ConfigError(f"env.name: {e}") from None
    tools = list(getattr(probe, "tools", None) or [])
    close_environment(probe)
    problem = append_only_problem(tokenizer, tools or None, system_prompt)
    if problem:
        raise ConfigError(f"env.name={settings.name}: {problem}. A multi-turn trajectory is trained on the "
                          f"tokens the template renders, so it must only ever append; use a model whose chat "
                          f"template does (the bundled SmolLM2's does)")
    return Environments(factory, tools, settings)


def example_fields(e: Example) -> dict:
    """What env.reset receives: the example's fields (TRL passes the dataset row's columns)."""
    return {"prompt": e.prompt, "answer": e.answer, "id": e.id, **e.meta}


def prompt_messages(e: Example, extra: str | None, system_prompt: str | None) -> list[dict]:
    user = e.prompt + (f"\n\n{extra}" if extra else "")
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": user}]


def _safe(text: str | None, events: Counter) -> str | None:
    """Text made valid Unicode (grpolab.util.text) where it enters the token stream here: the model's
    decoded turn, what reset() appends to the prompt; a repair counts an `invalid_unicode` event."""
    if not isinstance(text, str):
        return text
    out, k = safe_text(text)
    if k:
        events["invalid_unicode"] += 1
    return out


def _safe_reward(env) -> float | None:
    try:
        r = env.reward()
        return None if r is None else float(r)
    except Exception:  # noqa: BLE001 (user code: a failing reward is a missing one, counted)
        return float("nan")


def agent_rollout(run, examples: list[Example], *, G: int, greedy: bool = False,
                  generator: torch.Generator | None = None) -> tuple[Rollout, list[float | None], dict]:
    """G multi-turn trajectories per example. Returns (rollout, the environments' rewards (N,), metrics)."""
    envs_cfg: Environments = run.environments
    s = envs_cfg.settings
    tok = run.tokenizer
    system = run.task.system_prompt
    tools = envs_cfg.tools or None
    envs = [envs_cfg.factory() for _ in range(len(examples) * G)]
    budget = ToolBudget(len(envs), s.tool_budget_s, s.step_tool_budget_s)
    events, calls = Counter(), Counter()
    try:
        extras = [_safe(env.reset(example_fields(examples[i // G])), events) for i, env in enumerate(envs)]
        prompts = [prompt_messages(e, extras[b * G], system) for b, e in enumerate(examples)]
        prompt_ids = [list(tok(render(tok, p, add_generation_prompt=True, tools=tools),
                               add_special_tokens=False)["input_ids"]) for p in prompts]
        history = [list(prompts[i // G]) for i in range(len(envs))]

        def respond(rows: list[int], turn_ids: list[list[int]], ended: list[bool]) -> list[list[int] | None]:
            texts = [_safe(t, events) for t in tok.batch_decode(turn_ids, skip_special_tokens=True)]
            replies = run_turns([envs[r] for r in rows], texts, clocks=[budget.clocks[r] for r in rows])
            out: list[list[int] | None] = []
            for r, text, reply, eos in zip(rows, texts, replies, ended):
                history[r].append({"role": "assistant", "content": text})
                events.update(reply.events)
                calls.update(reply.calls)
                if reply.done or not reply.messages or not eos:
                    out.append(None)
                    continue
                out.append(addition_ids(tok, history[r], reply.messages, tools, events=events))
                history[r] += reply.messages
            return out

        limits = TurnLimits(s.max_turn_tokens, s.max_model_tokens, s.max_env_tokens, s.max_turns)
        rollout, trajs = run.engine.generate_turns(prompt_ids, respond, run.sampling(greedy), limits, G=G,
                                                   generator=generator)
        rewards = [_safe_reward(env) for env in envs]
    finally:
        for env in envs:
            close_environment(env)
    for h, tr in zip(history, trajs):
        if tr.stop == "env_tokens":  # the last reply was refused by the budget: it is not in the tokens either
            while h and h[-1]["role"] != "assistant":
                h.pop()
    rollout.conversations = [h[len(prompts[i // G]):] for i, h in enumerate(history)]
    rollout.stops = [t.stop for t in trajs]
    return rollout, rewards, {**trajectory_metrics(rollout, trajs, events, calls, rewards), **budget.metrics()}


def trajectory_metrics(rollout: Rollout, trajs, events: Counter, calls: Counter, rewards) -> dict:
    """docs/metrics.md, "Environments": per-trajectory means, error counts by kind, stop shares."""
    n = len(trajs)
    env_tokens = float(rollout.env_mask.sum()) if rollout.env_mask is not None else 0.0
    model_tokens = float(rollout.completion_mask.sum())
    m = {"env/turns_mean": sum(len(t.turns) for t in trajs) / n,
         "env/tool_calls_mean": sum(calls.values()) / n,
         "env/env_token_frac": env_tokens / max(1.0, env_tokens + model_tokens),
         "env/reward_none": float(sum(r is None for r in rewards)),
         "env/reward_errors": float(sum(r is not None and r != r for r in rewards))}
    for stop in STOPS:
        m[f"env/stopped_{stop}"] = sum(t.stop == stop for t in trajs) / n
    for kind, k in events.items():
        m[f"env/errors_{kind}"] = float(k)
    for name, k in calls.items():
        m[f"env/calls/{name}"] = float(k)
    return m


def add_env_reward(scores, rewards: list[float | None], weight: float) -> None:
    """The environment's reward as one more reward source, `env`: per_fn["env"], weight * r added to the
    total. A None (the environment gives no reward for that trajectory) or a failed reward() adds
    nothing and is counted (env/reward_none, env/reward_errors), as TRL leaves a None out."""
    vals = [0.0 if r is None or r != r else r for r in rewards]
    scores.per_fn[ENV_REWARD] = vals
    scores.total = [t + weight * v for t, v in zip(scores.total, vals)]
    scores.metrics[f"reward/{ENV_REWARD}/mean"] = sum(vals) / max(1, len(vals))
