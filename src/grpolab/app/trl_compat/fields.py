"""The mapping table: every field of TRL 1.16's GRPOConfig, in TRL's order, with TRL's default and what it
becomes in grpolab (grpolab.app.trl_compat.entries for the kinds). Part 1, the fields TRL inherits from
transformers' TrainingArguments, is grpolab.app.trl_compat.fields_hf; this module holds GRPO's own and
TABLE, the whole. docs/migrating-from-trl.md is generated from TABLE (grpolab.app.trl_compat.docs).

The policy loss: TRL's loss_type names an objective and an aggregation of grpolab's registries
(grpolab.algo.losses), scale_rewards an advantage (grpolab.algo.advantages):

    loss_type   objective   aggregation       TRL's normaliser
    grpo        clipped     seq_mean          mean over sequences of the mean over tokens
    bnpo        clipped     token_mean        tokens of the micro-batch (= of the batch with one micro-batch)
    dr_grpo     clipped     token_sum_norm    sequences x max_completion_length
    dapo        clipped     token_mean        tokens of the whole batch
    luspo       clipped     seq_sum           sum over tokens, mean over sequences
    cispo       cispo       token_mean        tokens of the whole batch; ratio clipped at epsilon_high
    sapo        sapo        seq_mean          mean over sequences of the mean over tokens
    vespo       vespo       token_mean        tokens of the whole batch

importance_sampling_level='sequence' makes the clipped objective grpolab's gspo (the sequence ratio).
"""

from __future__ import annotations

import json

from grpolab.app.trl_compat.entries import Entry, config_has, fail, ignore, refuse, same, to, value_of
from grpolab.app.trl_compat.fields_hf import TRAINING_ARGUMENTS, _batch
from grpolab.app.trl_compat.fields_model import model_init_kwargs
from grpolab.app.trl_compat.fields_run import CONTINUOUS_BATCHING, CONTINUOUS_BATCHING_CONFIG, TRANSFORMERS_PAGED

LOSS_TYPES = {
    "grpo": ("clipped", "seq_mean"),
    "bnpo": ("clipped", "token_mean"),
    "dr_grpo": ("clipped", "token_sum_norm"),
    "dapo": ("clipped", "token_mean"),
    "luspo": ("clipped", "seq_sum"),
    "cispo": ("cispo", "token_mean"),
    "sapo": ("sapo", "seq_mean"),
    "vespo": ("vespo", "token_mean"),
}
"""TRL loss_type -> (grpolab objective, aggregation)."""

SCALE_REWARDS = {
    "group": ("group_zscore_unbiased", "none"),
    "batch": ("group_mean", "batch_std_unbiased"),
    "none": ("group_mean", "none"),
}
"""TRL scale_rewards -> (grpolab advantage, adv_scale): TRL divides by the Bessel-corrected std (+ 1e-4)."""

VLLM_CORRECTION = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
VLLM_ONLY = "read by TRL's vLLM server mode only, which grpolab does not have (vllm_mode='colocate' only)"


def _loss_type(v, a) -> dict:
    from grpolab.algo.losses import OBJECTIVES

    if v not in LOSS_TYPES:
        raise fail("loss_type", v, f"TRL's loss types are {', '.join(LOSS_TYPES)}")
    objective, aggregation = LOSS_TYPES[v]
    if objective not in OBJECTIVES:
        raise fail(
            "loss_type",
            v,
            f"this version of grpolab has no {objective} objective (algo.objective: {', '.join(sorted(OBJECTIVES))})",
        )
    low = float(a["epsilon"])
    high = float(a["epsilon"] if a["epsilon_high"] is None else a["epsilon_high"])
    sequence = value_of(a["importance_sampling_level"]) == "sequence"
    out = {"algo.aggregation": aggregation, "algo.eps_low": low, "algo.eps_high": high}
    if objective == "clipped":
        out["algo.objective"] = "gspo" if sequence else "clipped"
    elif objective == "cispo":
        out["algo.objective"] = "cispo_seq" if sequence else "cispo"
    elif sequence:
        raise fail(
            "importance_sampling_level",
            "sequence",
            f"TRL's sequence-level ratio goes with the clipped loss types and cispo; loss_type={v!r} is not one",
        )
    else:
        out["algo.objective"] = objective
    if objective == "cispo":  # TRL: w = sg(min(rho, epsilon_high)), no lower bound (a cap below 1 too)
        out.update({"algo.eps_low": 1.0, "algo.eps_high": high - 1.0})
    return out


