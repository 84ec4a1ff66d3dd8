"""grpolab.engine.native.kernels: the C decode-attention kernel against the torch attention (grpolab.model.attention) over
shapes, padding and lengths; shapes it does not take fall back; a missing or failing compiler and the
opt-out variable leave the torch path with a reason; the lean decode step gives the same logits with
and without it."""

from __future__ import annotations

import shutil

import pytest
import torch

from grpolab.engine.native import decoder, kernels
from grpolab.model.attention import grouped_query_attention
from grpolab.model.cache import left_pad

HAS_CC = bool(shutil.which("cc") or shutil.which("gcc"))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A kernel state loaded anew, building into an empty cache directory."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    kernels.reset()
    yield tmp_path
    kernels.reset()


def torch_attention(q, k, v, valid, S):
    N, nh, d = q.shape
    out, _ = grouped_query_attention(None, q[:, :, None], k[:, :, :S], v[:, :, :S], valid[:, None, None, :S])
    return out.view(N, nh, d)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_builds_here_and_lands_in_the_cache_directory(fresh):
    assert kernels.decode_attention() is not None, kernels.unavailable_reason()
    assert kernels.unavailable_reason() is None
    assert [p.suffix for p in (fresh / "kernels").iterdir()] == [".so"]  # no temporary left over


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
@pytest.mark.parametrize("nh,nkv,d", [(9, 3, 64), (4, 4, 16), (8, 2, 128), (6, 1, 32)])
def test_same_attention_as_torch_over_lengths_and_padding(nh, nkv, d):
    attend = kernels.decode_attention()
    g = torch.Generator().manual_seed(nh * d)
    N, cap = 5, 40
    q = torch.randn((N, nh, d), generator=g)
    k, v = torch.randn((N, nkv, cap, d), generator=g), torch.randn((N, nkv, cap, d), generator=g)
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[1, :7] = False  # left padding
    valid[3, 2:5] = False  # holes
    for S in (1, 8, 9, 23, cap):
        valid_s = valid.clone()
        valid_s[:, 0] |= S <= 7  # every row may look somewhere
        got = attend(q, k.transpose(-1, -2).contiguous(), v, valid_s, S, d**-0.5)  # keys as (N, nkv, d, cap)
        assert torch.allclose(got, torch_attention(q, k, v, valid_s, S), atol=1e-5, rtol=1e-4), S


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_shapes_and_layouts_it_does_not_take_return_none():
    attend = kernels.decode_attention()
    q, kt, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8, 600), torch.randn(2, 2, 600, 8)
    valid = torch.ones((2, 600), dtype=torch.bool)
    assert attend(q, kt, v, valid, 513, 1.0) is None  # longer than its score buffer
    assert attend(torch.randn(2, 34, 8), kt[:, :1], v[:, :1], valid, 10, 1.0) is None  # 34 query heads per kv head
    assert attend(q.bfloat16(), kt, v, valid, 10, 1.0) is None  # not fp32
    assert attend(q, kt.transpose(2, 3).contiguous().transpose(2, 3), v, valid, 10, 1.0) is None  # not contiguous
    assert attend(q, v, v, valid, 10, 1.0) is None  # keys not transposed (N, nkv, d, cap)


def test_opt_out_and_missing_or_failing_compiler_leave_the_torch_path(fresh, monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_ENV, "1")
    assert kernels.decode_attention() is None and kernels.DISABLE_ENV in kernels.unavailable_reason()
    monkeypatch.delenv(kernels.DISABLE_ENV)
    kernels.reset()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert kernels.decode_attention() is None and "no C compiler" in kernels.unavailable_reason()
    kernels.reset()
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    assert kernels.decode_attention() is None and "did not build" in kernels.unavailable_reason()
    assert not (fresh / "kernels").exists() or not any((fresh / "kernels").iterdir())


