"""FSDP2 sharding (`torch.distributed.fsdp.fully_shard`) under torchrun, for models that do not fit one device.

    torchrun --nproc_per_node 4 -m grpolab train recipes/demo.yaml out=runs/fsdp fsdp=true

What is sharded, and how the step stays the single-process step on the global batch:
- `shard(model)`: each decoder layer is one FSDP group; the transformer body is the root group and
  also holds the LM head, so a tied head (SmolLM2 ties lm_head to embed_tokens) stays one tensor in
  one group, and the training passes, which call the body directly (grpolab.model.logprobs), go through the
  root's hooks. The parameters, gradients and AdamW state of each rank are 1/world of the model.
- Gradients: FSDP reduce-scatters them after each backward. Its default divides by the world size;
  here the divide factor is 1 (a plain sum), because each rank's loss is already its share of the
  global-batch loss (the normalisers count the global batch, grpolab.parallel.distributed), so the sum is the
  global-batch gradient, as with data parallelism. clip_grad_norm_ on the sharded gradients gives the
  global norm.
- Every collective must be made by every rank in the same order, and the ranks' rollouts differ in
  length. So a rollout, the reference pass and rank 0's evaluation run `gathered`: the whole model
  is all-gathered once (every rank), the passes make no collective, and it is resharded after (the
  rollout costs the full weights' memory on every device, not the gradients' or the optimizer's; and
  no all-gather per generated token). The policy's training passes stay sharded, layer by layer, so
  every rank runs the same number of micro-batches (`passes`: a rank with fewer runs a zero-weight
  one) of the same shape (grpolab.model.passes.policy_logp: at least two completion columns).
- Checkpoints are the unsharded model and optimizer, exactly as one process writes them
  (`full_views`, a collective, then rank 0 writes), so evaluation, export and resuming read them as
  before; `load_views` restores them into the sharded model (resuming needs the same world size).

Not supported with fsdp=true (a ConfigError): one process (no torchrun), LoRA (lora.r > 0).
"""

from __future__ import annotations

import contextlib

import torch

from grpolab.model.logprobs import backbone
from grpolab.model.passes import FSDP_MARK as _MARK
from grpolab.model.passes import is_sharded
from grpolab.parallel.distributed import Dist, global_max
from grpolab.util.fields import ConfigError


def shard(model, d: Dist, device: torch.device):
    """Shard `model` (in place) over the d.world processes; its parameters end on `device`. Returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if hasattr(model, "peft_config"):
        raise ConfigError("fsdp: FSDP2 sharding of a LoRA (peft) model is not supported; set lora.r=0 or fsdp=false")
    body = backbone(model)
    layers = list(getattr(body, "layers", None) or [])
    if not layers:
        raise ConfigError(f"fsdp: {type(body).__name__} has no `layers` list of decoder layers to shard")
    mesh = init_device_mesh(device.type, (d.world,))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    head = model.get_output_embeddings()
    # The head is registered under the body for this call only: FSDP then records it as a second user of
    # a tied weight (and swaps its parameter with the body's), or as one more parameter of the root group.
    body.add_module("_fsdp_lm_head", head)
    try:
        root = fully_shard(body, mesh=mesh, reshard_after_forward=False)
    finally:
        delattr(body, "_fsdp_lm_head")
    for m in [*layers, root]:
        m.set_gradient_divide_factor(1.0)  # a sum over the ranks, not a mean (see the docstring)
        m.set_force_sum_reduction_for_comms(True)  # a plain SUM collective (gloo has no PREMUL_SUM)
    setattr(model, _MARK, {"layers": layers, "root": root, "depth": 0})
    return model


def shard_models(policy, ref, d: Dist, device: torch.device):
    """Shard the policy and the reference (grpolab.model.reference) in place; returns the reference, whose
    model() now yields its network gathered (the reference pass is a no-grad pass like a rollout)."""
    shard(policy, d, device)
    if ref is None:
        return None
    with ref.model() as frozen:
        shard(frozen, d, device)
    return _GatheredReference(ref)


class _GatheredReference:
    """A reference whose `with ref.model() as m:` gives its sharded network gathered for the block."""

    def __init__(self, ref):
        self.ref = ref

    @contextlib.contextmanager
    def model(self):
        with self.ref.model() as m, gathered(m):
            yield m


@contextlib.contextmanager
def gathered(model, enabled: bool = True):
    """The whole of a sharded `model` unsharded for the block, and no collective made inside it (a
    collective itself, on entry: every rank must enter). Re-entrant; a no-op for a plain model."""
    mark = getattr(model, _MARK, None) if enabled else None
    if mark is None or mark["depth"] > 0:
        if mark is not None:
            mark["depth"] += 1
        try:
            yield
        finally:
            if mark is not None:
                mark["depth"] -= 1
        return
    mark["depth"] = 1
    for m in mark["layers"]:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        for m in [mark["root"], *mark["layers"]]:
            m.unshard()
        yield
    finally:
        for m in [mark["root"], *mark["layers"]]:
            m.reshard()
        for m in mark["layers"]:
            m.set_reshard_after_forward(True, recurse=False)
        mark["depth"] = 0


def passes(d: Dist, batches: list, sharded: bool) -> list:
    """The micro-batches this rank runs: its own, then None (an idle pass) up to the most any rank has."""
    if not sharded:
        return batches
    return batches + [None] * (int(global_max(d, len(batches))) - len(batches))


class _FullModel:
    """What save_checkpoint needs of the model: save_pretrained, with the gathered full state dict."""

    def __init__(self, model, state: dict):
        self.model, self.state = model, state

    def save_pretrained(self, path, **kwargs):
        state = dict(self.state)
        for same in _tied_names(self.model):  # one tensor again, so that save_pretrained drops the tied copy
            for n in same[1:]:
                if same[0] in state and n in state:
                    state[n] = state[same[0]]
        self.model.save_pretrained(path, state_dict=state, **kwargs)


def _tied_names(model) -> list[list[str]]:
    """The names of each parameter of `model`, first the one named_parameters() keeps."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    return list(names.values())