def _scale_rewards(v, a) -> dict:
    v = {True: "group", False: "none"}.get(v, v)
    if v not in SCALE_REWARDS:
        raise fail("scale_rewards", v, "TRL's choices are 'group' (True), 'batch' and 'none' (False)")
    if a.get("multi_objective_aggregation") == "normalize_then_sum":  # TRL then normalises over the batch
        return {}
    advantage, scale = SCALE_REWARDS[v]
    return {"algo.advantage": advantage, "algo.adv_scale": scale}


def _reward_aggregation(v, a) -> dict:
    """TRL's multi_objective_aggregation: normalize_then_sum (GDPO) z-scores each reward in its group, sums
    them, then normalises the sum over the batch (TRL ignores scale_rewards there)."""
    if v not in ("sum_then_normalize", "normalize_then_sum"):
        raise fail("multi_objective_aggregation", v, "TRL's choices are 'sum_then_normalize' and 'normalize_then_sum'")
    if v == "sum_then_normalize":
        return {"algo.reward_aggregation": v}
    return {"algo.reward_aggregation": v, "algo.advantage": "batch_mean", "algo.adv_scale": "batch_std_unbiased"}


def _completion_length(v, a) -> dict:
    if v is None or int(v) < 1:
        raise fail("max_completion_length", v, "grpolab needs a completion length limit (tokens, >= 1)")
    return {"max_new_tokens": int(v)}


def _vllm_correction(v, a) -> dict:
    if not v:
        return {"rollout.correction": "none"}
    mode = value_of(a["vllm_importance_sampling_mode"])
    if mode not in VLLM_CORRECTION:
        raise fail("vllm_importance_sampling_mode", mode, f"grpolab's corrections are {', '.join(VLLM_CORRECTION)}")
    cap = a.get("vllm_importance_sampling_cap")
    cap = cap if cap is not None else a["vllm_importance_sampling_clip_max"]
    low = a.get("vllm_importance_sampling_clip_min")
    return {
        "rollout.correction": mode,
        "rollout.correction_clip": float("inf") if cap is None else float(cap),  # None: no upper bound
        "rollout.correction_clip_min": None if low is None else float(low),
    }


def _tool_iterations(v, a) -> dict:
    return {} if v is None else {"env.max_turns": int(v) + 1}


def _eval_generations(v, a) -> dict:
    """TRL evaluates num_generations_eval (None: num_generations) completions per prompt, sampled at the
    training temperature."""
    n = int(a["num_generations"] if v is None else v)
    if n < 1:
        raise fail("num_generations_eval", v, "must be >= 1 (None: num_generations)")
    return {"eval_num_generations": n, "eval_temperature": float(a["temperature"])}


def _kwargs(name: str, path: str):
    """A dict option: None -> {}; a JSON string (TRL's command line) -> its dict."""

    def convert(v, a) -> dict:
        if v is None:
            return {path: {}}
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as e:
                raise fail(name, v, f"not a JSON object ({e})") from e
        if not isinstance(v, dict):
            raise fail(name, v, "expected a dict (or its JSON text)")
        return {path: dict(v)}

    return convert


