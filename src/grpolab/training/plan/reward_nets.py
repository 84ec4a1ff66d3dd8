"""A run's reward models in its plan: a second network's weights, held for the whole run, and its forward
pass over every completion of a step (grpolab.rewards.reward_model), before anything is loaded.

For a sequence-classification model with hidden size H over n sequences of S = P + C positions (one call:
a group of G, or `batch_size` of them), weights of w bytes each, computing in c bytes (the run's autocast
dtype, else w):

    weights         w (L layer + V H + H + H)          the backbone, its final norm and the score head (H x 1)
    one forward     2 n S H w                          the residual stream in and out of a layer
                    + 3 n S I c + 2 n S H 4            one layer's MLP intermediates and norms
                    + n S S                            the boolean attention mask (padded texts)
                    + c layer_linear (c != w)          one layer's weights cast for autocast (not cached
                                                       under inference_mode)
    FLOPs           forward_flops(N S, S / 2, 0)       every completion of the step, no LM head

No KV cache is kept (use_cache=False), nothing has gradients, and transformers' sdpa attention keeps no
(n, h, S, S) scores on either device (torch's fused kernels; tests/test_reward_model.py measures the CPU
allocator's peak of a forward against this). A reward model given as an object
(GRPOTrainer's reward_funcs=model) is not in the config and not planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpolab.training.plan.shapes import Shape

F32 = 4
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class RewardNet:
    """One reward model of a run, as the plan sees it."""

    name: str
    shape: Shape
    weight_bytes: int
    """Bytes per weight: the dtype it is loaded in (reward_model's dtype=auto: the checkpoint's)."""
    batch_size: int = 0
    """Sequences per forward pass (0: one call's, a group of G)."""

    @property
    def phase(self) -> str:
        """Its phase's name in the plan: "reward model", with its label when it has one of its own."""
        return "reward model" if self.name == "reward_model" else f"reward model {self.name}"

    @property
    def params(self) -> int:
        """The backbone and the one-output score head (no LM head)."""
        return self.shape.backbone_params + self.shape.hidden

    def seqs_per_pass(self, G: int) -> int:
        return min(self.batch_size, G) if self.batch_size else G


def reward_nets(rewards: list[dict]) -> tuple[list[RewardNet], list[str]]:
    """The `reward_model` specs of a config's rewards as RewardNets, and a note for each one the plan
    cannot read (not a Llama-family decoder). A path that is not a local directory is a ConfigError, as
    in training (grpolab never downloads)."""
    from grpolab.rewards.reward_model import checkpoint_dtype, local_dir

    nets, notes = [], []
    for i, spec in enumerate(rewards or []):
        if not isinstance(spec, dict) or spec.get("name") != "reward_model":
            continue
        path = local_dir(spec.get("path"), f"rewards[{i}]: reward_model.path")
        try:
            shape = Shape.from_dir(path, Path(str(spec["path"])).name)
        except (ValueError, OSError) as e:
            notes.append(f"reward model rewards[{i}] is not in the plan: {e}")
            continue
        dtype = spec.get("dtype", "auto")
        dtype = checkpoint_dtype(path) if dtype == "auto" else dtype
        label = spec.get("label") or "reward_model"
        nets.append(RewardNet(label, shape, BYTES.get(str(dtype), F32), int(spec.get("batch_size", 0) or 0)))
    return nets, notes


def compute_bytes(net: RewardNet, autocast_bytes: int) -> int:
    """Bytes per value of its matmuls: the run's autocast dtype (2 under bf16), else its weights'."""
    return min(net.weight_bytes, autocast_bytes)


def weights(net: RewardNet) -> int:
    return net.weight_bytes * net.params


def forward_bytes(net: RewardNet, n: int, S: int, autocast_bytes: int) -> dict[str, int]:
    """What one no-grad forward of n sequences of S positions holds besides the weights (module docstring)."""
    s, w = net.shape, net.weight_bytes
    c = compute_bytes(net, autocast_bytes)
    T = n * S
    return {
        "hidden states": 2 * T * s.hidden * w,
        "layer intermediates": 3 * T * s.intermediate * c + 2 * T * s.hidden * F32 + n * S * S,
        "weight casts": c * s.layer_linear if c != w else 0,
    }


def flops(net: RewardNet, rows: int, S: int) -> float:
    """FLOPs of scoring `rows` sequences of S positions: a forward without an LM head."""
    return net.shape.forward_flops(rows * S, S / 2, 0)


__all__ = ["RewardNet", "compute_bytes", "flops", "forward_bytes", "reward_nets", "weights"]
