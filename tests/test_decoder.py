"""The lean decode step (grpolab.engine.native.decoder) against the model's own HF forward: the same logits for
Llama (grouped-query heads), Qwen2 (q/k/v biases) and a LoRA adapter merged in, with left padding and
rows leaving the batch; greedy rollouts token for token; the packed bf16 layout is exact; models it
does not support fall back to the HF forward."""

from __future__ import annotations

import pytest
import torch

from grpolab.engine.native import decoder, kernels
from grpolab.engine.native.generate import generate
from grpolab.engine.native.steppers import HFStepper, stepper_for
from grpolab.model.cache import left_pad, positions


def tiny(kind: str, seed: int = 0):
    """A random 3-layer model of the given family, hidden 64, 4 query heads over 2 KV heads."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True, rope_theta=500.0))
    with torch.no_grad():  # biases and weights far from init, so a wrong bias or layout shows
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.2)
    return model.eval()


def prompts():
    return [[5, 17, 99, 3, 250, 7, 8], [42, 11, 12], [1, 2, 3, 4, 5]]  # lengths differ: left padding


def hf_logits(model, ids, mask, new_tokens):
    """Next-token logits of the HF forward over the whole sequence (prompt + new tokens) at each step."""
    out = []
    for t in range(new_tokens.shape[1] + 1):
        full = torch.cat([ids, new_tokens[:, :t]], 1)
        fmask = torch.cat([mask, torch.ones_like(new_tokens[:, :t])], 1)
        with torch.no_grad():
            out.append(model(input_ids=full, attention_mask=fmask, position_ids=positions(fmask)).logits[:, -1])
    return out


def lean_logits(model, ids, mask, new_tokens, dtype=torch.float32):
    w = decoder.weights_of(model, dtype)
    assert w is not None, decoder.unsupported_reason(model)
    st = decoder.LeanStepper(w, new_tokens.shape[1] + 1)
    pos = positions(mask)[:, -1]
    with torch.no_grad():
        out = [st.prefill(ids, mask, positions(mask))]
        for t in range(new_tokens.shape[1]):
            pos = pos + 1
            out.append(st.step(new_tokens[:, t], pos))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_logits_equal_hf_forward_fp32(kind):
    model = tiny(kind)
    ids, mask = left_pad(prompts(), pad_id=0)
    new = torch.randint(0, 300, (3, 6), generator=torch.Generator().manual_seed(1))
    ref, got = hf_logits(model, ids, mask, new), lean_logits(model, ids, mask, new)
    scale = max(r.abs().max().item() for r in ref)
    for r, g in zip(ref, got):
        assert torch.allclose(g.float(), r, atol=2e-5 * scale, rtol=0), (g - r).abs().max()


def test_lean_bf16_is_as_close_to_fp32_as_hf_autocast():
    """bf16 weights in the lean step vs the HF forward under bf16 autocast, both against the fp32 HF
    forward: the same products in bf16, so the lean step's log-prob error is of the autocast path's
    size (bound: at most 2x autocast's largest |d log p| over the steps, plus 0.01)."""
    model = tiny("llama")
    ids, mask = left_pad(prompts(), pad_id=0)
    new = torch.randint(0, 300, (3, 4), generator=torch.Generator().manual_seed(2))
    exact = hf_logits(model, ids, mask, new)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = hf_logits(model, ids, mask, new)
    lean = lean_logits(model, ids, mask, new, torch.bfloat16)

    def err(xs):
        return max(
            (torch.log_softmax(x.float(), -1) - torch.log_softmax(e, -1)).abs().max().item() for x, e in zip(xs, exact)
        )

    assert 0 < err(lean) <= 2 * err(amp) + 0.01, (err(lean), err(amp))


def test_packed_bf16_layout_is_exact():
    layout = decoder.layout_for(torch.bfloat16, torch.device("cpu"), 16)
    if layout.name != "onednn":
        pytest.skip("this PyTorch build has no oneDNN linear ops: the lean step uses F.linear")
    W, b = torch.randn(48, 64).bfloat16(), torch.randn(48).bfloat16()
    x = torch.randn(5, 7, 64).bfloat16()
    w = decoder.Weights(*([None] * 10), torch.bfloat16, layout)
    assert torch.equal(decoder.linear(w, x, layout.pack(W), b), torch.nn.functional.linear(x, W, b))


@pytest.mark.parametrize("rows", [1, 5, 16, 23, 300])
def test_fp32_panel_layout_matches_f_linear_and_its_accumulation(rows):
    """The fp32 panel product (grpolab.engine.native.kernels' decode_linear.c) against F.linear in float64,
    for a tail of rows (5, 23), a tail of columns (out 50, not a multiple of the panel width), a bias, the
    residual's add, and more rows than one chunk (300 x 1000). Its sums over k run in order, so each
    output is within 1e-6 of sum_k |x_k W_nk| (a sum in order errs by at most K u sum |x_k W_nk|, u = 2^-24,
    here 6e-5 of it; a random walk of K roundings is about sqrt(K) u = 2e-6 of it, seen 1.4e-7); a
    missing or doubled term errs by about 1 (0.0016 of it)."""
    layout = decoder.layout_for(torch.float32, torch.device("cpu"), 16)
    if layout.name != "panels":
        pytest.skip(f"the C kernels are unavailable here: {kernels.unavailable_reason('grpolab_panel_linear')}")
    g = torch.Generator().manual_seed(rows)
    W, b = torch.randn((50, 1000), generator=g), torch.randn(50, generator=g)
    x, res = torch.randn((rows, 1000), generator=g), torch.randn((rows, 50), generator=g)
    w = decoder.Weights(*([None] * 10), torch.float32, layout)
    P = layout.pack(W)
    exact = torch.nn.functional.linear(x.double(), W.double(), b.double())
    tol = 1e-6 * (x.double().abs() @ W.double().abs().T)  # (rows, 50)
    got = decoder.linear(w, x, P, b)
    assert got.shape == (rows, 50) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= tol).all()
    summed = decoder.residual(w, res, x, P, b)
    assert ((summed.double() - (res.double() + exact)).abs() <= tol + 1e-6 * res.double().abs()).all()
    assert decoder.linear(w, x.view(rows, 1, 1000), P).shape == (rows, 1, 50)


