"""The load-balancing loss of a mixture-of-experts router (Switch Transformer; TRL 1.16's router_aux_loss_coef).

    loss = policy loss + c * aux,     aux = E * sum_e f_e P_e

An MoE layer sends each token to the top k of its E experts by the router's probabilities p = softmax(z). With
nothing to oppose it, training lets a few experts take most tokens; aux is smallest when the routing is
balanced. The model side (which models have routers, c from the model's config) is grpolab.model.moe.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def load_balancing_loss(router_logits: Sequence[Tensor], weight: Tensor, num_experts: int, top_k: int) -> Tensor:
    """Switch Transformer's auxiliary load-balancing loss (Fedus et al. 2021, "Switch Transformers",
    arXiv 2101.03961, eqs. 4-6), with top-k routing, as transformers computes it for its MoE models
    (load_balancing_loss_func, the `aux_loss` TRL 1.16 adds):

        f_e = sum_l sum_t w_t 1[e in topk(p_lt)] / (L sum_t w_t)     top-k slots routed to expert e, per token
        P_e = sum_l sum_t w_t p_lte / (L sum_t w_t)                  mean router probability of expert e
        aux = E * sum_e f_e P_e

    router_logits: one (T, E) tensor per MoE layer l = 1..L (the same T tokens in each), p_lt = softmax(z_lt) in
    fp32; weight (T,): w_t = 1 for a token, 0 for padding, G for a prompt token that stands for the G copies of
    its prompt (grpolab.model.logprobs.grouped_completion_logp), so aux is that of the expanded batch. The layers
    are pooled, not averaged layer by layer. sum_e f_e = k and sum_e P_e = 1: balanced routing (f_e = k/E,
    P_e = 1/E) gives aux = k; every token on the same k experts with probability 1/k each gives aux = E. The
    gradient flows through P alone (the top-k choice is a count). Returns a 0-dim fp32 tensor."""
    w = weight.reshape(-1).float()  # (T,)
    f = torch.zeros(num_experts, device=w.device)  # (E,)
    P = torch.zeros(num_experts, device=w.device)  # (E,)
    for z in router_logits:
        p = z.float().softmax(-1)  # (T, E)
        chosen = p.topk(top_k, dim=-1).indices  # (T, k)
        f = f + torch.zeros_like(f).scatter_add(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        P = P + (p * w[:, None]).sum(0)
    total = w.sum() * len(router_logits)
    return num_experts * ((f / total) * (P / total)).sum()


__all__ = ["load_balancing_loss"]
