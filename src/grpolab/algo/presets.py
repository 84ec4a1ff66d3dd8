"""Algorithm settings: which advantage estimator, objective, aggregation and KL each method uses.

The training step reads only an `AlgoConfig`; presets (`ALGOS["grpo"]`, ...) fill it in, and
`resolve_algo(name, overrides, choices=...)` builds a validated one (preset first, then the recipe's
overrides).

This module is a leaf: it imports nothing of grpolab but `grpolab.util.fields`, and no torch. Every
string-valued choice names an entry of a registry that lives with its maths:

    advantage    -> grpolab.algo.advantages.ADVANTAGES   (+ "gae": grpolab.model.critic, from a value model)
    adv_scale    -> grpolab.algo.advantages.ADV_SCALES
    objective    -> grpolab.algo.losses.OBJECTIVES
    aggregation  -> grpolab.algo.losses.AGGREGATIONS
    kl_estimator -> grpolab.algo.kl.KL_ESTIMATORS
    reward_aggregation -> grpolab.algo.advantages.REWARD_AGGREGATIONS

so the allowed names are passed in (`choices`, built by `grpolab.training.config.algo_choices()` from those
registries) instead of imported here.

docs/algorithms.md holds the equations and the papers; each recipes/<name>.yaml says, numbered, where
it departs from its paper.
"""

from __future__ import annotations

import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from grpolab.util.fields import ConfigError, coerce_field

KlPlacement = Literal["in_loss", "in_reward"]
"""Where the KL term goes; a choice of this module (not a registry): in_loss is grpolab.algo.losses, in_reward
is grpolab.algo.shaping."""
KL_PLACEMENTS: tuple[str, ...] = typing.get_args(KlPlacement)


