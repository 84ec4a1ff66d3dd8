"""grpolab.parallel.allocator: with freed memory kept, a re-allocated large tensor faults no pages in anew."""

import platform
import subprocess
import sys

import pytest

from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

PROBE = """
import resource, sys, torch
from grpolab.parallel.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.set_num_threads(1)  # no worker thread allocating between the free and the next block
def faults_of_new_block(floats):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(floats)  # written, then freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_new_block(16 << 20)  # 64 MB: new memory either way
# a slightly smaller block fits in the freed one (one of the same size need not: torch asks malloc for
# 64-byte aligned memory, which takes a little more than the block itself)
print(applied, faults_of_new_block((16 << 20) - 4096))
"""


def faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    applied, n = out.stdout.split()
    return applied == "True", int(n)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_memory_is_reused_without_page_faults():
    applied, kept = faults("keep")
    _, system = faults("system")
    assert applied
    # 64 MB is 16,384 pages of 4 KB: malloc as it is maps a new block each time and faults them in
    # (16,381 here; far fewer where transparent huge pages are always on, but never none); with freed
    # memory kept the second block is the first one again (0 here).
    assert kept < 1000
    assert kept < system


def test_cpu_malloc_key_is_validated():
    assert build_config({"cpu_malloc": "system"}).cpu_malloc == "system"
    with pytest.raises(ConfigError, match="cpu_malloc"):
        build_config({"cpu_malloc": "jemalloc"})
