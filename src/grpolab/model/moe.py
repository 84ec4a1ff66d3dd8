"""Mixture-of-experts models: whether the update adds the routers' load-balancing loss, and with which weight.

    router_aux_of(model, coef)      RouterAux (c, E, k) or None, decided once when the run is set up
    RouterLogits                    what the update's policy pass collects: the routers' logits per backbone
                                    call, with each token's weight
    RouterAux.loss(logits)          aux of one micro-batch (grpolab.algo.router.load_balancing_loss)

TRL 1.16 (GRPOTrainer, aux_loss_enabled): a model whose config has `output_router_logits` (Mixtral, Qwen2-MoE,
Qwen3-MoE, ...) is a mixture of experts that can return its routers' logits; the coefficient is
router_aux_loss_coef, or where that is unset the model config's own router_aux_loss_coef (0.0 where it declares
none). A coefficient other than 0 on a model without routers is an error. The term is the update's only: the
reference's and the old policy's passes ask for no router logits, and a dense model's passes are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from grpolab.algo.router import load_balancing_loss
from grpolab.util.fields import ConfigError


def text_config(model):
    """The language model's config (a vision-language model's text part; through a peft wrapper)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


@dataclass
class RouterLogits:
    """The routers' logits one pass collected: per backbone call, each MoE layer's (T, E) logits and the
    weight (T,) of each of its T token positions (grpolab.algo.router.load_balancing_loss)."""

    calls: list[tuple[tuple[Tensor, ...], Tensor]] = field(default_factory=list)

    def add(self, layers, weight: Tensor) -> None:
        """One backbone call's router logits (a tuple with one (T, E) tensor per layer) and weights (b, L) -> (T,)."""
        self.calls.append((tuple(layers), weight.reshape(-1)))

    def pooled(self) -> tuple[list[Tensor], Tensor]:
        """Each layer's logits over every call, (sum T, E), and the weights in the same order, (sum T,)."""
        n_layers = len(self.calls[0][0])
        layers = [torch.cat([layers[i] for layers, _ in self.calls]) for i in range(n_layers)]
        return layers, torch.cat([w for _, w in self.calls])


@dataclass(frozen=True)
class RouterAux:
    """The update's load-balancing term: coefficient c, experts E, experts per token k."""

    coef: float
    num_experts: int
    top_k: int

    def loss(self, logits: RouterLogits) -> Tensor:
        """aux of the tokens one pass collected (0-dim, fp32, with its gradient)."""
        layers, weight = logits.pooled()
        return load_balancing_loss(layers, weight, self.num_experts, self.top_k)


def router_aux_of(model, coef: float | None) -> RouterAux | None:
    """TRL's aux_loss_enabled and router_aux_loss_coef for `model`: RouterAux where the model is a mixture of
    experts that returns its router logits and the coefficient (`coef`, else the model config's) is not 0;
    None otherwise (no router logits asked, no cost). coef != 0 on a model without routers: ConfigError."""
    text = text_config(model)
    if not hasattr(text, "output_router_logits"):
        if coef:
            raise ConfigError(
                f"algo.router_aux_loss_coef={coef}: {type(model).__name__} is not a mixture-of-experts model "
                "that returns its router logits, so there is no load-balancing loss to weight; leave it unset "
                "(null) or set it to 0"
            )
        return None
    c = float(getattr(text, "router_aux_loss_coef", 0.0) if coef is None else coef)
    if c == 0.0:
        return None
    experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
    return RouterAux(c, int(experts), int(text.num_experts_per_tok))


__all__ = ["RouterAux", "RouterLogits", "router_aux_of", "text_config"]