GRPO_FIELDS: list[Entry] = [
    same("learning_rate", "lr", 1e-06),  # GRPOConfig re-declares it; one entry per name, see TABLE
    Entry(
        "model_init_kwargs",
        None,
        "map",
        "precision",
        model_init_kwargs,
        "dtype bfloat16 -> precision=bf16, float16 -> precision=fp16 (weights stay fp32), float32 / auto -> as bf16 says; "
        "attn_implementation, revision, device_map accepted with a note; trust_remote_code=True and "
        "other keys refused (grpolab.app.trl_compat.fields_model).",
    ),
    refuse(
        "trust_remote_code",
        False,
        "grpolab never runs code from a model directory (Llama, Qwen2, Mistral, ... as transformers ships "
        "them); with False a directory with custom code raises transformers' error, as in TRL",
    ),
    same(
        "router_aux_loss_coef",
        "algo.router_aux_loss_coef",
        None,
        "A mixture of experts' router load-balancing loss, c x aux per micro-batch / micro-batches (None: the model "
        "config's coefficient where the model returns router logits, else off; dense models: no cost; a value "
        "other than 0 on a dense model is an error, as in TRL).",
    ),
    ignore(
        "disable_dropout", False, "grpolab's supported model families (Llama, Qwen2, Mistral) have no active dropout"
    ),
    same(
        "cast_lm_head_to_fp32",
        "lm_head_fp32",
        False,
        "The LM head of the update and reference passes in fp32 under bf16 autocast (fp32 runs: no change).",
    ),
    ignore("remove_unused_columns", False, "(see above)"),
    same("num_generations", "G", 8, "Completions per prompt (the group)."),
    Entry(
        "num_generations_eval",
        None,
        "map",
        "eval_num_generations, eval_temperature",
        _eval_generations,
        "Completions sampled per evaluation prompt (None: num_generations), at the training temperature.",
    ),
    Entry("max_completion_length", 512, "map", "max_new_tokens", _completion_length),
    ignore("ds3_gather_for_generation", True, "a DeepSpeed ZeRO-3 option; grpolab has no DeepSpeed"),
    same("shuffle_dataset", "shuffle", True, "Each epoch in a new seeded order."),
    ignore("pad_to_multiple_of", "auto", "padding only shapes tensors (for Neuron compilation); no value changes"),
    Entry(
        "generation_batch_size",
        None,
        "map",
        "batch_size, algo.steps_per_generation",
        _batch,
        "Completions per generation: grpolab's batch_size (None: per_device_train_batch_size x steps_per_generation).",
    ),
    Entry(
        "steps_per_generation",
        None,
        "map",
        "algo.steps_per_generation, batch_size",
        _batch,
        "Micro-batches per generation (None: gradient_accumulation_steps, one generation per optimizer "
        "step): algo.steps_per_generation = this / gradient_accumulation_steps optimizer updates.",
    ),
    same("temperature", "temperature", 1.0),
    same("top_p", "top_p", 1.0),
    Entry("top_k", 0, "map", "top_k", to("top_k", lambda v: 0 if v is None else int(v)), "0 (or -1): off."),
    Entry("min_p", None, "map", "min_p", to("min_p", lambda v: 0.0 if v is None else float(v)), "None: off (0.0)."),
    Entry(
        "generation_kwargs",
        None,
        "map",
        "generation_kwargs",
        _kwargs("generation_kwargs", "generation_kwargs"),
        "temperature, top_p, top_k, min_p, repetition_penalty override the fields above; other keys go to "
        "vLLM's SamplingParams (use_vllm=True); the native engine refuses them by name.",
    ),
    Entry(
        "chat_template_kwargs",
        None,
        "map",
        "chat_template_kwargs",
        _kwargs("chat_template_kwargs", "chat_template_kwargs"),
        "Keyword arguments of apply_chat_template for every conversation (e.g. enable_thinking).",
    ),
    same("repetition_penalty", "repetition_penalty", 1.0, "1.0: off."),
    ignore(
        "cache_implementation",
        None,
        "the KV cache's layout in transformers' generate; grpolab decodes with its own cache, same tokens",
    ),
    Entry(
        "use_vllm",
        False,
        "map",
        "rollout.engine",
        to("rollout.engine", lambda v: "vllm" if v else "native"),
        "False: grpolab's own decode loop (native); True: vLLM in this process (the vllm extra).",
    ),
    Entry(
        "vllm_mode",
        "colocate",
        "map",
        "rollout.engine",
        lambda v, a: (
            {}
            if value_of(v) == "colocate"
            else (_ for _ in ()).throw(
                fail("vllm_mode", v, "grpolab runs vLLM in the training process (colocate); it has no server mode")
            )
        ),
        "colocate only.",
    ),
    same(
        "vllm_model_impl",
        "rollout.vllm_model_impl",
        "vllm",
        "vllm: vLLM's own implementation; transformers: its Transformers backend (transformers' modeling code "
        "with vLLM's attention and KV cache), LLM(model_impl=...) as TRL passes it. That backend decorates "
        "transformers' decoder class (LlamaModel, ...) in place for its compiler; grpolab keeps the decoration "
        "to vLLM's own instance, so the trainer's models of that class run as before (grpolab.engine.vllm_classes).",
    ),
    ignore("vllm_enable_sleep_mode", False, "grpolab releases vLLM's KV cache during every update by itself"),
    same(
        "vllm_structured_outputs_regex",
        "rollout.structured_outputs_regex",
        None,
        "use_vllm=True: every completion (training and evaluation) constrained to the regex by vLLM's structured "
        "outputs, StructuredOutputsParams(regex=...) in SamplingParams as TRL builds it; the native engine refuses "
        "it (only vLLM constrains decoding).",
    ),
    ignore("vllm_server_base_url", None, VLLM_ONLY),
    ignore("vllm_server_host", "0.0.0.0", VLLM_ONLY),
    ignore("vllm_server_port", 8000, VLLM_ONLY),
    ignore("vllm_server_timeout", 240.0, VLLM_ONLY),
    ignore("vllm_group_port", 51216, VLLM_ONLY),
    same("vllm_gpu_memory_utilization", "rollout.vllm_gpu_memory", 0.3),
    ignore("vllm_max_model_length", None, "grpolab sizes vLLM's context to the run (prompt + max_completion_length)"),
    same(
        "vllm_tensor_parallel_size",
        "rollout.vllm_tensor_parallel_size",
        1,
        "use_vllm=True under torchrun: the processes in groups of this many consecutive ranks, each group one vLLM "
        "sharded over them (external_launcher), every member's prompts gathered and generated together, as TRL's "
        "colocate mode; must divide the number of processes.",
    ),
    same("beta", "algo.beta", 0.0, "KL weight; 0 loads no reference model."),
    same("num_iterations", "algo.mu", 1, "Updates per generation batch."),
    Entry("epsilon", 0.2, "map", "algo.eps_low", lambda v, a: {}, "Read with loss_type: the lower clip (eps_low)."),
    Entry(
        "delta",
        None,
        "map",
        "algo.dual_clip",
        to("algo.dual_clip"),
        "TRL's upper bound on the unclipped ratio: for A < 0 the loss is at most delta x |A|, which is "
        "the dual clip (Ye et al. 2020); for A > 0 the PPO clip already bounds it when delta > 1 + epsilon_high.",
    ),
    Entry(
        "epsilon_high",
        None,
        "map",
        "algo.eps_high",
        lambda v, a: {},
        "Read with loss_type: the upper clip (None: epsilon); for cispo the ratio's cap.",
    ),
    same("sapo_temperature_neg", "algo.sapo_temperature_neg", 1.05, "Read by loss_type='sapo'."),
    same("sapo_temperature_pos", "algo.sapo_temperature_pos", 1.0, "Read by loss_type='sapo'."),
    same("vespo_k_pos", "algo.vespo_k_pos", 2.0, "Read by loss_type='vespo'."),
    same("vespo_lambda_pos", "algo.vespo_lambda_pos", 3.0, "Read by loss_type='vespo'."),
    same("vespo_k_neg", "algo.vespo_k_neg", 3.0, "Read by loss_type='vespo'."),
    same("vespo_lambda_neg", "algo.vespo_lambda_neg", 2.0, "Read by loss_type='vespo'."),
    Entry(
        "importance_sampling_level",
        "token",
        "map",
        "algo.objective",
        lambda v, a: {},
        "Read with loss_type: sequence makes the clipped objective gspo and cispo cispo_seq (the weight of the "
        "sequence's ratio).",
    ),
    Entry(
        "reward_weights",
        None,
        "map",
        "rewards[i].weight",
        lambda v, a: {},
        "One weight per reward function (GRPOTrainer applies them); None: 1 each.",
    ),
    Entry(
        "multi_objective_aggregation",
        "sum_then_normalize",
        "map",
        "algo.reward_aggregation, algo.advantage, algo.adv_scale",
        _reward_aggregation,
        "normalize_then_sum (GDPO): each reward z-scored in its group, the weighted sum normalised over the "
        "batch (scale_rewards is not read then).",
    ),
    Entry(
        "scale_rewards",
        "group",
        "map",
        "algo.advantage, algo.adv_scale",
        _scale_rewards,
        "group: (r - mean) / (std + 1e-4) per group, Bessel std as TRL; batch: the batch's std; none: Dr. GRPO.",
    ),
    Entry("loss_type", "dapo", "map", "algo.objective, algo.aggregation", _loss_type, "See the loss table above."),
    same(
        "mask_truncated_completions",
        "algo.mask_truncated_completions",
        False,
        "Completions cut at max_completion_length add nothing to the loss.",
    ),
    same(
        "sync_ref_model",
        "algo.sync_ref_model",
        False,
        "TR-DPO: every ref_model_sync_steps optimizer steps, ref <- alpha policy + (1 - alpha) ref; needs beta > 0.",
    ),
    same("ref_model_mixup_alpha", "algo.sync_ref_model_alpha", 0.6),
    same("ref_model_sync_steps", "algo.sync_ref_model_steps", 512, "Optimizer steps, as in TRL."),
    same(
        "top_entropy_quantile",
        "algo.top_entropy_quantile",
        1.0,
        "The policy term reads the top-rho entropy tokens of each micro-batch (Beyond the 80/20 Rule).",
    ),
    same("entropy_coef", "algo.entropy_coef", 0.0, "loss - entropy_coef x the mean token entropy, as TRL."),
    same(
        "use_adaptive_entropy",
        "algo.adaptive_entropy",
        False,
        "Skywork-OR1's control of entropy_coef, updated each optimizer step; saved in checkpoints.",
    ),
    same("entropy_coef_min", "algo.entropy_coef_min", 0.0, "Read with use_adaptive_entropy."),
    same("entropy_coef_max", "algo.entropy_coef_max", 1.0, "Read with use_adaptive_entropy."),
    same("entropy_coef_delta", "algo.entropy_coef_delta", 0.005, "Read with use_adaptive_entropy."),
    same("entropy_target", "algo.entropy_target", 0.2, "Read with use_adaptive_entropy."),
    Entry(
        "max_tool_calling_iterations",
        None,
        "map",
        "env.max_turns",
        _tool_iterations,
        "Tool-call rounds after the first turn: env.max_turns = this + 1; None keeps env.max_turns.",
    ),
    Entry(
        "vllm_importance_sampling_correction",
        True,
        "map",
        "rollout.correction",
        _vllm_correction,
        "With vLLM: the sampler/trainer correction (mode and clip below); False: none.",
    ),
    Entry(
        "vllm_importance_sampling_mode",
        "sequence_mask",
        "map",
        "rollout.correction",
        lambda v, a: {},
        "Read with vllm_importance_sampling_correction.",
    ),
    Entry(
        "vllm_importance_sampling_clip_max",
        3.0,
        "map",
        "rollout.correction_clip",
        lambda v, a: {},
        "Read with vllm_importance_sampling_correction.",
    ),
    Entry(
        "vllm_importance_sampling_clip_min",
        None,
        "map",
        "rollout.correction_clip_min",
        lambda v, a: {},
        "Read with vllm_importance_sampling_correction: the lower bound C_min.",
    ),
    same(
        "off_policy_mask_threshold",
        "algo.off_policy_mask",
        None,
        "DeepSeek-V3.2's off-policy sequence mask: A < 0 and mean log(pi_sampler / pi_theta) > threshold drop.",
    ),
    same(
        "use_bias_correction_kl",
        "algo.kl_ratio_weight",
        True,
        "The KL term times the (differentiable) importance ratio, as TRL; only with beta > 0.",
    ),
    ignore("log_completions", False, "grpolab writes samples_per_step completions of every step to samples.jsonl"),
    ignore("log_multimodal", True, "grpolab trains on text"),
    ignore("num_completions_to_print", None, "see log_completions"),
    ignore("log_unique_prompts", False, "see log_completions"),
    refuse("log_completions_hub_repo", None, "grpolab never contacts the Hugging Face Hub"),
    CONTINUOUS_BATCHING,
    CONTINUOUS_BATCHING_CONFIG,
    TRANSFORMERS_PAGED,
    Entry(
        "vllm_importance_sampling_cap",
        None,
        "map",
        "rollout.correction_clip",
        lambda v, a: {},
        "Deprecated in TRL: vllm_importance_sampling_clip_max's old name.",
    ),
]


def _table() -> dict[str, Entry]:
    """TRL's order; a name both parts declare (learning_rate, remove_unused_columns) keeps its first place
    and the first full entry."""
    out: dict[str, Entry] = {}
    for e in TRAINING_ARGUMENTS + GRPO_FIELDS:
        if e.name not in out:
            out[e.name] = e
    return out


TABLE: dict[str, Entry] = _table()
"""TRL field name -> Entry, in the order of TRL 1.16's GRPOConfig."""

__all__ = ["LOSS_TYPES", "SCALE_REWARDS", "TABLE", "config_has"]
