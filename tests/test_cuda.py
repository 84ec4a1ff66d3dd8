"""The CUDA path: log-probs, rollouts and a short training run on a GPU (skipped without one).

benchmarks/gpu.sh runs these with `pytest -m cuda` on the GPU machine, where the bundled GGUF is not
installed: the tiny model here is built from the tokenizer grpolab ships
(src/grpolab/data/smollm2-tokenizer), not from the real model's cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import liven

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
]

TOKENIZER = Path(__file__).resolve().parents[1] / "src" / "grpolab" / "data" / "smollm2-tokenizer"
PROMPTS = ["What is 2+3?", "Hi", "Compute 17 * 23 and explain every step carefully.", "x"]


@pytest.fixture(scope="module")
def cuda_tiny_dir(tmp_path_factory) -> Path:
    from grpolab.model.load import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("cuda-tiny"), tokenizer_src=TOKENIZER)


@pytest.fixture(scope="module")
def tok(cuda_tiny_dir):
    from grpolab.model.load import load_tokenizer

    return load_tokenizer(cuda_tiny_dir)


def lively(path: Path, device: str):
    from grpolab.model.load import load_policy

    return liven(load_policy(path, torch.device("cpu")).eval()).to(device)


def test_completion_logp_on_cuda_equals_the_cpu(cuda_tiny_dir, tok):
    from grpolab.model.cache import left_pad
    from grpolab.model.logprobs import completion_logp, grouped_completion_logp
    from grpolab.model.template import chat_prompts

    ids, mask = left_pad(chat_prompts(tok, PROMPTS, None), tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    comp = torch.randint(3, len(tok), (len(PROMPTS), 12), generator=g)
    cmask = torch.ones(comp.shape)
    cmask[1, 7:] = 0  # one completion ended early
    out = {}
    for dev in ("cpu", "cuda"):
        model = lively(cuda_tiny_dir, dev)
        args = [x.to(dev) for x in (ids, mask, comp, cmask)]
        lp, ent = completion_logp(model, *args, with_entropy=True)
        glp, _ = grouped_completion_logp(model, *args, 1)  # the KV-cache path of the update
        out[dev] = (lp.cpu(), ent.cpu(), glp.cpu())
    for a, b in zip(out["cpu"], out["cuda"]):
        assert a.shape == b.shape
        assert (a - b).abs().max() < 1e-3, (a - b).abs().max()


def test_generate_on_cuda_with_a_cuda_generator(cuda_tiny_dir, tok):
    from grpolab.engine.native.generate import generate
    from grpolab.model.logprobs import completion_logp
    from grpolab.model.template import chat_prompts

    model = lively(cuda_tiny_dir, "cuda")
    ids = chat_prompts(tok, PROMPTS, None)

    def sample(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return generate(model, tok, ids, G=3, max_new_tokens=10, generator=gen)

    r = sample(0)
    assert r.completion_ids.shape[0] == len(PROMPTS) * 3 and r.completion_ids.device.type == "cpu"
    assert torch.equal(r.completion_ids, sample(0).completion_ids)  # the cuda generator's seed decides
    assert len(r.texts) == len(PROMPTS) * 3
    # the recorded sampling log-probs are the policy's (temperature 1, top_p 1), recomputed on the GPU
    lp, _ = completion_logp(
        model, *(x.cuda() for x in (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask))
    )
    m = r.completion_mask.bool()
    assert (lp.cpu()[m] - r.sample_logp[m]).abs().max() < 1e-3


def test_generate_under_bf16_autocast_on_cuda(cuda_tiny_dir, tok):
    from grpolab.engine.native.generate import generate
    from grpolab.model.precision import choose
    from grpolab.model.template import chat_prompts

    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    model = lively(cuda_tiny_dir, "cuda")
    assert choose("auto", model, torch.device("cuda")).rollout == torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = generate(
        model,
        tok,
        chat_prompts(tok, PROMPTS, None),
        G=2,
        max_new_tokens=8,
        generator=gen,
        autocast_dtype=torch.bfloat16,
    )
    assert torch.isfinite(r.sample_logp).all() and (r.sample_logp <= 0).all()


def test_two_training_steps_on_cuda(cuda_tiny_dir, tmp_path):
    from grpolab.app.cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"model={cuda_tiny_dir}",
            "device=cuda",
            "steps=2",
            "batch_size=8",
            "G=4",
            "max_new_tokens=8",
            "micro_batch=4",
            "eval_size=4",
            "save_every=2",
            "progress=false",
            "report=false",
            f"out={out}",
        ]
    )
    assert rc == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["memory/peak_mb"] > 0 for r in rows)  # the CUDA allocator's peak
    assert (out / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert "device: cuda" in (out / "config.yaml").read_text()


def test_two_fp16_training_steps_on_cuda_scale_the_loss_and_resume(cuda_tiny_dir, tmp_path, monkeypatch):
    """precision=fp16 on the GPU: fp16 autocast, the loss scaled by GradScaler("cuda"); the scale is logged
    and kept in each checkpoint, and a run resumed from step 1 ends with step 2's weights."""
    import shutil

    from e2e_helpers import changed, varied_score, weights

    from grpolab import rewards as rewards_mod
    from grpolab.app.cli import main

    monkeypatch.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
    args = [
        f"model={cuda_tiny_dir}",
        "device=cuda",
        "precision=fp16",
        "rewards=[{name: test_varied}]",
        "lr=1e-3",
        "steps=2",
        "batch_size=8",
        "G=4",
        "max_new_tokens=8",
        "micro_batch=4",
        "eval_size=4",
        "save_every=1",
        "keep_checkpoints=0",
        "progress=false",
        "report=false",
    ]
    out = tmp_path / "run"
    assert main(["train", f"out={out}", *args]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["update/loss_scale"] > 0 and r["update/nonfinite_skipped"] == 0 for r in rows)
    ck1, ck2 = (out / "checkpoints" / f"step-00000{i}" for i in (1, 2))
    assert (ck2 / "loss_scale.pt").is_file()
    assert changed(weights(ck1), weights(ck2)) or any(r["update/overflow_skipped"] for r in rows)
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000002")
    (resumed / "checkpoints" / "latest").write_text("step-000001\n")
    assert main(["train", "--resume", str(resumed), *args]) == 0
    ck = resumed / "checkpoints" / "step-000002"
    assert torch.load(ck / "loss_scale.pt", weights_only=True) == torch.load(ck2 / "loss_scale.pt", weights_only=True)
    a, b = weights(ck2), weights(ck)
    # within float noise: CUDA's backward may add in another order from run to run (atomics)
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) < 1e-5
