"""What TRL 1.16's GRPOTrainer checks and sets up when it is built, beyond the config's fields: where the data
and the rewards come from, the warning of a sequence-level ratio under a token-summed loss, the reward
functions' names and weights as TRL lists them, a stream's data-loader settings, and whether the MoE
router's auxiliary loss is on (TRL's aux_loss_enabled)."""

from __future__ import annotations

import logging
from typing import Any

from grpolab.app.trl_compat.entries import value_of
from grpolab.util.fields import ConfigError

log = logging.getLogger("grpolab.trl_compat")

TOKEN_SUMMED = ("bnpo", "dr_grpo", "dapo", "cispo")
"""TRL's loss types that sum per-token terms: with a sequence-level ratio each sequence counts by its length."""


def _factories(environment_factory: Any) -> list:
    if environment_factory is None:
        return []
    return list(environment_factory.values()) if isinstance(environment_factory, dict) else [environment_factory]


def check_sources(args: Any, reward_funcs: Any, train_dataset: Any, environment_factory: Any) -> None:
    """TRL's checks of where a run's rewards and prompts come from (ConfigError, a ValueError, as TRL raises):
    a reward (reward_funcs, or an environment whose class has get_reward); a train_dataset, unless an
    environment owns the data (one environment, not a dict of them, and max_steps > 0 to end the run)."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    owned = any(callable(getattr(f, "get_reward", None)) for f in _factories(environment_factory))
    if not [f for f in funcs if f is not None] and not owned:
        raise ConfigError(
            "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment "
            "defines a `get_reward` method."
        )
    if train_dataset is not None:
        return
    if environment_factory is None:
        raise ConfigError("`train_dataset` is required unless an `environment_factory` is provided.")
    if isinstance(environment_factory, dict):
        raise ConfigError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
            "`environment` column to route each example to its environment; give a dataset, or one environment"
        )
    if int(getattr(args, "max_steps", -1)) <= 0:
        raise ConfigError(
            "When training without a `train_dataset` (the environment owns the data and returns the prompt from "
            "`reset()`), `max_steps` must be set to a positive value to define the training length: "
            "GRPOConfig(max_steps=N)"
        )


def warn_sequence_level(args: Any) -> None:
    """TRL's warning: a sequence-level ratio (GSPO) under a loss type that sums per-token terms weights each
    sequence by its completion length instead of the per-sequence objective."""
    loss_type = value_of(getattr(args, "loss_type", "dapo"))
    if value_of(getattr(args, "importance_sampling_level", "token")) == "sequence" and loss_type in TOKEN_SUMMED:
        log.warning(
            "importance_sampling_level='sequence' with loss_type=%r: the loss sums per-token contributions, which "
            "weights each sequence by its completion length instead of optimizing the per-sequence objective; "
            "loss_type='grpo' is the GSPO paper's setup",
            loss_type,
        )


def reward_func_name(spec: dict) -> str:
    """TRL's name of a reward function: a model's label (the last part of its name or directory), a
    function's __name__, a grpolab reward's name."""
    if spec.get("label"):
        return str(spec["label"])
    fn = spec["name"]
    return fn if isinstance(fn, str) else str(getattr(fn, "__name__", type(fn).__name__))


def reward_weight_tensor(weights: list[float]):
    """TRL's trainer.reward_weights: a float32 tensor, one weight per reward function."""
    import torch

    return torch.tensor([float(w) for w in weights], dtype=torch.float32)


def environment_rewards(environment_factory: Any) -> list[tuple[str, Any]]:
    """TRL's reward columns of environments that own their reward: (the class's name, a reward function
    (environments=[...]) -> each instance's get_reward(), None for an instance of another class), one per
    class with get_reward, in the order the factory names them, a class named twice counted once. grpolab
    scores them as one reward, env (weight env.reward_weight, 1 as in TRL): the same total, since each
    rollout has one environment."""
    out: list[tuple[str, Any]] = []
    seen: set = set()
    for cls in _factories(environment_factory):
        if id(cls) in seen or not callable(getattr(cls, "get_reward", None)):
            continue
        seen.add(id(cls))

        def reward(environments=(), _cls=cls, **_):
            return [env.get_reward() if isinstance(env, _cls) else None for env in environments]

        reward.__name__ = getattr(cls, "__name__", "environment")
        out.append((reward.__name__, reward))
    return out


def environment_tools(environment_factory: Any, tools: Any) -> list:
    """TRL's trainer.tools: the tools given, then (one environment class) its public methods but reset and
    get_reward, the tools each rollout's instance offers."""
    from grpolab.env.adapters import tool_method_names

    given = [] if tools is None else list(tools) if isinstance(tools, (list, tuple)) else [tools]
    if (
        environment_factory is None
        or isinstance(environment_factory, dict)
        or not isinstance(environment_factory, type)
    ):
        return given
    return given + [getattr(environment_factory, n) for n in tool_method_names(environment_factory)]


def stream_loader_settings(args: Any) -> None:
    """TRL's settings for a streaming train_dataset: accelerate's dispatch_batches off (each process reads
    its own share of the stream; refused when set on) and one data-loader worker (several would interleave
    the stream and split a prompt's group). grpolab reads the stream in its own process either way."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    ac = getattr(args, "accelerator_config", None)
    if isinstance(ac, dict):
        ac = AcceleratorConfig(**ac)
    elif not hasattr(ac, "dispatch_batches"):
        ac = AcceleratorConfig()
    if ac.dispatch_batches:
        raise ConfigError("Iterable datasets require `dispatch_batches=False` in accelerator_config")
    ac.dispatch_batches = False
    args.accelerator_config = ac
    args.dataloader_num_workers = 0


def router_aux_loss(model: Any, args: Any) -> tuple[bool, float]:
    """TRL's (aux_loss_enabled, router_aux_loss_coef): whether the update adds the router's load-balancing loss
    (a mixture of experts that returns its router logits, with a coefficient other than 0) and the coefficient
    (args.router_aux_loss_coef, else the model config's; grpolab.model.moe.router_aux_of). A coefficient other
    than 0 on a model without routers: ConfigError (a ValueError, as TRL raises)."""
    from grpolab.model.moe import router_aux_of, text_config

    coef = getattr(args, "router_aux_loss_coef", None)
    aux = router_aux_of(model, coef)
    if aux is not None:
        return True, aux.coef
    return False, float(getattr(text_config(model), "router_aux_loss_coef", 0.0) if coef is None else coef)


__all__ = [
    "check_sources",
    "environment_rewards",
    "environment_tools",
    "reward_func_name",
    "reward_weight_tensor",
    "router_aux_loss",
    "stream_loader_settings",
    "warn_sequence_level",
]
