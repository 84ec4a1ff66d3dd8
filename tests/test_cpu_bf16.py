"""bf16_can_pay (grpolab.model.cpu_bf16): what a CPU has decides bf16 in milliseconds, before anything is
timed on the policy. The development machine has avx512_bf16, so CPUs without it are simulated: by
injecting their facts, and in a subprocess by the variables that cap torch's and oneDNN's instruction
sets (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpolab.model.cpu_bf16 import MATMUL_LIMIT, CpuFacts, bf16_can_pay, matmul_ratio, parse_cpuinfo, verdict_from_facts

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def facts(arch="x86", flags=("avx2", "fma"), onednn=True, capability="AVX2"):
    return CpuFacts(arch, "a CPU", capability, None if flags is None else frozenset(flags), onednn)


X86_INFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: another
flags\t\t: fpu
"""
ARM_INFO = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes sha1 sve bf16 i8mm
CPU part\t: 0xd40
"""


def test_cpuinfo_is_read_from_the_first_processor_on_x86_and_arm():
    assert parse_cpuinfo(X86_INFO) == ("AMD EPYC 7B13", frozenset({"fpu", "sse2", "avx", "avx2", "fma"}))
    model, flags = parse_cpuinfo(ARM_INFO)
    assert model == "0xd40" and "bf16" in flags and "sve" in flags
    assert parse_cpuinfo("processor\t: 0\n") == ("", None)  # no flags line: unknown, not "none"


@pytest.mark.parametrize(
    ("case", "cpu", "verdict"),
    [
        ("AVX2 laptop, Zen 2/3", facts(onednn=False), False),
        (
            "AVX-512 without bf16 (Skylake-X): oneDNN emulates",
            facts(flags=("avx2", "avx512f"), capability="AVX512"),
            False,
        ),
        ("Sapphire Rapids", facts(flags=("avx512f", "avx512_bf16", "amx_bf16"), capability="AVX512"), True),
        ("Zen 4", facts(flags=("avx512f", "avx512_bf16"), capability="AVX512"), True),
        ("capped by ONEDNN_MAX_CPU_ISA", facts(flags=("avx512_bf16",), onednn=False), False),
        ("Graviton 3", facts(arch="arm", flags=("asimd", "sve", "bf16"), capability="SVE256"), True),
        ("Graviton 2", facts(arch="arm", flags=("asimd",), onednn=False, capability="DEFAULT"), False),
        ("ARM, oneDNN unknown, no bf16", facts(arch="arm", flags=("asimd",), onednn=None), False),
        ("flags unreadable (macOS)", facts(arch="arm", flags=None, onednn=None), None),
    ],
)
def test_the_cpu_decides_where_its_instructions_settle_it(case, cpu, verdict):
    got, why = verdict_from_facts(cpu)
    assert got is verdict, (case, why)
    assert why


def timer_of(seconds: dict):
    """A matmul timer giving fixed seconds per dtype: [warm-up, then each repeat]; records its calls."""
    calls = []

    def timer(dtype, *, reps=3):
        calls.append((dtype, reps))
        return seconds[dtype][: 1 + reps]

    return timer, calls


def test_the_pre_check_is_min_over_min_and_a_scalar_fallback_stops_after_one_product():
    timer, calls = timer_of(
        {torch.float32: [0.010, 0.002, 0.003, 0.002], torch.bfloat16: [0.012, 0.001, 0.0008, 0.0009]}
    )
    assert matmul_ratio(timer) == pytest.approx(0.0008 / 0.002)  # min(bf16 repeats) / min(fp32 repeats)
    slow, calls = timer_of({torch.float32: [0.010, 0.002, 0.002, 0.002], torch.bfloat16: [0.090]})
    assert matmul_ratio(slow) == pytest.approx(0.090 / 0.002)  # 0.090 > SLOW_FIRST x 0.010: no repeats
    assert calls == [(torch.float32, 3), (torch.bfloat16, 0)]


def test_where_the_flags_are_unknown_one_product_in_each_precision_decides():
    unknown = facts(arch="arm", flags=None, onednn=None)
    scalar, _ = timer_of({torch.float32: [0.01, 0.002, 0.002, 0.002], torch.bfloat16: [0.09]})
    ok, why = bf16_can_pay("cpu", facts=unknown, timer=scalar)
    assert not ok and "x45.00" in why  # 0.090 / 0.002
    native, _ = timer_of({torch.float32: [0.01, 0.002, 0.002, 0.002], torch.bfloat16: [0.01, 0.001, 0.001, 0.001]})
    assert bf16_can_pay("cpu", facts=unknown, timer=native)[0]  # x0.50
    at_limit = {torch.float32: [0.01, 0.002, 0.002, 0.002], torch.bfloat16: [0.01] + [0.002 * MATMUL_LIMIT] * 3}
    assert bf16_can_pay("cpu", facts=unknown, timer=timer_of(at_limit)[0])[0]  # x2.00: not over the limit


def test_facts_that_settle_it_time_nothing():
    never, calls = timer_of({})
    assert bf16_can_pay("cpu", facts=facts(onednn=False), timer=never)[0] is False
    assert bf16_can_pay("cpu", facts=facts(flags=("avx512_bf16",), capability="AVX512"), timer=never)[0] is True
    assert calls == []


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available(),
    reason="the instruction-set caps simulated here are x86's and oneDNN's",
)
def test_a_cpu_without_bf16_simulated_by_the_isa_caps_gets_fp32_from_the_cpu_without_timing(tmp_path):
    """In a child with the caps set, torch runs at AVX2 and oneDNN has no bf16 kernel, whatever this CPU
    has; precision=auto on a policy (the tiny model, counted as large here) is fp32 with the CPU's reason,
    its probe never called."""
    script = textwrap.dedent(
        """
        import json, torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from grpolab.model import precision
        from grpolab.model.cpu_bf16 import bf16_can_pay, cpu_facts

        def probe(*a, **k):
            raise AssertionError("timed the policy")

        precision.SMALL_MODEL_PARAMS = 0
        model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, vocab_size=64))
        precision.update_seconds = probe
        p = precision.choose("auto", model, torch.device("cpu"), rollout_probe=probe)
        f = cpu_facts()
        print(json.dumps({"capability": f.capability, "onednn": f.onednn_bf16, "can_pay": bf16_can_pay("cpu"),
                          "line": p.describe(), "update": str(p.update), "rollout": str(p.rollout)}))
        """
    )
    env = {**os.environ, **AVX2_ONLY, "GRPOLAB_CACHE": str(tmp_path)}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["capability"] != "AVX512" and got["onednn"] is False
    assert got["can_pay"][0] is False and "no oneDNN bf16 kernel" in got["can_pay"][1]
    assert (got["rollout"], got["update"]) == ("None", "None")
    assert "auto, decided from the CPU: no oneDNN bf16 kernel" in got["line"]
    assert not list(tmp_path.rglob("*.json"))  # a decision from the CPU is not cached: it costs nothing
