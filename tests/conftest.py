"""Shared fixtures: a tiny randomly initialised Llama with the real SmolLM2 tokenizer, and the real model dir.

The real model's dequantised cache lives under $GRPOLAB_CACHE (default ~/.cache/grpolab). We leave that
variable alone for the whole session: pointing it at an empty directory would force a fresh ~25 s
dequantisation. Tests that check the caching itself use their own cache directory via monkeypatch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Make `grpolab` importable when the package is not installed (e.g. a plain checkout).
SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

# No hub, ever, from the test suite.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# threads=0 takes OMP_NUM_THREADS where it is set, before it measures the machine's load: every run of the
# suite computes with the same thread count whatever else runs beside it, so runs compared bit for bit
# cannot differ by it (tests/test_threads.py clears it to test the measurement).
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """Hugging Face directory of the bundled SmolLM2-135M-Instruct (dequantised once, then cached)."""
    from grpolab.model.load import model_dir

    return model_dir("smollm2-135m", log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, real_model_dir) -> Path:
    """A tiny random Llama (hidden 32, 2 layers) saved with the real SmolLM2 tokenizer and chat template."""
    from grpolab.model.load import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_src=real_model_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from grpolab.model.load import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture()
def tiny_model(tiny_model_dir):
    """A fresh fp32 copy of the tiny model per test (tests may attach hooks or change it)."""
    import torch

    from grpolab.model.load import load_policy

    model = load_policy(tiny_model_dir, torch.device("cpu"))
    model.eval()
    return model


def liven(model, seed: int = 0, std: float = 0.3, sharpen: float = 50.0):
    """Re-randomise the transformer blocks (std `std`) and scale the final norm by `sharpen`.

    A freshly initialised tiny Llama with tied embeddings mostly repeats its input token, with logits
    within 0.02 of each other. After this, its greedy continuations differ from prompt to prompt and
    token to token, and its next-token distributions are peaked enough that sampling is not uniform,
    so that comparisons between decoding paths (cache, padding, positions) mean something.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        model.model.norm.weight.mul_(sharpen)
    return model


@pytest.fixture()
def lively_model(tiny_model):
    """The tiny model, made to produce varied, peaked next-token distributions (see `liven`)."""
    return liven(tiny_model)


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """A run with `threads=N` (or a lab claim) sets torch's process-wide thread count; put it back, so
    that no test's float summation order (and so its exact numbers: tests/test_golden.py) depends on
    which tests ran before it."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def varied_reward():
    """The reward name `test_varied` (e2e_helpers.varied_score: varied rewards, so no group is skipped)
    in grpolab's registry for a module's tests; the registry is restored after them."""
    from e2e_helpers import varied_score

    from grpolab import rewards as rewards_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        yield


# The fast tier (`make test-fast`, `pytest -m fast`): the unit tests of the maths, rewards, config,
# tasks and templates, under 3 minutes on 2 cores. The full suite (`make test`) runs everything, the
# end-to-end runs of the CLI among it (tests/test_stops.py's signals and kills, for one).
FAST_MODULES = {
    "test_advantages",
    "test_losses",
    "test_algos",
    "test_kl",
    "test_unbiased",
    "test_shaping",
    "test_values",
    "test_config",
    "test_rewards_math",
    "test_rewards_format",
    "test_rewards_countdown",
    "test_rewards_tool_call",
    "test_rewards_custom",
    "test_rewards_scoring",
    "test_tasks",
    "test_docstrings",
    "test_layout",
    "test_env_schema",
    "test_gguf_tokenizer",
    "test_logprobs",
    "test_lmhead",
    "test_env_calls",
    "test_optim",
    "test_metrics",
    "test_stats",
}


# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadfile --no-loadscope-reorder`),
# a whole module at a time on a worker, so that a module's shared runs (module-scoped fixtures) are made
# once. The longest modules are handed out first (longest processing time first), so that neither worker
# is left alone with one of them at the end; the rest follow in file order.
LONG_FIRST = [
    "test_lab_aha",
    "test_distributed",
    "test_engine_vllm",
    "test_vllm_tensor_parallel",
    "test_stops",
    "test_agents_e2e",
    "test_bench",
    "test_gpu_script",
    "test_trackers",
    "test_real_model",
]


def _module(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module else ""


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # two workers on two cores: one torch thread each, in this process and in the runs it starts
        # (threads=0 reads OMP_NUM_THREADS; a run's own `threads=N` still applies)
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = _module(item)
        if module in FAST_MODULES and not item.get_closest_marker("slow") and not item.get_closest_marker("hostile"):
            item.add_marker(pytest.mark.fast)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable: file order otherwise


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory, real_model_dir) -> Path:
    """A tiny Llama whose 32-wide heads vLLM's CPU attention takes (hidden 128, 4 heads of 32, 2 layers),
    livened so that its distributions are peaked."""
    import torch

    from grpolab.model.load import load_policy, make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("vllm-model"), tokenizer_src=real_model_dir, hidden=128)
    model = liven(load_policy(out, torch.device("cpu")), std=0.15, sharpen=10.0)
    model.save_pretrained(out, safe_serialization=True)
    return out