def test_the_library_name_changes_with_every_instruction_set_it_was_built_for():
    """The cache key covers what -march=native chose: a library built on an AVX-512 CPU and cached (a
    shared home, a copied cache) is never the file an AVX2-only CPU loads, nor an ARM CPU's x86 one."""
    src, ver = ["int f(void) { return 0; }"], "gcc 12.2.0"
    avx512 = "flags\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_tile\n"
    avx2 = "flags\t: fpu sse2 avx avx2 fma\n"
    isa512, isa2 = '"-march=sapphirerapids" -mavx2 -mavx512f', '"-march=znver2" -mavx2 -mno-avx512f'
    name = kernels.library_name(src, kernels.FLAGS, ver, avx512, isa512)
    assert name == kernels.library_name(src, kernels.FLAGS, ver, avx512, isa512)  # the same CPU reuses it
    assert name.startswith("grpolab_kernels-") and name.endswith(".so")
    others = {
        kernels.library_name(src, kernels.FLAGS, ver, avx2, isa2),
        kernels.library_name(src, kernels.FLAGS, ver, avx2, isa512),  # flags read differently, same compiler view
        kernels.library_name(src, kernels.FLAGS, ver, avx512, isa2),
        kernels.library_name(src, kernels.FLAGS, ver, "Features\t: fp asimd sve\n", "-mcpu=neoverse-v1"),
        kernels.library_name(src, kernels.build_flags(""), ver, avx512, ""),
    }
    assert name not in others and len(others) == 5
    assert "-march=native" not in kernels.build_flags("") and "-march=native" in kernels.build_flags(isa512, "")


