"""vLLM's Transformers backend (model_impl="transformers", or "auto" for an architecture vLLM lacks) and the
trainer in the same process.

To compile the model it runs, the backend decorates transformers' decoder class itself (LlamaModel, ...)
with vLLM's `support_torch_compile`, in place: the class gains vLLM's base class and its `__init__` and
`__call__` become vLLM's. Every other instance of that class in the process is then vLLM's too:

    a model built before vLLM started (the policy, the reference): vLLM's __call__ reads
        self.do_not_compile, which only vLLM's __init__ sets -> AttributeError in the trainer's pass
    a model built after it: vLLM's __init__ asks for the current vLLM config, set only while vLLM
        builds its own model -> AssertionError

`keep_trainer_models_plain` narrows the decoration to vLLM's own instances, those vLLM's __init__ ran
on (`do_not_compile` in the instance's own attributes): any other instance is called as torch calls
a module (nn.Module.__call__: its hooks, FSDP's included, then forward), and a class built outside
vLLM's model loading runs transformers' own __init__. vLLM's instance and its compilation are
unchanged."""

from __future__ import annotations

import inspect

from torch import nn

PLAIN = "_grpolab_plain_outside_vllm"


def vllm_decorated_classes() -> list[type]:
    """transformers' model classes that vLLM's support_torch_compile has decorated in this process (its
    wrapper class appended to their bases)."""
    from transformers import PreTrainedModel
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    seen, todo, found = set(), [PreTrainedModel], []
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                if TorchCompileWithNoGuardsWrapper in sub.__bases__:
                    found.append(sub)
    return found


def _is_vllms(module: nn.Module) -> bool:
    """vLLM's __init__ ran on this instance: it set do_not_compile, which vLLM's __call__ reads."""
    return "do_not_compile" in vars(module)


def keep_plain(cls: type) -> None:
    """Wrap a decorated class's __call__ and __init__ (once) so that only vLLM's instances take vLLM's:

    __call__: vLLM's instance -> vLLM's __call__ (compiled or its forward); any other -> nn.Module.__call__
    __init__: inside vLLM's model loading (a current vLLM config) -> vLLM's; outside it -> transformers'
              own __init__ (the one vLLM's closes over), as before the decoration"""
    if cls.__dict__.get(PLAIN):
        return
    from vllm.config import get_current_vllm_config_or_none

    vllm_call, vllm_init = cls.__call__, cls.__init__
    own_init = inspect.getclosurevars(vllm_init).nonlocals.get("old_init")

    def __call__(self, *args, **kwargs):
        if _is_vllms(self):
            return vllm_call(self, *args, **kwargs)
        return nn.Module.__call__(self, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if own_init is None or get_current_vllm_config_or_none() is not None:
            return vllm_init(self, *args, **kwargs)
        return own_init(self, *args, **kwargs)

    cls.__call__, cls.__init__ = __call__, __init__
    setattr(cls, PLAIN, True)


def keep_trainer_models_plain() -> list[str]:
    """After vLLM has built its model: every class its Transformers backend decorated keeps transformers'
    behaviour outside vLLM's instances (keep_plain). Returns the classes' names (empty: vLLM ran its own
    implementation and decorated nothing of transformers')."""
    classes = vllm_decorated_classes()
    for cls in classes:
        keep_plain(cls)
    return sorted(c.__name__ for c in classes)
