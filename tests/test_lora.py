"""LoRA through peft (grpolab.model.lora, grpolab.model.reference, grpolab.app.export) on the tiny random model:
the lora.* keys and their errors, a real CLI run that trains only the adapter, the reference as the
policy with its adapter off, exact resume, `grpolab export --merged`, eval and chat on a LoRA run,
and the message when peft is missing."""

from __future__ import annotations

import builtins
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from e2e_helpers import changed, read_jsonl

from grpolab.app.cli import main
from grpolab.training.config import build_config, help_text
from grpolab.util.fields import ConfigError

FAST = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=6",
    "micro_batch=8",
    "progress=false",
    "tensorboard=false",
    "report=false",
    "samples_per_step=1",
    "lr=1e-2",
    "algo.beta=0.04",
    "rewards=[{name: test_varied}]",
]
LORA = ["lora.r=4", "lora.alpha=8"]


pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry


def train(model: Path, out: Path, *args: str) -> Path:
    assert main(["train", f"model={model}", f"out={out}", *FAST, *args]) == 0
    return out


def adapter(ck: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ck / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory) -> Path:
    """3 LoRA steps through the real CLI, a checkpoint after each, evaluated on 4 prompts before and after."""
    out = tmp_path_factory.mktemp("lora") / "run"
    return train(tiny_model_dir, out, *LORA, "steps=3", "save_every=1", "keep_checkpoints=3", "eval_size=4")


# -- config ---------------------------------------------------------------------------------------


def test_lora_keys_default_to_full_fine_tuning_and_validate():
    cfg = build_config(None, [])
    assert cfg.lora.r == 0 and not cfg.lora.enabled and cfg.lora.target_modules == "all-linear"
    cfg = build_config(None, ["lora.r=16", "lora.target_modules=q_proj, v_proj"])
    assert cfg.lora.r == 16 and cfg.lora.targets() == ["q_proj", "v_proj"]
    assert build_config(None, ["lora.r=8", "lora.target_modules=[q_proj]"]).lora.targets() == ["q_proj"]
    for bad, key in [
        (["lora.r=-1"], "lora.r"),
        (["lora.r=4", "lora.alpha=0"], "lora.alpha"),
        (["lora.r=4", "lora.dropout=1"], "lora.dropout"),
        (["lora.r=4", "lora.target_modules="], "lora.target_modules"),
        (["lora.rank=4"], "lora.rank"),
        (["lora.r=four"], "lora.r"),
    ]:
        with pytest.raises(ConfigError) as e:
            build_config(None, bad)
        assert str(e.value).startswith(f"{key}:"), (bad, str(e.value))
    text = help_text()
    for key in ("lora.r=0", "lora.alpha=", "lora.dropout=", "lora.target_modules='all-linear'"):
        assert f"\n  {key}" in text, key