def test_lora_adapter_is_merged_into_the_lean_weights():
    peft = pytest.importorskip("peft")
    model = tiny("llama")
    lm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.1))
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)  # a non-zero adapter (peft starts B at 0)
    lm.eval()
    ids, mask = left_pad(prompts(), pad_id=0)
    new = torch.randint(0, 300, (3, 3), generator=torch.Generator().manual_seed(3))
    for disabled in (False, True):
        ctx = lm.disable_adapter() if disabled else torch.no_grad()
        with ctx:
            ref, got = hf_logits(lm, ids, mask, new), lean_logits(lm, ids, mask, new)
        for r, g in zip(ref, got):
            assert torch.allclose(g, r, atol=1e-4), (disabled, (g - r).abs().max())
    with lm.disable_adapter():
        base = lean_logits(lm, ids, mask, new)[0]
    assert not torch.allclose(base, lean_logits(lm, ids, mask, new)[0], atol=1e-3)  # the adapter matters


def test_greedy_rollout_same_tokens_as_hf_with_rows_leaving(lively_model, tiny_tokenizer):
    """generate() through both steppers: identical greedy tokens and log-probs, with an EOS set that
    ends rows at different steps (so the cache drops rows mid-rollout)."""
    ids = [[1, 2, 3, 40, 50], [7, 8, 9], [100, 200, 300, 400]]
    free = generate(
        lively_model, tiny_tokenizer, ids, G=2, max_new_tokens=6, greedy=True, eos_ids=set(), lean=False
    ).completion_ids
    eos = {int(free[0, 1]), int(free[4, 4])}  # group 0 ends at its 2nd token, group 2 by its 5th
    runs = [
        generate(lively_model, tiny_tokenizer, ids, G=2, max_new_tokens=10, greedy=True, eos_ids=eos, lean=lean)
        for lean in (False, True)
    ]
    hf, lean = runs
    lengths = hf.lengths.tolist()
    assert min(lengths) < max(lengths), "no row left the batch early: the test would not exercise keep()"
    assert torch.equal(hf.completion_ids, lean.completion_ids)
    assert torch.equal(hf.completion_mask, lean.completion_mask)
    assert torch.allclose(hf.sample_logp, lean.sample_logp, atol=1e-4)


