"""The devices a plan is made for: a card by name or size (CARDS, parse_memory), this machine as it is
now (this_machine), and a training run's own device with the memory it can still have (device_of_run).

--memory takes a size (24GB, 80GiB) or a card (CARDS: rtx4090, rtx5090, a100-80gb, h100-80gb); a
size is planned with the card of that size (24 GB: RTX 4090, 32 GB: RTX 5090, 80 GB: A100 80GB).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from grpolab.util.fields import ConfigError

GB = 1 << 30
USABLE = 0.92
"""Share of a GPU's memory a run can use: the CUDA context and the caching allocator's fragmentation
take the rest (the plan counts allocated bytes, as torch.cuda.max_memory_allocated does)."""


@dataclass(frozen=True)
class Device:
    """A device to plan for: its memory, matmul rates and memory bandwidth."""

    name: str
    memory: int
    bf16_flops: float
    fp32_flops: float
    bandwidth: float
    kind: str = "cuda"

    @property
    def usable(self) -> int:
        return int(self.memory * (USABLE if self.kind == "cuda" else 1.0))


CARDS: dict[str, Device] = {
    "rtx4090": Device("RTX 4090 (24 GB)", 24 * GB, 165.2e12, 82.6e12, 1.008e12),
    "rtx5090": Device("RTX 5090 (32 GB)", 32 * GB, 209.5e12, 104.8e12, 1.792e12),
    "a100-80gb": Device("A100 80GB", 80 * GB, 312e12, 19.5e12, 2.039e12),
    "h100-80gb": Device("H100 SXM 80GB", 80 * GB, 989e12, 67e12, 3.35e12),
}
"""Dense bf16 tensor-core rate (fp32 accumulation), fp32 rate and memory bandwidth from each vendor's
datasheet (A100/H100: fp32 without tensor cores)."""
BY_SIZE = {24: "rtx4090", 32: "rtx5090", 80: "a100-80gb"}


def parse_memory(text: str) -> Device:
    """A card name (CARDS) or a size: 24GB, 24 GB, 80GiB, 32G (GB and GiB are both read as 2^30 bytes,
    as cards are sold); a size names the card of that size, or a card of that memory at the RTX 5090's rates."""
    key = text.strip().lower().replace(" ", "").replace("_", "-")
    if key in CARDS:
        return CARDS[key]
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|gb|gib)?", key)
    if not m:
        raise ConfigError(f"--memory: {text!r} is neither a size (24GB, 32GB, 80GB) nor a card ({', '.join(CARDS)})")
    size = float(m.group(1))
    if size <= 0:
        raise ConfigError(f"--memory: {text!r} must be more than 0 GB")
    card = BY_SIZE.get(int(size)) if size == int(size) else None
    if card:
        return CARDS[card]
    base = CARDS["rtx5090"]
    return Device(f"{size:g} GB GPU (RTX 5090 rates)", int(size * GB), base.bf16_flops, base.fp32_flops, base.bandwidth)


def this_machine() -> Device:
    """The CUDA GPU here, else this CPU: its total memory, and matmul rates and bandwidth measured now
    (a 1024^3 product in each precision, a 256 MB copy; well under a second)."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = props.name.lower().replace(" ", "")
        card = next((c for k, c in CARDS.items() if k.split("-")[0].replace("rtx", "") in name), CARDS["rtx5090"])
        return Device(props.name, props.total_memory, card.bf16_flops, card.fp32_flops, card.bandwidth)
    rates = {}
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(1024, 1024, dtype=dt)
        a @ a
        t = time.perf_counter()
        for _ in range(3):
            a @ a
        rates[dt] = 3 * 2 * 1024**3 / (time.perf_counter() - t)
    x = torch.empty(1 << 26)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    y.copy_(x)
    bandwidth = 2 * x.numel() * 4 / (time.perf_counter() - t)
    return Device("this CPU", _available_cpu_bytes(), rates[torch.bfloat16], rates[torch.float32], bandwidth, "cpu")


def device_of_run(run) -> Device:
    """The run's own device with the memory it can have now: a GPU's free memory plus what this process
    already holds; on a CPU the memory the system reports available plus this process's resident set."""
    import torch

    if run.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(run.device)
        held = torch.cuda.memory_allocated(run.device)
        return Device(torch.cuda.get_device_name(run.device), int(min(total, free + held) / USABLE), 0, 0, 1, "cuda")
    return Device("this CPU", _available_cpu_bytes(), 0, 0, 1, "cpu")


def _available_cpu_bytes() -> int:
    """MemAvailable (/proc/meminfo) plus this process's resident set; 0 where /proc is not there."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return (int(info["MemAvailable"].split()[0]) + int(status["VmRSS"].split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return 0


__all__ = ["BY_SIZE", "CARDS", "GB", "USABLE", "Device", "device_of_run", "parse_memory", "this_machine"]
