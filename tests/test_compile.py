"""compile=true (TRL's torch_compile): the policy's decoder layers compiled in the update (grpolab.model.compiling).
The end-to-end run compiles one micro-batch shape, 42 s on 2 busy CPU cores with inductor's cache cold (11 s
warm), so it is kept to one step of one micro-batch and marked slow."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from e2e_helpers import read_jsonl, varied_score, weights

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.model.compiling import compile_refusal, inductor_cache_dir
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

ONE_UPDATE = [
    "steps=1",
    "batch_size=4",
    "G=4",
    "micro_batch=4",
    "max_new_tokens=4",
    "eval_size=0",
    "lr=1e-3",
    "rewards=[{name: test_varied}]",
    "progress=false",
    "report=false",
    "grad_checkpointing=false",
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor needs a C++ compiler")
def test_a_compiled_update_gives_the_eager_loss_and_weights(tiny_model_dir, tmp_path, monkeypatch):
    """The same rollout (the rollout is not compiled), so the same loss and entropy of the compiled forward
    within float rounding (1e-5 relative), and weights within 1e-6 after one AdamW update at lr 1e-3 (an
    update moves each weight by about lr)."""
    monkeypatch.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
    runs = {}
    for name, flag in (("eager", "compile=false"), ("compiled", "compile=true")):
        out = tmp_path / name
        assert main(["train", f"model={tiny_model_dir}", f"out={out}", "device=cpu", flag, *ONE_UPDATE]) == 0
        runs[name] = (read_jsonl(out / "metrics.jsonl")[0], weights(out / "checkpoints" / "step-000001"))
    (eager, w_eager), (comp, w_comp) = runs["eager"], runs["compiled"]
    assert eager["update/seqs_computed"] == comp["update/seqs_computed"] == 4.0
    assert eager["reward/mean"] == comp["reward/mean"]  # the same samples
    assert comp["loss/policy"] == pytest.approx(eager["loss/policy"], rel=1e-5, abs=1e-7)
    assert comp["entropy"] == pytest.approx(eager["entropy"], rel=1e-5)  # read from the compiled layers' logits
    assert max(float((w_eager[k] - w_comp[k]).abs().max()) for k in w_eager) < 1e-6
    assert any(not torch.equal(w_comp[k], weights(tiny_model_dir)[k]) for k in w_comp)  # it trained


def test_compile_is_refused_where_it_cannot_work():
    with pytest.raises(ConfigError, match="compile: with grad_checkpointing=true: grpolab's per-layer checkpointing"):
        build_config(None, ["compile=true", "grad_checkpointing=true"])
    with pytest.raises(ConfigError, match="compile_mode: must be one of default, reduce-overhead"):
        build_config(None, ["compile=true", "compile_mode=fast"])
    assert build_config(None, ["compile=true", "grad_checkpointing=false"]).compile
    assert "not a torch.compile backend" in compile_refusal("nonesuch", torch.device("cpu"))
    assert compile_refusal("eager", torch.device("cpu")) is None


def test_inductor_on_a_cpu_without_a_compiler_is_refused(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no compiler was found" in compile_refusal("inductor", torch.device("cpu"))


def test_trl_torch_compile_maps_or_is_refused_with_checkpointing():
    from grpolab import GRPOConfig
    from grpolab.app.trl_compat.config import trl_recipe

    recipe = trl_recipe(GRPOConfig(output_dir="o", torch_compile=True, gradient_checkpointing=False))[0]
    assert (recipe["compile"], recipe["compile_backend"], recipe["compile_mode"]) == (True, "inductor", "default")
    recipe = trl_recipe(GRPOConfig(output_dir="o", torch_compile_mode="max-autotune", gradient_checkpointing=False))[0]
    assert recipe["compile"] and recipe["compile_mode"] == "max-autotune"  # a mode turns it on, as in transformers
    assert not trl_recipe(GRPOConfig(output_dir="o"))[0].get("compile", False)  # TRL's default: eager
    with pytest.raises(ConfigError, match="torch_compile=True: with gradient_checkpointing=True"):
        trl_recipe(GRPOConfig(output_dir="o", torch_compile=True))  # TRL's default checkpointing


def test_inductor_keeps_a_cache_per_instruction_set_and_the_users_own():
    """Kernels compiled at one instruction set are never read back at another (inductor_cache_dir): unset, or
    inductor's own default written back into the variable, -> the default with torch's capability appended;
    a folder the user named is left as it is."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    isa = torch.backends.cpu.get_cpu_capability().lower()
    assert inductor_cache_dir({}) == f"{default}_{isa}"
    assert inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": default}) == f"{default}_{isa}"
    assert inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/srv/kernels"}) is None
