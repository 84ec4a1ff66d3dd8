"""precision=fp16 (grpolab.model.loss_scale): the loss scaler's arithmetic with worked numbers on CPU tensors
(torch.amp.GradScaler("cpu") runs the same rule as on CUDA), its state through a checkpoint, a run's exact
resume with it, and the refusal on a CPU. The CUDA run itself is in tests/test_cuda.py."""

from __future__ import annotations

import shutil

import pytest
import torch
from e2e_helpers import changed, read_jsonl, varied_score, weights

from grpolab import rewards as rewards_mod
from grpolab.app.cli import main
from grpolab.model.loss_scale import (
    LOSS_SCALE,
    finish_step,
    fp16_refusal,
    next_scale,
    scale_loss,
    scale_of,
    unscale_and_clip,
)

CPU = torch.device("cpu")
SMALL = ["batch_size=8", "G=4", "max_new_tokens=8", "micro_batch=4", "eval_size=4", "progress=false", "report=false"]


def one_param(init_scale: float, **kw):
    w = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    return w, opt, torch.amp.GradScaler("cpu", init_scale=init_scale, **kw)


def test_scale_unscale_clip_and_step_with_worked_numbers():
    # L = 3 w0 + 4 w1 -> g = (3, 4), ||g|| = 5; S = 8: backward(S L) gives (24, 32)
    w, opt, scaler = one_param(8.0)
    loss = (w * torch.tensor([3.0, 4.0])).sum()
    assert float(scale_loss(scaler, loss).detach()) == 8 * 7.0
    scale_loss(scaler, loss).backward()
    assert w.grad.tolist() == [24.0, 32.0]
    # unscale: (24, 32) / 8 = (3, 4), norm 5; clipped to 1: (0.6, 0.8)
    norm, overflow = unscale_and_clip(scaler, opt, [w], max_norm=1.0)
    assert norm == pytest.approx(5.0) and not overflow
    assert w.grad.tolist() == pytest.approx([0.6, 0.8])
    finish_step(scaler, opt, apply=True)  # SGD lr 1: w = (1 - 0.6, 1 - 0.8)
    assert w.tolist() == pytest.approx([0.4, 0.2])
    assert scale_of(scaler) == 8.0  # one good step of 2000: the scale stays


def test_an_overflow_skips_the_step_and_halves_the_scale():
    # L = 1e38 (w0 + w1): S L's gradient is 1e38 * 65536 = inf in fp32
    w, opt, scaler = one_param(65536.0)
    scale_loss(scaler, (w * 1e38).sum()).backward()
    norm, overflow = unscale_and_clip(scaler, opt, [w], max_norm=1.0)
    assert overflow and not torch.isfinite(torch.tensor(norm))
    finish_step(scaler, opt, apply=False)
    assert w.tolist() == [1.0, 1.0]  # not stepped
    assert scale_of(scaler) == 32768.0
    # the next micro-batch trains normally at the lower scale: L = w0 -> g = (1, 0)
    opt.zero_grad(set_to_none=True)
    scale_loss(scaler, w[0]).backward()
    assert w.grad.tolist() == [32768.0, 0.0]
    norm, overflow = unscale_and_clip(scaler, opt, [w], max_norm=0.0)  # 0: measured, not clipped
    assert (norm, overflow) == (1.0, False)
    finish_step(scaler, opt, apply=True)
    assert w.tolist() == [0.0, 1.0]


def test_without_a_scaler_the_steps_are_the_plain_ones():
    w, opt, _ = one_param(1.0)
    loss = (w * torch.tensor([3.0, 4.0])).sum()
    assert scale_loss(None, loss) is loss
    loss.backward()
    assert unscale_and_clip(None, opt, [w], max_norm=1.0) == (pytest.approx(5.0), False)
    finish_step(None, opt, apply=True)
    assert w.tolist() == pytest.approx([0.4, 0.2]) and scale_of(None) is None


def test_next_scale_is_gradscalers_rule():
    """next_scale's worked numbers, and the same (S, tracker) as GradScaler over a run of good and
    overflowing steps (growth_interval 3 so that growth happens)."""
    assert next_scale(65536.0, 0, True) == (32768.0, 0)
    assert next_scale(1024.0, 1999, False) == (2048.0, 0)
    assert next_scale(1024.0, 5, False) == (1024.0, 6)
    w, opt, scaler = one_param(16.0, growth_interval=3)
    ours = (16.0, 0)
    for found_inf in [False, False, False, True, False, False, False, False, True, True]:
        opt.zero_grad(set_to_none=True)
        scale_loss(scaler, (w * (1e38 if found_inf else 1.0)).sum()).backward()
        _, overflow = unscale_and_clip(scaler, opt, [w], max_norm=0.0)
        assert overflow == found_inf
        finish_step(scaler, opt, apply=not overflow)
        ours = next_scale(*ours, found_inf, interval=3)
        assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == ours


