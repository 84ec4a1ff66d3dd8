"""The KV cache an inference engine needs for a run, from the model's config.json (no torch).

vLLM's CPU build allocates its whole KV cache at start and keeps it for the run: sized to the run, it
costs the memory the rollouts use instead of a fixed number of GiB (rollout.vllm_kv_cache_gb=0).
"""

from __future__ import annotations

PROMPT_ALLOWANCE = 512  # tokens of prompt assumed per sequence when the KV cache is sized to the run
KV_MARGIN = 1.25  # room for block rounding: vLLM allocates the cache in fixed-size blocks of tokens


def call_tokens(sequences: int, completion_budget: int) -> int:
    """The most tokens one generate call holds: `sequences` (a step's completions, or the held-out set
    if larger) of PROMPT_ALLOWANCE prompt tokens plus the completion budget (tool replies included).

        tokens = sequences * (PROMPT_ALLOWANCE + completion_budget)
    """
    return sequences * (PROMPT_ALLOWANCE + completion_budget)


def kv_bytes_per_token(model_config: dict, dtype_bytes: int) -> int:
    """Bytes of KV cache one token takes: layers x 2 (K and V) x KV heads x head size x bytes per element.

    bytes = L * 2 * H_kv * d_head * s
    """
    heads = model_config["num_attention_heads"]
    d_head = model_config.get("head_dim") or model_config["hidden_size"] // heads
    kv_heads = model_config.get("num_key_value_heads") or heads
    return model_config["num_hidden_layers"] * 2 * kv_heads * d_head * dtype_bytes


def kv_cache_bytes(model_config: dict, dtype_bytes: int, tokens: int) -> int:
    """The KV cache a run needs: `tokens` (the most one generate call holds) or one sequence of the
    model's whole context, whichever is more (vLLM refuses to start with less), times KV_MARGIN.

        bytes = KV_MARGIN * max(tokens, max_position_embeddings) * kv_bytes_per_token
    """
    context = int(model_config.get("max_position_embeddings") or 0)
    return int(KV_MARGIN * max(tokens, context) * kv_bytes_per_token(model_config, dtype_bytes))
