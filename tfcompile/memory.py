"""How much memory this machine has, so that a spec too large for it is refused before training
or data loading starts (naming the field to lower) rather than killed by the operating system."""

from __future__ import annotations

import os

GB = 1 << 30


def physical_memory() -> int:
    """Bytes of memory on this machine (the CPU's)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_large(needed: float, available: int) -> bool:
    """Whether ``needed`` bytes would not fit: leave a tenth for everything else."""
    return needed > 0.9 * available


def gigabytes(n: float) -> str:
    return f"{n / GB:,.1f} GB"