class _FullOptimizer:
    """What save_checkpoint needs of the optimizer: state_dict(), the full one, keyed as torch keys it."""

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self) -> dict:
        return self.state


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_views(run):
    """(model, optimizer) for save_checkpoint: the run's own ones, or for a sharded policy stand-ins
    holding the gathered full (unsharded, CPU) states. A collective: every rank calls it; the states
    are on rank 0 only."""
    if not is_sharded(run.policy):
        return run.policy, run.optimizer
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model_state = get_model_state_dict(run.policy, options=_options(cpu_offload=True))
    optim = get_optimizer_state_dict(run.policy, run.optimizer, options=_options(cpu_offload=True))
    index, groups = {}, []
    for g in optim.get("param_groups", []):  # parameter names -> the positions torch's own state_dict uses
        groups.append({**g, "params": [index.setdefault(n, len(index)) for n in g["params"]]})
    state = {index[n]: s for n, s in optim.get("state", {}).items()}
    return _FullModel(run.policy, model_state), _FullOptimizer({"state": state, "param_groups": groups})


class _LoadModel:
    """What load_checkpoint needs of the model: load_state_dict(full state, strict=False)."""

    def __init__(self, model):
        self.model = model

    def load_state_dict(self, state: dict, strict: bool = False):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        state = dict(state)
        for same in _tied_names(self.model):  # a tied weight is saved once (save_pretrained drops the copy)
            have = [n for n in same if n in state]
            for n in same:
                if have and n not in state:
                    state[n] = state[have[0]]
        return set_model_state_dict(self.model, state, options=_options(strict=strict))


class _LoadOptimizer:
    """What load_checkpoint needs of the optimizer: load_state_dict(the full state torch keys by position)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def load_state_dict(self, full: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        name_of = {id(p): n for n, p in self.model.named_parameters()}
        names = [name_of[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
        groups, i = [], 0
        for g in full["param_groups"]:
            groups.append({**g, "params": names[i : i + len(g["params"])]})
            i += len(g["params"])
        state = {names[k]: s for k, s in full["state"].items()}
        set_optimizer_state_dict(
            self.model, self.optimizer, {"state": state, "param_groups": groups}, options=_options()
        )


def load_views(run):
    """(model, optimizer) for load_checkpoint: the run's own, or stand-ins that shard the full states."""
    if not is_sharded(run.policy):
        return run.policy, run.optimizer
    return _LoadModel(run.policy), _LoadOptimizer(run.policy, run.optimizer) if run.optimizer is not None else None