@pytest.mark.skipif(not HAS_CC or "avx512f" not in kernels._cpu_flags(), reason="needs a C compiler and AVX-512")
def test_aten_cpu_capability_avx2_builds_the_kernels_for_avx2(fresh):
    """A process told to run as an AVX2 CPU (ATEN_CPU_CAPABILITY=avx2) gets kernels built without AVX-512:
    the panel product's panels are 8 columns (one AVX2 register) instead of 16, and its own library."""
    import subprocess
    import sys

    probe = (
        "from grpolab.engine.native import kernels; kernels.panel_pack(); "
        "print(kernels._state['fns']['grpolab_panel_width']())"
    )
    widths = {}
    for cap in ("avx2", "avx512"):
        env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": cap, "GRPOLAB_CACHE": str(fresh)}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        widths[cap] = int(done.stdout.split()[-1])
    assert widths == {"avx2": 8, "avx512": 16}
    assert len(list((fresh / "kernels").glob("*.so"))) == 2
    assert "-mno-avx512f" in kernels.build_flags("-mavx512f", "avx2")
    assert kernels.build_flags("-mavx512f", "avx512") == kernels.FLAGS


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_a_library_cached_for_another_cpu_is_not_loaded_here(fresh, monkeypatch):
    """Build here, then pretend the same cache is seen from a CPU with other instructions: that CPU
    builds its own library instead of loading this one; and a compiler that cannot say what native
    means gets a portable build (no -march=native) that passes the self-checks."""
    assert kernels.decode_attention() is not None, kernels.unavailable_reason()
    here = set((fresh / "kernels").iterdir())
    assert len(here) == 1
    assert "-march" in kernels._native_isa(shutil.which("cc") or shutil.which("gcc"))  # gcc and clang say it
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags\t: fpu sse2 avx avx2 fma\n")
    monkeypatch.setattr(kernels, "_native_isa", lambda cc: '"-march=znver2" -mavx2 -mno-avx512f')
    kernels.reset()
    assert kernels.decode_attention() is not None, kernels.unavailable_reason()
    other = set((fresh / "kernels").iterdir()) - here
    assert len(other) == 1
    built = []
    real_run = kernels.subprocess.run
    monkeypatch.setattr(kernels, "_native_isa", lambda cc: "")
    monkeypatch.setattr(kernels.subprocess, "run", lambda cmd, **kw: built.append(cmd) or real_run(cmd, **kw))
    kernels.reset()
    assert kernels.rope_attend() is not None, kernels.unavailable_reason("grpolab_rope_attend")
    assert len(set((fresh / "kernels").iterdir()) - here - other) == 1
    compile_cmd = [c for c in built if "-o" in c]
    assert len(compile_cmd) == 1 and "-march=native" not in compile_cmd[0] and "-O3" in compile_cmd[0]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_lean_decode_logits_same_with_and_without_the_kernel(monkeypatch):
    from test_decoder import lean_logits, prompts, tiny

    model = tiny("llama")
    ids, mask = left_pad(prompts(), pad_id=0)
    new = torch.randint(0, 300, (3, 6), generator=torch.Generator().manual_seed(3))
    kernels.reset()
    st = decoder.LeanStepper(decoder.weights_of(model, torch.float32), 4)
    st.prefill(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    assert st.cache.rope_attend is not None
    with_kernel = lean_logits(model, ids, mask, new)
    monkeypatch.setenv(kernels.DISABLE_ENV, "1")
    kernels.reset()
    without = lean_logits(model, ids, mask, new)
    kernels.reset()
    for a, b in zip(with_kernel, without):
        assert torch.allclose(a, b, atol=1e-5 * b.abs().max().item(), rtol=0)
    assert not all(torch.equal(a, b) for a, b in zip(with_kernel, without))  # the kernel did run


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the kernel is never loaded")
def test_loading_the_kernel_keeps_subnormal_floats(tiny_model_dir, tmp_path):
    """Built with -ffast-math, the library carried GCC's crtfastmath.o, which turns on flush-to-zero
    when it is loaded: after the first rollout numpy and torch flushed every subnormal to zero. Here,
    in a fresh process: load the kernel, train one step, and subnormals survive."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys, numpy as np, torch, grpolab\n"
        "from grpolab.engine.native import kernels\n"
        "assert kernels.decode_attention() is not None, kernels.unavailable_reason()\n"
        "grpolab.train({'model': sys.argv[1], 'seed': 1}, steps=1, G=2, batch_size=2, max_new_tokens=4,"
        " eval_size=0, progress=False, tensorboard=False, out=sys.argv[2])\n"
        "a = (np.array([1e-40], dtype=np.float32) * np.float32(1.0))[0]\n"
        "b = (torch.tensor([1e-40], dtype=torch.float32) * 1.0)[0].item()\n"
        "c = np.float64(5e-324) * 1.0\n"
        "print('SUBNORMALS', a > 0, b > 0, c > 0, float(np.finfo(np.float32).smallest_subnormal) > 0)\n"
    )
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop(kernels.DISABLE_ENV, None)
    res = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model_dir), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "SUBNORMALS True True True True" in res.stdout, (res.stdout[-2000:], res.stderr[-3000:])
    assert "smallest subnormal" not in res.stderr  # numpy's warning when FTZ is on


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
@pytest.mark.parametrize("nh,nkv,d", [(9, 3, 64), (4, 4, 16), (8, 2, 128), (6, 1, 32)])
def test_rope_attend_writes_the_cache_and_attends_as_torch_does(nh, nkv, d):
    """rope_attend = RoPE on q and k (the HF forward's rotate_half form), k and v into slot t of the
    cache, then the attention over slots <= t: against kernels.rope_reference and the torch attention."""
    rope_attend = kernels.rope_attend()
    g = torch.Generator().manual_seed(nh + d)
    N, cap = 5, 40
    valid = torch.ones((N, cap), dtype=torch.bool)
    valid[1, :7] = False  # left padding
    valid[3, 2:5] = False  # holes
    for t in (7, 8, 22, cap - 1):
        qkv = torch.randn((N, (nh + 2 * nkv) * d), generator=g)
        cos, sin = torch.randn((N, d), generator=g), torch.randn((N, d), generator=g)
        k, v = torch.randn((N, nkv, cap, d), generator=g), torch.randn((N, nkv, cap, d), generator=g)
        k_want, v_want = k.clone(), v.clone()
        heads = qkv.view(N, nh + 2 * nkv, d)
        qk = kernels.rope_reference(heads[:, : nh + nkv], cos[:, None], sin[:, None])
        k_want[:, :, t], v_want[:, :, t] = qk[:, nh:], heads[:, nh + nkv :]
        kt = k.transpose(-1, -2).contiguous()  # the keys' cache is (N, nkv, d, cap)
        got = rope_attend(qkv, cos, sin, kt, v, valid, t, nh, d**-0.5)
        want = torch_attention(qk[:, :nh], k_want, v_want, valid, t + 1)
        assert torch.allclose(got.view(N, nh, d), want, atol=1e-5, rtol=1e-4), t
        assert torch.allclose(kt.transpose(-1, -2), k_want, atol=1e-5, rtol=1e-5) and torch.equal(v, v_want)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_rope_attend_takes_nothing_it_cannot_read():
    rope_attend = kernels.rope_attend()
    N, nh, nkv, d, cap = 2, 4, 2, 8, 10
    qkv, cs = torch.randn(N, (nh + 2 * nkv) * d), torch.randn(N, d)
    k, v = torch.zeros(N, nkv, d, cap), torch.zeros(N, nkv, cap, d)
    valid = torch.ones((N, cap), dtype=torch.bool)
    assert rope_attend(qkv.bfloat16(), cs, cs, k, v, valid, 3, nh, 1.0) is None  # not fp32
    assert rope_attend(qkv, cs, cs, v, v, valid, 3, nh, 1.0) is None  # keys not transposed (N, nkv, d, cap)
    assert rope_attend(qkv[:, :-1], cs, cs, k, v, valid, 3, nh, 1.0) is None  # not (nh + 2 nkv) d columns
    assert rope_attend(qkv, cs, cs, k, v, valid, cap, nh, 1.0) is None  # slot beyond the cache
    assert not k.any() and not v.any()  # and nothing was written


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_fused_decode_layer_gives_the_same_logits_to_the_bit_as_its_kernels_one_by_one(monkeypatch):
    """An fp32 lean rollout's decode steps with a layer per C call (kernels.decode_layer) and with the
    layer's kernels called one at a time from Python: the same logits, bit for bit, at every step (the
    same kernels in the same order); with a bias on q, k, v (Qwen2) too."""
    from test_decoder import lean_logits, prompts, tiny

    assert kernels.decode_layer() is not None, kernels.unavailable_reason("grpolab_decode_layer")
    calls = []
    real = kernels.decode_layer
    monkeypatch.setattr(kernels, "decode_layer", lambda: lambda *a: calls.append(1) or real()(*a))
    for kind in ("llama", "qwen2"):
        model = tiny(kind)
        ids, mask = left_pad(prompts(), pad_id=0)
        new = torch.randint(0, 300, (3, 6), generator=torch.Generator().manual_seed(3))
        fused = lean_logits(model, ids, mask, new)
        assert calls, "the fused layer did not run"
        monkeypatch.setattr(kernels, "decode_layer", lambda: None)
        one_by_one = lean_logits(model, ids, mask, new)
        monkeypatch.setattr(kernels, "decode_layer", lambda: lambda *a: calls.append(1) or real()(*a))
        assert all(torch.equal(a, b) for a, b in zip(fused, one_by_one)), kind


def torch_draw(z, T, greedy, seed):
    from grpolab.engine.native.sampling import inverse_cdf_sample, sampling_logp

    logp = sampling_logp(z, T, 1.0)
    tok = logp.argmax(-1) if greedy else inverse_cdf_sample(logp.exp(), torch.Generator().manual_seed(seed))
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
@pytest.mark.parametrize("T", [1.0, 0.6, 1.7])
def test_sampler_draws_the_torch_paths_token_from_the_same_uniform_number(T):
    """The fused sampler against torch's log_softmax -> exp -> cumsum -> searchsorted over a 49k vocabulary,
    for seeds and temperatures: the same tokens, log-probs within float rounding; greedy is the first argmax."""
    sample = kernels.sample()
    z = torch.randn((16, 49152), generator=torch.Generator().manual_seed(7)) * 4
    z[3, 100] = z[3, 200] = z[3].max() + 1  # a tie for the argmax: the first one, as torch.argmax
    z[5, :40000] = float("-inf")  # probability 0: never drawn
    for seed in range(6):
        tok, lp = sample(z, T, False, torch.Generator().manual_seed(seed))
        want_tok, want_lp = torch_draw(z, T, False, seed)
        assert torch.equal(tok, want_tok), seed
        assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0), (lp - want_lp).abs().max()
        assert int(tok[5]) >= 40000
    tok, lp = sample(z, T, True, None)
    want_tok, want_lp = torch_draw(z, T, True, 0)
    assert torch.equal(tok, want_tok) and int(tok[3]) == 100
    assert torch.allclose(lp, want_lp, atol=2e-5, rtol=0)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the torch path is what runs")
def test_sample_token_takes_the_fused_sampler_for_plain_fp32_logits_only(monkeypatch):
    from grpolab.engine.native import sampling

    z = torch.randn((4, 500), generator=torch.Generator().manual_seed(1))
    calls = []
    real = kernels.sample()
    monkeypatch.setattr(kernels, "sample", lambda: lambda *a: calls.append(a) or real(*a))
    fused = sampling.sample_token(z, 0.8, 1.0, False, torch.Generator().manual_seed(2))
    assert len(calls) == 1
    sampling.sample_token(z, 0.8, 0.9, False, torch.Generator().manual_seed(2))  # top_p: the torch path
    sampling.sample_token(z.double(), 0.8, 1.0, False, torch.Generator().manual_seed(2))  # not fp32
    assert len(calls) == 1
    assert torch.equal(fused[0], torch_draw(z, 0.8, False, 2)[0])
    assert real(z.t(), 1.0, False, None) is None  # a row not contiguous: the torch path
