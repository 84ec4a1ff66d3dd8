"""grpolab.model.optim: AdamW fused where it applies; a checkpoint of either implementation resumes into the
other with its moments intact and the loading optimizer's own implementation kept."""

from __future__ import annotations

import copy

import torch

from grpolab.model.optim import adamw, load_state


def params(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]


def step(opt, ps, seed):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def test_fused_on_cpu_and_not_when_sharded():
    assert adamw(params(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0).param_groups[0]["fused"] is True
    assert not adamw(params(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, sharded=True).param_groups[0]["fused"]


def test_fused_and_foreach_compute_the_same_update_to_float_rounding():
    a, b = params(), params()
    fa = adamw(a, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    fb = torch.optim.AdamW(b, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, foreach=True)
    for s in range(3):
        step(fa, a, s), step(fb, b, s)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=0, atol=1e-6), (x - y).abs().max()


def test_load_state_keeps_the_loading_optimizers_implementation():
    a = params()
    foreach = torch.optim.AdamW(a, lr=1e-2, foreach=True)
    step(foreach, a, 0)
    saved = copy.deepcopy(foreach.state_dict())  # as from disk: no tensor shared with `foreach`
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    fused = adamw(b, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    load_state(fused, saved)
    assert fused.param_groups[0]["fused"] is True and not fused.param_groups[0].get("foreach")
    for i, p in enumerate(b):  # the moments and the step count came across
        assert torch.equal(fused.state[p]["exp_avg"], saved["state"][i]["exp_avg"])
        assert float(fused.state[p]["step"]) == 1.0
    step(fused, b, 1), step(foreach, a, 1)  # and it keeps stepping as the saved one would
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=0, atol=1e-6)
