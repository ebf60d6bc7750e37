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


def require_fits(nbytes: int, params: int) -> None:
    """Refuse to build a model whose weights and buffers (``nbytes``; ``params`` parameters) cannot
    fit in memory: the operating system would kill the process, or the allocation fail deep inside
    PyTorch, instead."""
    available = physical_memory()
    if too_large(nbytes, available):
        raise TooLarge(
            f"the model's {params:,} parameters and its buffers (positions, masks) take "
            f"{gigabytes(nbytes)}, more than this machine's memory ({gigabytes(available)}): lower "
            f"model.d_model, model.n_layers, model.max_seq_len or the vocabulary"
        )