@dataclass
class AlgoConfig:
    """Settings of the policy-gradient method (the `algo.*` keys of a recipe)."""

    name: str = "grpo"
    """Preset name, one of ALGOS: grpo, dr_grpo, dapo, gspo, cispo, rloo, reinforce, ppo, sapo, luspo, vespo."""

    # --- advantage -------------------------------------------------------------------------------
    advantage: str = "group_zscore"
    """Advantage estimator (grpolab.algo.advantages.ADVANTAGES, or gae): none (REINFORCE, A = r),
    batch_mean (A = r - mean_batch r), rloo (A = r - mean of the other G-1 rewards), group_mean
    (Dr. GRPO: A = r - mean_G r), group_zscore (GRPO: (r - mean_G r) / (std_G r + adv_eps)),
    gae (PPO: per-token GAE(gamma, lam) from a critic; needs uses_critic)."""
    adv_scale: str = "none"
    """Extra scaling after the estimator: none, group_std (divide by std_G r + adv_eps), batch_std
    (divide by the batch std + adv_eps; for per-token GAE advantages: whiten over valid tokens, as
    PPO implementations do). group_zscore already divides by the group std, so it takes none."""
    adv_eps: float = 1e-4
    """eps in the group z-score denominator, guards against std = 0."""

    # --- objective -------------------------------------------------------------------------------
    objective: str = "clipped"
    """Policy objective (grpolab.algo.losses.OBJECTIVES): pg (unclipped IS surrogate; REINFORCE when
    on-policy), clipped (PPO/GRPO/DAPO surrogate), gspo (sequence-level ratio, clipped per
    sequence), cispo (clipped, detached importance weight times log-prob; cispo_seq: the weight of the
    sequence's ratio, TRL's cispo at importance_sampling_level="sequence"), sapo (soft sigmoid gate
    of the ratio), vespo (detached Gamma weight of the sequence ratio times log-prob)."""
    aggregation: str = "seq_mean"
    """How per-token losses become one number (grpolab.algo.losses.AGGREGATIONS): seq_mean (GRPO
    paper: mean over sequences of the mean over tokens), token_mean (DAPO: sum over all tokens /
    tokens in the batch), token_sum_norm (Dr. GRPO: sum over tokens / (sequences * max_len)),
    seq_sum (REINFORCE/RLOO: sum over tokens = log-prob of the whole sequence, mean over sequences)."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 - eps_low (>= 1 means no lower bound)."""
    eps_high: float = 0.2
    """Upper clip range: the ratio is clipped at 1 + eps_high (DAPO clip-higher uses 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 (Ye et al. 2020): for A < 0 the loss is bounded by -c * A, so a
    huge ratio on a bad token cannot blow up the update. None: off. Only for objective clipped."""
    mu: int = 1
    """Inner policy updates per rollout batch (mu in the GRPO paper); >1 needs old log-probs."""

    # --- KL to the reference ---------------------------------------------------------------------
    beta: float = 0.0
    """Weight of the KL penalty to the frozen reference; 0 keeps no reference model at all."""
    kl_estimator: str = "k3"
    """Per-token KL estimator (grpolab.algo.kl.KL_ESTIMATORS), lr = log pi_ref - log pi_theta:
    k1 = -lr, k2 = lr^2 / 2, k3 = exp(lr) - lr - 1 (unbiased and >= 0)."""
    kl_placement: KlPlacement = "in_loss"
    """Where the KL goes: in_loss (GRPO: + beta * k per token in the loss) or in_reward
    (PPO-RLHF: r - beta * sum_t k_t before the advantages; grpolab.algo.shaping.kl_token_penalty).
    Read it as the properties kl_in_loss / kl_in_reward."""
    adaptive_kl: bool = False
    """Adapt beta towards kl_target with the proportional controller of Ziegler et al. 2019
    (grpolab.algo.kl.AdaptiveKL); False keeps beta fixed."""
    kl_target: float = 0.01
    """Target of the adaptive controller, in the units the trainer feeds it (the "kl" metric: mean
    per-token KL over valid tokens)."""
    kl_horizon: int = 10000
    """Horizon H of the adaptive controller: beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / H."""
    kl_ratio_weight: bool = False
    """Weight the KL term of the loss by the token's importance ratio, beta * rho_it * k_t with rho_it =
    exp(logp - old_logp) differentiable (TRL's use_bias_correction_kl, its default): on-policy its value
    is unchanged and its gradient gains beta * k_t * grad log pi_theta. Only with kl_placement in_loss."""

    # --- DAPO ------------------------------------------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose G rewards are all equal (zero advantage, no
    gradient) and sample more prompts to refill the batch (grpolab.algo.shaping.informative_groups, used by
    grpolab.training.step.collect)."""
    max_resample_rounds: int = 3
    """Bound on the extra sampling rounds dynamic sampling may spend refilling one batch; after it
    the step trains on what it has."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: length of the buffer L_cache (tokens) before max_len in which
    the penalty grows linearly from 0 to -overlong_penalty; 0 = off. Must not exceed max_new_tokens;
    DAPO used 20% of the limit (4096 of 20480 tokens)."""
    overlong_penalty: float = 1.0
    """Magnitude of the overlong punishment at max_len (DAPO: 1.0); added as a negative reward."""

    # --- PPO critic ------------------------------------------------------------------------------
    uses_critic: bool = False
    """Train a value model (grpolab.model.critic.ValueModel) next to the policy: PPO. Requires advantage gae."""
    gamma: float = 1.0
    """GAE discount gamma over completion tokens (1.0: the terminal reward is not discounted)."""
    lam: float = 0.95
    """GAE lambda: 0 = one-step TD (low variance, biased by V), 1 = Monte-Carlo return minus V."""
    vf_coef: float = 0.1
    """Weight of the value loss; the trainer backpropagates vf_coef * value_loss into the critic."""
    critic_lr: float | None = None
    """Learning rate of the critic's own optimiser; None: the policy's learning rate."""
    value_clip: float | None = 0.2
    """Clip the value update to old_values +- value_clip (PPO2 value clipping); None: off."""

    # --- options of TRL 1.16's GRPOConfig (docs/algorithms.md) ----------------------------------------
    steps_per_generation: int = 1
    """Optimizer updates per rollout batch per epoch: the batch's prompt groups are split into this many
    equal parts, each one AdamW update (each of the algo.mu epochs goes through every part), so a
    rollout serves mu * steps_per_generation updates. log pi_old is the policy that sampled, for every
    part. TRL's steps_per_generation counts micro-batches: it is TRL's steps_per_generation /
    gradient_accumulation_steps here, with batch_size = TRL's generation_batch_size. Must divide the
    prompts per step (batch_size / G)."""
    mask_truncated_completions: bool = False
    """Leave the completions that hit the length limit out of the loss (DAPO; TRL's
    mask_truncated_completions): their tokens get mask 0, so they add no policy, KL or entropy term
    and no token to token_mean's count; they still count in their group's advantages and in the
    sequence count n_seq of seq_mean, token_sum_norm and seq_sum (as in TRL)."""
    entropy_coef: float = 0.0
    """Entropy bonus: loss - entropy_coef * H, H the mean per-token entropy of the policy over the
    batch's completion tokens, whatever the aggregation (TRL 1.16's entropy_coef); 0: off. The policy
    pass then keeps the entropy's gradient."""
    sync_ref_model: bool = False
    """TR-DPO reference update (Gorbatovski et al. 2024; TRL's sync_ref_model): every
    sync_ref_model_steps optimizer updates, pi_ref <- alpha pi_theta + (1 - alpha) pi_ref,
    parameter by parameter. Needs a reference (beta > 0) held as its own copy (not with LoRA)."""
    sync_ref_model_alpha: float = 0.6
    """alpha of the reference update, in (0, 1] (TRL's ref_model_mixup_alpha; 1 copies the policy)."""
    sync_ref_model_steps: int = 512
    """Optimizer updates between reference updates (TRL's ref_model_sync_steps)."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature tau for tokens with A > 0 (objective sapo; Gao et al. 2025)."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature tau for tokens with A <= 0 (objective sapo)."""
    vespo_k_pos: float = 2.0
    """VESPO power k for A >= 0: phi(w) = exp(lambda + k log w - lambda w) (objective vespo)."""
    vespo_lambda_pos: float = 3.0
    """VESPO decay lambda for A >= 0 (objective vespo)."""
    vespo_k_neg: float = 3.0
    """VESPO power k for A < 0 (objective vespo)."""
    vespo_lambda_neg: float = 2.0
    """VESPO decay lambda for A < 0 (objective vespo)."""
    reward_aggregation: str = "sum_then_normalize"
    """How several reward functions make one reward (grpolab.algo.advantages.REWARD_AGGREGATIONS):
    sum_then_normalize (the weighted sum, then the advantage) or normalize_then_sum (GDPO: each function's
    reward z-scored in its group first, then the weighted sum; TRL's multi_objective_aggregation)."""
    top_entropy_quantile: float = 1.0
    """rho of "Beyond the 80/20 Rule" (Wang et al. 2025): the policy term keeps only the tokens whose entropy
    is in the top rho quantile of the micro-batch's tokens (grpolab.algo.masks.high_entropy_mask); 1.0: every
    token. In (0, 1]; 0 keeps the highest-entropy token(s) only."""
    off_policy_mask: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask threshold delta (grpolab.algo.masks.off_policy_mask): a
    sequence with A < 0 whose mean log(pi_sampler / pi_theta) over its tokens exceeds delta adds no policy
    term; None: off (TRL's off_policy_mask_threshold)."""
    adaptive_entropy: bool = False
    """Skywork-OR1's adaptive entropy control (grpolab.algo.entropy.AdaptiveEntropy): entropy_coef is the
    starting coefficient, moved by entropy_coef_delta each optimizer update towards keeping the entropy at
    entropy_target, and applied only while the last measured entropy is at or below it (TRL's
    use_adaptive_entropy)."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive entropy coefficient."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive entropy coefficient."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive entropy coefficient per optimizer update."""
    entropy_target: float = 0.2
    """Target mean token entropy (nats) of the adaptive entropy control, measured over the tokens the policy
    term reads (the high-entropy ones with top_entropy_quantile < 1)."""
    router_aux_loss_coef: float | None = None
    """Weight c of a mixture-of-experts model's router load-balancing loss (Switch Transformer's aux,
    grpolab.algo.router): each micro-batch adds c * aux / micro-batches (TRL 1.16's router_aux_loss_coef).
    null: the model config's router_aux_loss_coef where the model returns router logits (Mixtral, Qwen2-MoE,
    Qwen3-MoE, ...), else 0; 0: off. Dense models: nothing asked, nothing computed (another value is an error)."""

    @property
    def kl_in_loss(self) -> bool:
        """The KL term is added to the loss, beta * k_t per token (kl_placement in_loss; grpolab.algo.losses)."""
        return self.kl_placement == "in_loss"

    @property
    def kl_in_reward(self) -> bool:
        """The KL term is subtracted from the reward (kl_placement in_reward; grpolab.algo.shaping)."""
        return self.kl_placement == "in_reward"


ALGOS: dict[str, dict] = {
    # DeepSeekMath (Shao et al. 2024), sec. 4.1: group z-score, clipped surrogate eps 0.2, mean over
    # tokens then sequences, KL in the loss with k3 and beta 0.04, one update per rollout.
    "grpo": {
        "advantage": "group_zscore",
        "adv_scale": "none",
        "objective": "clipped",
        "aggregation": "seq_mean",
        "eps_low": 0.2,
        "eps_high": 0.2,
        "beta": 0.04,
        "kl_estimator": "k3",
        "kl_placement": "in_loss",
        "mu": 1,
    },
    # Understanding R1-Zero-Like Training (Liu et al. 2025): no std, no length normalisation, no KL.
    "dr_grpo": {"advantage": "group_mean", "aggregation": "token_sum_norm"},
    # DAPO (Yu et al. 2025): clip-higher, token-level loss, dynamic sampling, overlong shaping, no KL.
    "dapo": {
        "aggregation": "token_mean",
        "eps_low": 0.2,
        "eps_high": 0.28,
        "dynamic_sampling": True,
        "overlong_buffer": 6,  # 20% of the default max_new_tokens = 32, as 4096 of 20480 in the paper
        "overlong_penalty": 1.0,
    },
    # GSPO (Zheng et al. 2025): sequence-level geometric-mean ratio, clip ranges 3e-4 / 4e-4, no KL.
    "gspo": {"objective": "gspo", "aggregation": "seq_mean", "eps_low": 3e-4, "eps_high": 4e-4},
    # MiniMax-M1 (2025) CISPO: clipped detached IS weight, token-level mean, no lower bound.
    "cispo": {"objective": "cispo", "aggregation": "token_mean", "eps_low": 1.0, "eps_high": 3.0},
    # Back to Basics (Ahmadian et al. 2024): RLOO baseline, plain REINFORCE on whole sequences,
    # KL placed in the reward as the sequence log-ratio (sum of k1).
    "rloo": {
        "advantage": "rloo",
        "objective": "pg",
        "aggregation": "seq_sum",
        "kl_estimator": "k1",
        "kl_placement": "in_reward",
    },
    # Williams (1992): A = r, no baseline.
    "reinforce": {"advantage": "none", "objective": "pg", "aggregation": "seq_sum"},
    # PPO (Schulman et al. 2017) as used for LMs (Ziegler et al. 2019; Ouyang et al. 2022): critic,
    # GAE, whitened advantages, clipped surrogate and value loss, KL in the reward, several epochs.
    "ppo": {
        "advantage": "gae",
        "adv_scale": "batch_std",
        "aggregation": "token_mean",
        "uses_critic": True,
        "gamma": 1.0,
        "lam": 0.95,
        "vf_coef": 0.1,
        "value_clip": 0.2,
        "beta": 0.05,
        "kl_estimator": "k1",
        "kl_placement": "in_reward",
        "mu": 4,
    },
    # SAPO (Gao et al. 2025), as TRL 1.16's loss_type "sapo": a soft temperature gate instead of the clip,
    # mean over tokens then sequences.
    "sapo": {"objective": "sapo", "aggregation": "seq_mean", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
    # LUSPO (arXiv 2602.05261), as TRL 1.16's loss_type "luspo": GSPO's clipped sequence ratio with each
    # sequence's loss scaled by its length, i.e. summed over its tokens, then the mean over sequences.
    "luspo": {"objective": "gspo", "aggregation": "seq_sum", "eps_low": 3e-4, "eps_high": 4e-4},
    # VESPO (arXiv 2602.10693), as TRL 1.16's loss_type "vespo": a detached Gamma weight of the sequence
    # ratio instead of the clip, token-level mean.
    "vespo": {"objective": "vespo", "aggregation": "token_mean"},
}
"""Presets: name -> overrides of the AlgoConfig defaults. recipes/<name>.yaml name one and add only departures."""


def _field_types() -> dict[str, object]:
    return typing.get_type_hints(AlgoConfig, include_extras=True)


def _one_of(key: str, value: str, allowed: Collection[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"algo.{key}: unknown value {value!r}; allowed: {', '.join(sorted(allowed))}")


def check_choices(cfg: AlgoConfig, choices: Mapping[str, Collection[str]]) -> AlgoConfig:
    """Raise ConfigError naming the key when a string setting names no registered function.

    choices: field -> allowed names, e.g. {"objective": OBJECTIVES, ...} (grpolab.training.config.algo_choices).
    """
    for key, allowed in choices.items():
        _one_of(key, getattr(cfg, key), allowed)
    return cfg


def validate_algo(cfg: AlgoConfig) -> AlgoConfig:
    """Raise ConfigError naming the key when a value is impossible or two settings contradict."""
    _one_of("name", cfg.name, ALGOS)

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"algo.{key}: {what}, got {getattr(cfg, key)!r}")

    need(cfg.eps_low >= 0, "eps_low", "must be >= 0 (the ratio is clipped at 1 - eps_low)")
    if cfg.objective in ("cispo", "cispo_seq"):  # the weight's cap 1 + eps_high may be below 1 (TRL's at < 1)
        need(cfg.eps_high > -1, "eps_high", "must be > -1 for cispo (the weight is capped at 1 + eps_high > 0)")
    else:
        need(cfg.eps_high >= 0, "eps_high", "must be >= 0 (the ratio is clipped at 1 + eps_high)")
    need(cfg.dual_clip is None or cfg.dual_clip > 1, "dual_clip", "must be null or a constant > 1")
    need(cfg.mu >= 1, "mu", "must be >= 1 (policy updates per rollout batch)")
    need(cfg.adv_eps > 0, "adv_eps", "must be > 0 (it guards the std denominator)")
    need(cfg.beta >= 0, "beta", "must be >= 0")
    need(cfg.kl_target > 0, "kl_target", "must be > 0")
    need(cfg.kl_horizon >= 1, "kl_horizon", "must be >= 1")
    need(cfg.max_resample_rounds >= 0, "max_resample_rounds", "must be >= 0")
    need(cfg.overlong_buffer >= 0, "overlong_buffer", "must be >= 0 tokens (0 = off)")
    need(cfg.overlong_penalty >= 0, "overlong_penalty", "must be >= 0 (its magnitude; the reward gets -penalty)")
    need(0 <= cfg.gamma <= 1, "gamma", "must be in [0, 1]")
    need(0 <= cfg.lam <= 1, "lam", "must be in [0, 1]")
    need(cfg.vf_coef > 0, "vf_coef", "must be > 0")
    need(cfg.critic_lr is None or cfg.critic_lr > 0, "critic_lr", "must be null or > 0")
    need(cfg.value_clip is None or cfg.value_clip > 0, "value_clip", "must be null or > 0")
    need(cfg.steps_per_generation >= 1, "steps_per_generation", "must be >= 1 (optimizer updates per rollout batch)")
    need(0 < cfg.sync_ref_model_alpha <= 1, "sync_ref_model_alpha", "must be in (0, 1]")
    need(cfg.sync_ref_model_steps >= 1, "sync_ref_model_steps", "must be >= 1 optimizer updates")
    need(cfg.sapo_temperature_pos > 0, "sapo_temperature_pos", "must be > 0")
    need(cfg.sapo_temperature_neg > 0, "sapo_temperature_neg", "must be > 0")
    for key in ("vespo_k_pos", "vespo_k_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        need(getattr(cfg, key) >= 0, key, "must be >= 0")
    need(0 <= cfg.top_entropy_quantile <= 1, "top_entropy_quantile", "must be in [0, 1] (1: every token)")
    need(cfg.off_policy_mask is None or cfg.off_policy_mask >= 0, "off_policy_mask", "must be null or >= 0")
    need(cfg.entropy_coef_delta >= 0, "entropy_coef_delta", "must be >= 0")
    need(
        cfg.entropy_coef_min <= cfg.entropy_coef_max,
        "entropy_coef_min",
        f"must be <= entropy_coef_max ({cfg.entropy_coef_max})",
    )

    # Contradictions between settings.
    if cfg.advantage == "gae" and not cfg.uses_critic:
        raise ConfigError("algo.advantage: gae needs a critic; set algo.uses_critic: true (or use algo=ppo)")
    if cfg.uses_critic and cfg.advantage != "gae":
        raise ConfigError(f"algo.uses_critic: a critic is only used by advantage gae, got advantage {cfg.advantage!r}")
    if cfg.advantage.startswith("group_zscore") and cfg.adv_scale != "none":
        raise ConfigError("algo.adv_scale: group_zscore already divides by the group std; allowed with it: none")
    if cfg.advantage == "gae" and cfg.adv_scale == "group_std":
        raise ConfigError("algo.adv_scale: per-token gae advantages have no group; allowed with gae: none, batch_std")
    if cfg.dual_clip is not None and cfg.objective != "clipped":
        raise ConfigError(f"algo.dual_clip: only the clipped objective has a dual clip, objective is {cfg.objective!r}")
    if cfg.adaptive_kl and cfg.beta <= 0:
        raise ConfigError("algo.adaptive_kl: needs an initial beta > 0 to adapt")
    if cfg.sync_ref_model and cfg.beta <= 0:
        raise ConfigError(
            "algo.sync_ref_model: beta is 0, so there is no reference to update; set algo.beta > 0 "
            "or algo.sync_ref_model: false"
        )
    return cfg


def resolve_algo(
    name: str, overrides: dict | None = None, *, choices: Mapping[str, Collection[str]] | None = None
) -> AlgoConfig:
    """AlgoConfig for preset `name` with `overrides` (a mapping of field -> value) applied on top.

    Unknown preset, unknown field, wrong type or impossible value -> ConfigError naming the key
    ("algo.eps_high: ...") and what is allowed. With `choices` (field -> registered names), a name
    that no registry holds is such an error too; without, it surfaces when the registry is read.
    """
    if name not in ALGOS:
        raise ConfigError(f"algo.name: unknown algorithm {name!r}; known: {', '.join(sorted(ALGOS))}")
    overrides = dict(overrides or {})
    if overrides.get("name", name) != name:
        raise ConfigError(f"algo.name: preset is {name!r} but the overrides say {overrides['name']!r}")
    overrides.pop("name", None)
    types = _field_types()
    values: dict[str, object] = {"name": name}
    for source in (ALGOS[name], overrides):
        for key, value in source.items():
            if key not in types:
                raise ConfigError(f"algo.{key}: unknown key; known keys: {', '.join(sorted(types))}")
            values[key] = coerce_field(f"algo.{key}", value, types[key])
    cfg = AlgoConfig(**values)
    if choices is not None:
        check_choices(cfg, choices)
    return validate_algo(cfg)


__all__ = ["ALGOS", "AlgoConfig", "KL_PLACEMENTS", "KlPlacement", "check_choices", "resolve_algo", "validate_algo"]