def test_bad_lora_values_exit_2_through_the_cli(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", "lora.r=4", "lora.dropout=1.5"]) == 2
    assert "lora.dropout" in capsys.readouterr().err
    assert (
        main(["train", f"model={tiny_model_dir}", f"out={out}", *FAST, "lora.r=4", "lora.target_modules=no_such_proj"])
        == 2
    )
    err = capsys.readouterr().err
    assert "lora.target_modules" in err and "all-linear" in err
    assert not out.exists()


def test_missing_peft_says_how_to_install(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'grpolab\[lora\]'"):
        build_config(None, ["lora.r=8"])
    assert build_config(None, []).lora.r == 0  # full fine-tuning needs no peft
    assert main(["train", f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", "lora.r=8"]) == 2
    assert "pip install 'grpolab[lora]'" in capsys.readouterr().err


# -- training -------------------------------------------------------------------------------------


def test_a_lora_checkpoint_holds_the_adapter_and_its_optimizer_only(lora_run):
    from grpolab.training.checkpoint import verify_checkpoint

    ck = lora_run / "checkpoints" / "step-000003"
    files = {p.name for p in ck.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "manifest.json"} <= files
    assert not files & {"model.safetensors", "config.json"}  # no copy of the base model
    assert verify_checkpoint(ck) is None and "adapter_model.safetensors" in json.loads(
        (ck / "manifest.json").read_text()
    )
    weights = adapter(ck)
    assert weights and all("lora_A" in k or "lora_B" in k for k in weights)
    n_adapter = sum(v.numel() for v in weights.values())
    metrics = read_jsonl(lora_run / "metrics.jsonl")
    assert [m["params/trained"] for m in metrics] == [n_adapter] * 3
    assert any(m["kl"] > 0 for m in metrics[1:])  # the reference pass ran and the policy moved away from it
    state = torch.load(ck / "optimizer.pt", weights_only=True)["state"]
    assert len(state) == len(weights)  # AdamW state for the adapter's tensors, nothing else
    # B starts at 0 (the adapter starts as the identity) and has been trained
    assert all(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k)


def test_only_the_adapter_trains_and_the_reference_is_the_base_model(tiny_model_dir, tmp_path):
    """In process, as the CLI runs it: after two steps every base weight is bitwise what it was, the
    adapter moved, and the reference (adapter off) gives the base model's log-probs bit for bit."""
    from grpolab.model.load import load_policy
    from grpolab.model.lora import is_peft
    from grpolab.model.passes import logp_without_grad
    from grpolab.model.reference import AdapterOff
    from grpolab.training.step import train_step
    from grpolab.training.trainer import setup

    cfg = build_config(None, [f"model={tiny_model_dir}", f"out={tmp_path / 'run'}", *FAST, *LORA])
    run = setup(cfg, log=lambda *_: None)
    assert is_peft(run.policy) and isinstance(run.ref, AdapterOff)
    base = load_policy(tiny_model_dir, run.device).eval()
    before = {k: v.clone() for k, v in run.policy.state_dict().items()}
    trained = {n for n, p in run.policy.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert {id(p) for g in run.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in run.policy.parameters() if p.requires_grad
    }
    for step in (1, 2):
        _, batch = train_step(run, step)
    after = run.policy.state_dict()
    moved = changed(before, after)
    assert moved and all("lora_" in k for k in moved), moved
    assert any("lora_B" in k for k in moved)
    spec = run.pass_spec
    with run.ref.model() as ref:
        ref_logp = logp_without_grad(spec, ref, batch.rollout)
    assert run.policy.training  # the reference pass restored train mode
    assert torch.equal(ref_logp, logp_without_grad(spec, base, batch.rollout))
    assert not torch.equal(logp_without_grad(spec, run.policy, batch.rollout), ref_logp)  # the adapter is on again


def test_resume_of_a_lora_run_is_exact(lora_run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(lora_run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000003")  # as if killed after step 2's checkpoint
    assert main(["train", "--resume", str(resumed)]) == 0
    ck = Path("checkpoints") / "step-000003"
    diff = changed(adapter(resumed / ck), adapter(lora_run / ck))
    assert not diff, f"the resumed LoRA run drifted: {diff[:5]}"
    assert [m["step"] for m in read_jsonl(resumed / "metrics.jsonl")] == [1, 2, 3]


def test_resume_refuses_other_lora_settings(lora_run, capsys):
    assert main(["train", "--resume", str(lora_run), "steps=4", "lora.r=8"]) == 2
    assert "lora.r: cannot change when resuming" in capsys.readouterr().err
    assert main(["train", "--resume", str(lora_run), "steps=4", "lora.r=0"]) == 2


# -- the trained adapter, out ---------------------------------------------------------------------


def test_export_merged_loads_in_plain_transformers_with_the_same_logits(lora_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.model.load import load_policy

    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--merged", str(out)]) == 0
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    assert not [f for f in files if f.startswith("adapter") or f.endswith(".pt")]
    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert not hasattr(plain, "peft_config")
    with_adapter = load_policy(lora_run / "checkpoints" / "step-000003", torch.device("cpu")).eval()
    ids = AutoTokenizer.from_pretrained(str(out))("What is 2 + 3? The answer is", return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, with_adapter(input_ids=ids).logits
    assert (a - b).abs().max() < 1e-5
    # the adapter is in it: the merged weights differ from the base model's
    base = load_policy(
        Path(
            json.loads((lora_run / "checkpoints/step-000003/adapter_config.json").read_text())[
                "base_model_name_or_path"
            ]
        ),
        torch.device("cpu"),
    )
    assert changed(base.state_dict(), plain.state_dict())
    capsys.readouterr()
    assert main(["export", str(lora_run), "--merged", str(out)]) == 2  # never overwrites
    assert "is not empty" in capsys.readouterr().err


def test_export_of_a_full_fine_tuning_run_is_its_model(tiny_model_dir, tmp_path):
    from e2e_helpers import weights

    run = train(tiny_model_dir, tmp_path / "full", "steps=1", "eval_size=0")
    out = tmp_path / "exported"
    out.mkdir()  # an empty directory is fine
    assert main(["export", str(run), "--merged", str(out)]) == 0
    assert not changed(weights(out), weights(run / "checkpoints" / "step-000001"))


def test_eval_and_chat_load_the_adapter_checkpoint(lora_run, monkeypatch, capsys):
    capsys.readouterr()
    assert main(["eval", str(lora_run)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res == json.loads((lora_run / "summary.json").read_text())["eval_after"]  # the trained adapter, exactly
    lines = iter(["What is 1 + 1?", "/quit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert main(["chat", str(lora_run), "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert "model> " in capsys.readouterr().out


def test_a_new_adapter_on_a_lora_checkpoint_is_refused(lora_run, tmp_path, capsys):
    ck = lora_run / "checkpoints" / "step-000003"
    assert main(["train", f"model={ck}", f"out={tmp_path / 'again'}", *FAST, *LORA, "steps=1", "eval_size=0"]) == 2
    assert "grpolab export" in capsys.readouterr().err


def test_full_fine_tuning_from_a_lora_checkpoint_starts_from_the_merged_weights(lora_run, tmp_path):
    from e2e_helpers import weights

    ck = lora_run / "checkpoints" / "step-000003"
    merged = tmp_path / "merged"
    assert main(["export", str(ck), "--merged", str(merged)]) == 0  # a checkpoint directory works too
    out = train(ck, tmp_path / "full", "steps=1", "eval_size=0", "lr=1e-12", "max_grad_norm=0")
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[0]["params/trained"] == sum(v.numel() for v in weights(merged).values())
    assert metrics[0]["kl"] == 0.0  # the reference is the merged model the policy starts from