def test_the_scalers_state_goes_through_a_checkpoint(tiny_model_dir, tmp_path):
    """loss_scale.pt is written inside the checkpoint (a component) and loads into a fresh scaler: the same
    scale and growth tracker, so the resumed run goes on where it was."""
    from grpolab.model.load import load_policy, load_tokenizer
    from grpolab.training.checkpoint import load_checkpoint, save_checkpoint

    w, opt, scaler = one_param(1024.0, growth_interval=5)
    for found_inf in (False, True, False, False):  # S: 1024 -> 512; tracker 2
        opt.zero_grad(set_to_none=True)
        scale_loss(scaler, (w * (1e38 if found_inf else 1.0)).sum()).backward()
        _, overflow = unscale_and_clip(scaler, opt, [w], max_norm=0.0)
        finish_step(scaler, opt, apply=not overflow)
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == (512.0, 2)
    model = load_policy(tiny_model_dir, CPU)
    ck = save_checkpoint(tmp_path, 1, model, load_tokenizer(tiny_model_dir), None, None, {}, components={"x": scaler})
    assert (ck / "x.pt").is_file()
    fresh = torch.amp.GradScaler("cpu")
    load_checkpoint(ck, model, None, None, components={"x": fresh})
    assert fresh.state_dict() == scaler.state_dict()
    assert fresh.get_scale() == 512.0


def test_fp16_is_refused_on_a_cpu_with_exit_2_before_a_model_loads(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"model={tiny_model_dir}", f"out={out}", "device=cpu", "precision=fp16", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "precision=fp16 needs a CUDA GPU" in err and "use precision=bf16" in err
    assert "Traceback" not in err and not out.exists()
    assert "fsdp=true" in fp16_refusal(torch.device("cuda"), sharded=True)
    assert "critic" in fp16_refusal(torch.device("cuda"), critic=True)
    assert fp16_refusal(torch.device("cuda")) is None


@pytest.fixture()
def fp16_on_the_cpu(monkeypatch):
    """The run's fp16 path on the CPU, for its wiring only: the refusal lifted (CPU autocast does have fp16,
    slowly), a reward that varies within groups so that the update runs."""
    from grpolab.training import trainer

    monkeypatch.setattr(trainer, "fp16_refusal", lambda *a, **k: None)
    monkeypatch.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)


def test_an_fp16_run_scales_its_loss_checkpoints_the_scale_and_resumes_exactly(
    fp16_on_the_cpu, tiny_model_dir, tmp_path
):
    """Two steps with precision=fp16 (autocast fp16, the loss scaled), a checkpoint after each: the scale is
    logged and in each checkpoint; resuming from step 1 gives step 2's weights and scale bit for bit."""
    args = [
        f"model={tiny_model_dir}",
        "precision=fp16",
        "decoder=hf",
        "rewards=[{name: test_varied}]",
        "lr=1e-3",
        "steps=2",
        "save_every=1",
        "keep_checkpoints=0",
        *SMALL,
    ]
    out = tmp_path / "straight"
    assert main(["train", f"out={out}", *args]) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["update/loss_scale"] for r in rows] == [65536.0, 65536.0]  # 2 good updates of 2000
    assert [r["update/overflow_skipped"] for r in rows] == [0.0, 0.0]
    assert all(r["update/nonfinite_skipped"] == 0.0 and r["update/seqs_computed"] > 0 for r in rows)
    ck1, ck2 = (out / "checkpoints" / f"step-00000{i}" for i in (1, 2))
    assert torch.load(ck2 / f"{LOSS_SCALE}.pt", weights_only=True)["scale"] == 65536.0
    assert changed(weights(ck1), weights(ck2)), "the fp16 update did not move the weights"
    assert changed(weights(tiny_model_dir), weights(ck1))
    assert '"update": "fp16"' in (out / "precision.json").read_text()

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000002")
    (resumed / "checkpoints" / "latest").write_text("step-000001\n")
    assert main(["train", "--resume", str(resumed), *args]) == 0
    diff = changed(weights(ck2), weights(resumed / "checkpoints" / "step-000002"))
    assert not diff, f"the resumed fp16 run's step-2 weights differ: {diff[:5]}"
    again = torch.load(resumed / "checkpoints" / "step-000002" / f"{LOSS_SCALE}.pt", weights_only=True)
    assert again == torch.load(ck2 / f"{LOSS_SCALE}.pt", weights_only=True)
