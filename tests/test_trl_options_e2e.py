"""`grpolab train` with TRL's options together on the tiny model: the sampling filters, a linear schedule
with a warm-up ratio, SAPO with two updates per rollout, the entropy bonus, masked truncated completions,
the TR-DPO reference update (saved in each checkpoint), the template's kwargs."""

from __future__ import annotations

import pytest
import torch
import yaml
from e2e_helpers import changed, read_jsonl, weights

from grpolab.app.cli import main

pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: test_varied in the registry

OPTIONS = [
    "algo=sapo",
    "algo.beta=0.04",
    "algo.steps_per_generation=2",
    "algo.entropy_coef=0.01",
    "algo.sync_ref_model=true",
    "algo.sync_ref_model_steps=1",
    "algo.sync_ref_model_alpha=0.5",
    "top_k=20",
    "min_p=0.01",
    "repetition_penalty=1.1",
    "lr_scheduler=linear",
    "warmup_ratio=0.25",
    "chat_template_kwargs.enable_thinking=false",
    "lr=1e-3",
]
SMALL = [
    "steps=2",
    "batch_size=8",
    "G=4",
    "max_new_tokens=6",
    "micro_batch=4",
    "eval_size=0",
    "progress=false",
    "samples_per_step=2",
    "tensorboard=false",
    "report=false",
    "save_every=1",
    "keep_checkpoints=2",
    "rewards=[{name: test_varied}]",
]


def test_trl_options_train_end_to_end(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", *SMALL, *OPTIONS]) == 0
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert (written["top_k"], written["min_p"], written["repetition_penalty"]) == (20, 0.01, 1.1)
    assert written["chat_template_kwargs"] == {"enable_thinking": False} and written["lr_scheduler"] == "linear"
    assert (written["algo"]["objective"], written["algo"]["steps_per_generation"]) == ("sapo", 2)
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    # 2 steps x 2 updates = 4 updates, ceil(0.25 * 4) = 1 warm-up update; linear: update i at lr (4 - i) / 3.
    # The logged lr is the one the step's first update used: update 0's (warm-up 0/1: 0, as transformers' linear
    # schedule starts), update 2's 2/3.
    assert [m["lr"] for m in lines] == pytest.approx([0.0, 1e-3 * 2 / 3])
    for m in lines:
        assert m["ref/synced"] == 2.0  # sync_ref_model_steps=1: after each of the step's two updates
        assert m["loss/entropy"] == pytest.approx(0.01 * m["entropy"], rel=0.2)  # coef x mean entropy
        assert m["update/nonfinite_skipped"] == 0.0
    # the second part's log pi_old is the sampling policy, its update came after the first's: ratio != 1
    assert any(m["ratio/mean"] != pytest.approx(1.0, abs=1e-7) for m in lines)
    ck = out / "checkpoints"
    ref2 = torch.load(ck / "step-000002" / "reference.pt", weights_only=True)
    ref1 = torch.load(ck / "step-000001" / "reference.pt", weights_only=True)
    assert changed(ref1, ref2), "the reference did not move between steps"
    policy = weights(ck / "step-000002")
    common = sorted(set(policy) & set(ref2))
    assert common and changed({k: policy[k] for k in common}, {k: ref2[k].to(policy[k].dtype) for k in common}), (
        "the reference is a mix, not a copy of the policy"
    )


def test_masked_truncated_completions_move_nothing(tiny_model_dir, tmp_path):
    """The tiny model never writes EOS, so every completion hits max_new_tokens: with
    algo.mask_truncated_completions the loss reads no token and the weights stay exactly as they were."""
    out = tmp_path / "masked"
    assert (
        main(
            [
                "train",
                f"model={tiny_model_dir}",
                f"out={out}",
                *SMALL,
                "steps=1",
                "algo=dapo",
                "lr=1e-2",
                "algo.mask_truncated_completions=true",
            ]
        )
        == 0
    )
    (m,) = read_jsonl(out / "metrics.jsonl")
    assert m["update/masked_truncated"] == 8.0 and m["completion/truncated_frac"] == 1.0
    assert not changed(weights(tiny_model_dir), weights(out / "checkpoints" / "step-000001"))
    unmasked = tmp_path / "unmasked"
    assert main(["train", f"model={tiny_model_dir}", f"out={unmasked}", *SMALL, "steps=1", "algo=dapo", "lr=1e-2"]) == 0
    assert changed(weights(tiny_model_dir), weights(unmasked / "checkpoints" / "step-000001"))


def test_sync_ref_model_with_lora_is_refused(tiny_model_dir, tmp_path):
    pytest.importorskip("peft", reason="the lora extra (in the test extra) is not installed")
    rc = main(
        ["train", f"model={tiny_model_dir}", f"out={tmp_path / 'lora'}", *SMALL, "algo.sync_ref_model=true", "lora.r=4"]
    )
    assert rc == 2