def test_sampled_rollout_same_as_hf_for_a_seed(lively_model, tiny_tokenizer):
    ids = [[1, 2, 3, 40, 50], [7, 8, 9]]
    runs = [
        generate(
            lively_model,
            tiny_tokenizer,
            ids,
            G=4,
            max_new_tokens=8,
            eos_ids=set(),
            lean=lean,
            generator=torch.Generator().manual_seed(0),
        )
        for lean in (False, True)
    ]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)


def test_unsupported_model_falls_back_to_hf_forward(tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2)).eval()
    assert "gpt2" in decoder.unsupported_reason(model)
    assert decoder.weights_of(model, torch.float32) is None
    assert isinstance(stepper_for(model, torch.float32, 4, lean=True), HFStepper)
    r = generate(
        model,
        tiny_tokenizer,
        [[1, 2, 3]],
        G=2,
        max_new_tokens=3,
        eos_ids=set(),
        generator=torch.Generator().manual_seed(0),
    )
    assert r.completion_ids.shape == (2, 3)


def test_hooked_model_takes_the_hf_forward():
    """A forward hook (a test's, a user's probe) must see every forward: such a model is not lean."""
    model = tiny("llama")
    model.lm_head.register_forward_hook(lambda mod, inp, out: out)
    assert "hooks on lm_head" in decoder.unsupported_reason(model)
    assert decoder.weights_of(model, torch.float32) is None


def test_decoder_key_is_validated():
    from grpolab.training.config import build_config
    from grpolab.util.fields import ConfigError

    with pytest.raises(ConfigError, match="decoder"):
        build_config({"decoder": "fast"})
    assert build_config({"decoder": "hf"}).decoder == "hf"
    assert build_config({}).decoder == "auto"


def test_auto_uses_the_lean_step_where_it_was_measured_faster():
    """The one rule of the lean decode step: auto picks it on a CPU (bf16 and fp32), lean always, hf
    never, and none of them for a model type outside the Llama family."""
    from grpolab.engine.native.decoder import lean_decodes

    assert lean_decodes("auto", "llama", torch.bfloat16, "cpu")
    assert lean_decodes("auto", "llama", None, "cpu")  # fp32 too, with its C kernels between the products
    assert not lean_decodes("auto", "qwen2", torch.bfloat16, "cuda")  # not measured on a GPU yet
    assert lean_decodes("lean", "mistral", None, "cpu") and lean_decodes("lean", "qwen2", torch.bfloat16, "cuda")
    assert not lean_decodes("hf", "llama", torch.bfloat16, "cpu")
    assert not lean_decodes("lean", "gpt2", torch.bfloat16, "cpu") and not lean_decodes(
        "auto", None, torch.bfloat16, "cpu"
    )


def test_the_native_engine_and_the_plan_take_the_lean_step_for_the_same_settings():
    """The native engine's choice (from the loaded model) and grpolab plan's (from the model's shape)
    agree for every decoder setting, precision and device of a tiny Qwen2."""
    from grpolab.engine.native.engine import NativeEngine
    from grpolab.training.config import build_config
    from grpolab.training.plan.estimate import regime_of
    from grpolab.training.plan.shapes import Shape

    model = tiny("qwen2")
    shape = Shape.from_config(model.config.to_dict(), "tiny")
    assert shape.model_type == "qwen2"
    seen = set()
    for setting in ("auto", "lean", "hf"):
        for dtype, precision in ((None, "fp32"), (torch.bfloat16, "bf16")):
            for kind in ("cpu", "cuda"):
                engine = NativeEngine(model, None, device=torch.device(kind), dtype=dtype, decoder=setting, eos_ids={0})
                cfg = build_config({}, [f"decoder={setting}", f"precision={precision}"])
                assert regime_of(cfg, shape, kind).lean == engine.lean, (setting, precision, kind)
                seen.add(engine.lean)
    assert seen == {True, False}
