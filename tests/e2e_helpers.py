"""Helpers shared by the end-to-end tests (imported by test_e2e.py and test_e2e_algos.py) and by the tests
of the scripts in benchmarks/ (benchmark_script)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType

import torch

from grpolab.util import fileio


def benchmark_script(name: str) -> ModuleType:
    """benchmarks/NAME.py loaded as a module (the folder is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def varied_score(completion: str, example) -> float:
    """A test reward that varies within a group even for a random model: (sum of char codes mod 5) / 4."""
    return (sum(map(ord, completion)) % 5) / 4


def read_jsonl(path: Path) -> list[dict]:
    """Every record of a JSONL file the run wrote; a line that is not a JSON object fails the test."""
    return fileio.read_jsonl(path, strict=True)


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names of the parameters that differ between two state dicts."""
    common = sorted(set(a) & set(b))
    assert common, "no common parameter names"
    return [k for k in common if not torch.equal(a[k], b[k])]


def padded_sequences(
    vocab: int,
    prompts: tuple[int, int],
    completions: tuple[int, int],
    seed: int,
    pad: tuple[int, int],
    cut: tuple[int, int],
):
    """Random prompt ids (B, P) and completion ids (N, C) with masks: prompt row pad[0] left-padded by
    pad[1] positions, completion row cut[0] ending after cut[1] tokens."""
    g = torch.Generator().manual_seed(seed)
    p_ids, c_ids = torch.randint(0, vocab, prompts, generator=g), torch.randint(0, vocab, completions, generator=g)
    p_mask, c_mask = torch.ones_like(p_ids), torch.ones(completions)
    p_mask[pad[0], : pad[1]] = 0
    c_mask[cut[0], cut[1] :] = 0
    return p_ids, p_mask, c_ids, c_mask
