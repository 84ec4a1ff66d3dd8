"""The numbers of a decoder-only transformer that memory and arithmetic depend on: parameter counts,
LoRA adapter sizes and FLOPs per position, from a Hugging Face config (no weights needed).

For a Llama-family layer (Llama, Qwen2, Mistral, SmolLM2) with hidden size H, MLP width I, n_h query
heads and n_kv key/value heads of size d:

    attention weights   H (n_h d) + 2 H (n_kv d) + (n_h d) H        (q, k, v, o; Qwen2 adds q/k/v biases)
    MLP weights         3 H I                                       (gate, up, down)
    norms               2 H
    model               L (layer) + V H (embedding) + [V H (an untied LM head)] + H (final norm)

FLOPs of a forward pass (Kaplan et al. 2020, section 2.1): 2 per weight per position, plus the
attention's two products, 4 n_h d per (query, key) pair; a forward and backward is 3x the forward
when every weight is trained and about 2x when the weights are frozen (LoRA: no weight gradients,
only the input gradients and the adapter's own).

`SHAPES` holds the published configs of the models the plan names without a directory (`grpolab
plan model=qwen2.5-7b`): shapes only, for planning; nothing is downloaded and no weights exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers `lora.target_modules=all-linear` adapts in a Llama-family model (not the LM head)."""


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's architecture (what grpolab.training.plan.memory needs of a model)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    """The LM head is the embedding matrix (one V x H weight, not two)."""
    qkv_bias: bool = False
    model_type: str = "llama"

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer."""
        H, I = self.hidden, self.intermediate
        return {
            "q_proj": (H, self.q_dim),
            "k_proj": (H, self.kv_dim),
            "v_proj": (H, self.kv_dim),
            "o_proj": (self.q_dim, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    @property
    def layer_linear(self) -> int:
        """Weights of the linear layers of one decoder layer (biases excluded)."""
        return sum(i * o for i, o in self.linear_dims().values())

    @property
    def layer_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return self.layer_linear + bias + 2 * self.hidden

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def head(self) -> int:
        """Parameters of the LM head of its own (0 when tied to the embedding)."""
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def backbone_params(self) -> int:
        """The transformer body (what a PPO critic copies): layers, embedding, final norm."""
        return self.layers * self.layer_params + self.embedding + self.hidden

    @property
    def params(self) -> int:
        """Every parameter, a tied head counted once."""
        return self.backbone_params + self.head

    def lora_params(self, r: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
        """Adapter parameters: r (in + out) per targeted linear layer, in every layer."""
        return self.layers * sum(r * (i + o) for name, (i, o) in self.linear_dims().items() if name in targets)

    def forward_flops(self, positions: int, keys_per_position: float, head_positions: int) -> float:
        """FLOPs of one forward pass: 2 per layer weight per position, 4 n_h d per (query, key) pair of the
        attention, and 2 V H per position that goes through the LM head."""
        body = 2 * self.layers * self.layer_linear * positions
        attention = 4 * self.layers * self.q_dim * positions * keys_per_position
        return body + attention + 2 * self.vocab * self.hidden * head_positions

    @classmethod
    def from_config(cls, cfg: dict, name: str = "") -> Shape:
        """From a Hugging Face config.json's keys (Llama-family names: hidden_size, intermediate_size, ...)."""
        cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                name=name or cfg.get("_name_or_path") or cfg.get("model_type", "model"),
                layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                intermediate=int(cfg["intermediate_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                vocab=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", True)),
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)),
                model_type=str(cfg.get("model_type", "llama")),
            )
        except KeyError as e:
            raise ValueError(
                f"the model config has no {e.args[0]!r}: grpolab plans Llama-family decoders "
                f"(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size)"
            ) from e

    @classmethod
    def from_dir(cls, path: Path, name: str = "") -> Shape:
        """From a model directory's config.json."""
        return cls.from_config(json.loads((Path(path) / "config.json").read_text()), name or Path(path).name)


def _qwen(name, layers, hidden, inter, heads, kv, vocab=151936, tied=True):
    return Shape(name, layers, hidden, inter, heads, kv, hidden // heads, vocab, tied, True, "qwen2")


def _llama(name, layers, hidden, inter, heads, kv, vocab=128256, tied=True, head_dim=None):
    return Shape(name, layers, hidden, inter, heads, kv, head_dim or hidden // heads, vocab, tied, False, "llama")


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        _llama("smollm2-135m", 30, 576, 1536, 9, 3, vocab=49152),
        _llama("smollm2-360m", 32, 960, 2560, 15, 5, vocab=49152),
        _llama("smollm2-1.7b", 24, 2048, 8192, 32, 32, vocab=49152),
        _qwen("qwen2.5-0.5b", 24, 896, 4864, 14, 2),
        _qwen("qwen2.5-1.5b", 28, 1536, 8960, 12, 2),
        _qwen("qwen2.5-3b", 36, 2048, 11008, 16, 2),
        _qwen("qwen2.5-7b", 28, 3584, 18944, 28, 4, vocab=152064, tied=False),
        _llama("llama-3.2-1b", 16, 2048, 8192, 32, 8, head_dim=64),
        _llama("llama-3.2-3b", 28, 3072, 8192, 24, 8, head_dim=128),
        _llama("llama-3.1-8b", 32, 4096, 14336, 32, 8, tied=False),
    )
}
"""Published architectures (their config.json values), by the name `grpolab plan model=NAME` takes."""


__all__ = ["LORA_TARGETS", "SHAPES", "Shape"]
