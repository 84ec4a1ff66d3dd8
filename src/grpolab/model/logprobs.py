"""Per-token log-probs (and entropy) of completion tokens, computed only where they are needed.

The backbone runs over prompt + completion once; the LM head is applied only to the C positions that
predict completion tokens (never to the prompt), a chunk of positions at a time (grpolab.model.lmhead), so
neither the (b, P+C, V) logits of a plain `model(...).logits` call nor the (b, C, V) ones are built.
"""

from __future__ import annotations

import torch

from grpolab.model.cache import cache_of, positions, with_cache
from grpolab.model.lmhead import chunked_token_logp, plain_head_weight


def backbone(model):
    """The transformer body of a causal LM (LlamaModel for LlamaForCausalLM, through PEFT wrappers too)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix)


def token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | s_t) = z_{y_t} - logsumexp_v z_v, in fp32. logits (b, C, V), targets (b, C) -> (b, C)."""
    z = logits.float()
    return z.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(z, dim=-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H_t = logsumexp(z) - sum_v softmax(z)_v z_v, per position. (b, C, V) -> (b, C)."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = (z - lse).exp()
    return lse.squeeze(-1) - (p * z).sum(-1)


def _head_logp(
    model, h: torch.Tensor, completion_ids: torch.Tensor, temperature: float, with_entropy: bool, fp32: bool = False
):
    """The LM head on the states h (b, C, H) that predict completion_ids (b, C) -> (log-probs (b, C),
    entropies (b, C) or None), with logits divided by the temperature. A plain bias-free head runs a
    chunk of positions at a time (grpolab.model.lmhead: the full (b, C, V) logits are never held); any other
    head is applied at once. fp32: the head outside any autocast, on h cast to fp32 (TRL's
    cast_lm_head_to_fp32; the weights are fp32 already)."""
    if fp32 and torch.is_autocast_enabled(h.device.type):
        with torch.autocast(h.device.type, enabled=False):
            return _head_logp(model, h.float(), completion_ids, temperature, with_entropy)
    weight = plain_head_weight(model)
    if weight is not None:
        return chunked_token_logp(h, weight, completion_ids, temperature=temperature, with_entropy=with_entropy)
    logits = model.get_output_embeddings()(h)  # (b, C, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp = token_logp(logits, completion_ids)  # (b, C)
    ent = token_entropy(logits) if with_entropy else None
    return logp, ent


def completion_logp(
    model,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
):
    """log pi_theta of each completion token (b, C) and, optionally, the entropy at each position (b, C).

    Logits are divided by the sampling temperature so that pi_theta is the distribution the rollout
    sampled from (ratio = 1 on-policy).
    """
    P = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (b, P+C)
    mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)  # (b, P+C)
    h = backbone(model)(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
    h = h[:, P - 1 : -1]  # (b, C, H): the states that predict completion tokens
    return _head_logp(model, h, completion_ids, temperature, with_entropy)


def grouped_completion_logp(
    model,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    G: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    head_fp32: bool = False,
    router=None,
):
    """`completion_logp` for groups that share a prompt, running each prompt through the model once.

    prompt_ids/prompt_mask: (B, P), one row per group; completion_ids/completion_mask: (B*G, C),
    grouped contiguously. The prompt's keys/values are computed once with gradients, repeated G times,
    and the completions attend to them (autograd flows back through the repeat), so a group costs
    P + G*C token positions instead of G*(P + C). Same numbers as `completion_logp` on the repeated
    prompts, up to float rounding.

    router: a grpolab.model.moe.RouterLogits that collects a mixture of experts' router logits (the
    backbone asked for them): the prompt's tokens weighted G (each stands for its G copies), the
    completions' by their mask, the last completion token included (it predicts nothing, but a pass over
    the whole sequences routes it), so that they are the router logits of the G * (P + C) positions.
    """
    body = backbone(model)
    P = prompt_ids.shape[1]
    routed = {} if router is None else {"output_router_logits": True}
    out = body(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask), use_cache=True, **routed
    )
    if router is not None:
        router.add(out.router_logits, prompt_mask * G)
    cache = cache_of(out)
    h_first = out.last_hidden_state[:, -1:]  # (B, 1, H): predicts the first completion token
    pm = prompt_mask
    if G > 1:
        cache.batch_repeat_interleave(G)
        h_first = h_first.repeat_interleave(G, 0)  # (N, 1, H)
        pm = prompt_mask.repeat_interleave(G, 0)  # (N, P)
    mask = torch.cat([pm, completion_mask.long()], dim=1)  # (N, P+C)
    C = completion_ids.shape[1]
    n = C if router is not None else C - 1  # the completion tokens run through the model
    if n > 0:
        pos = positions(mask)[:, P : P + n]  # (N, n)
        out = body(
            input_ids=completion_ids[:, :n],
            attention_mask=mask[:, : P + n],
            position_ids=pos,
            use_cache=True,
            **with_cache(body, cache),
            **routed,
        )
        if router is not None:
            router.add(out.router_logits, mask[:, P:])
        h = torch.cat([h_first, out.last_hidden_state[:, : C - 1]], dim=1)  # (N, C, H)
    else:
        h = h_first
    return _head_logp(model, h, completion_ids, temperature, with_entropy, head_fp32)
