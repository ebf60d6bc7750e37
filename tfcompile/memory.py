"""How much memory this machine has, so that a spec too large for it is refused before training
or data loading starts (naming the field to lower) rather than killed by the operating system."""

from __future__ import annotations

import os

from tfcompile.errors import UserError

GB = 1 << 30


class TooLarge(UserError):
    """What a spec asks for cannot fit in this machine's memory."""


def physical_memory() -> int:
    """Bytes of memory on this machine (the CPU's)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_large(needed: float, available: int) -> bool:
    """Whether ``needed`` bytes would not fit: leave a tenth for everything else."""
    return needed > 0.9 * available


def gigabytes(n: float) -> str:
    return f"{n / GB:,.1f} GB"


def require_weights_fit(params: int) -> None:
    """Refuse to allocate ``params`` float32 weights that cannot fit in memory: the operating system
    would kill the process (or the allocation fail deep inside PyTorch) instead."""
    needed, available = 4 * params, physical_memory()
    if too_large(needed, available):
        raise TooLarge(
            f"the model's {params:,} parameters take {gigabytes(needed)} as float32 weights, more "
            f"than this machine's memory ({gigabytes(available)}): lower model.d_model, model.n_layers "
            f"or the vocabulary"
        )
