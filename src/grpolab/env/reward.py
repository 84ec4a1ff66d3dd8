"""The environment's own reward (its reward(), TRL's get_reward()) as one reward function, `env`, scored with
the run's others (grpolab.rewards.scoring) while a rollout's environments are open; and its metrics."""

from __future__ import annotations

from grpolab.rewards.scoring import RewardFn, Scores

ENV_REWARD = "env"
"""Name of the environment's own reward among the run's rewards (reward/env/mean)."""


def _safe_reward(env) -> float | None:
    try:
        r = env.reward()
        return None if r is None else float(r)
    except Exception:  # noqa: BLE001 (user code: a failing reward is a missing one, counted)
        return float("nan")


def env_reward(weight: float) -> RewardFn:
    """The environment's own reward (its reward(), TRL's get_reward()) as one reward function, `env`:
    scored with the others (grpolab.rewards.scoring), from the trajectories' environments. A None means
    it does not apply (reward/env/none, env/reward_none); a reward() that raises is an error
    (reward/errors, env/reward_errors) and adds nothing."""

    def env(completions, examples, environments=None, **context):
        if environments is None:  # scored outside a rollout (a gold-answer check): nothing to read
            return [None] * len(completions)
        return [_safe_reward(e) for e in environments]

    env.takes_context = True  # type: ignore[attr-defined]
    return RewardFn(ENV_REWARD, weight, env, batch=True)


def env_reward_metrics(scores: Scores) -> dict:
    """env/reward_none and env/reward_errors: trajectories whose environment gave no reward, or whose reward() raised."""
    if ENV_REWARD not in scores.per_fn:
        return {}
    return {
        "env/reward_none": float(len(scores.none.get(ENV_REWARD, ()))),
        "env/reward_errors": float(len(scores.errors.get(ENV_REWARD, ()))),
    }
