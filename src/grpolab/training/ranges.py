"""Integer settings whose range is set by what takes them (torch, the OS), checked with the config.

An out-of-range integer is a usage error naming the key (exit 2), never a traceback from deep inside torch:
`seed=99999999999999999999` (from a recipe, KEY=VALUE or --trl) raised RuntimeError in torch.manual_seed.
"""

from __future__ import annotations

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""The seeds torch.manual_seed takes; outside them it raises (RuntimeError: Overflow when unpacking long)."""


def range_checks(cfg) -> list[tuple[bool, str, str]]:
    """(ok, key, what it must be) for grpolab.training.config's checks: seed and data_seed within
    [SEED_MIN, SEED_MAX]."""
    seed_range = f"an integer from {SEED_MIN} to {SEED_MAX} (torch's seed range)"
    return [
        (SEED_MIN <= cfg.seed <= SEED_MAX, "seed", f"must be {seed_range}"),
        (cfg.data_seed is None or SEED_MIN <= cfg.data_seed <= SEED_MAX, "data_seed", f"must be null or {seed_range}"),
    ]


__all__ = ["SEED_MAX", "SEED_MIN", "range_checks"]
