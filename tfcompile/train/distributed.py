"""Data parallelism under ``torchrun``: which process this is, and the collectives the trainer uses.

``torchrun --nproc_per_node N -m tfcompile train SPEC`` starts N processes with RANK, LOCAL_RANK
and WORLD_SIZE set; each trains on its slice of every global batch, holding the whole model (DDP)
or its shard of it (FSDP, tfcompile.train.parallel). A plain ``tfcompile train`` is a world of one,
with a process group of its own under FSDP (which shards over a group, here of one process).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    joined: bool = False  # whether this process joined a process group (leave_world leaves it)

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes the run folder: spec, checkpoints, metrics, progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch: contiguous, equal shares."""
        share = batch_size // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def mean(self, value: float, device: torch.device) -> float:
        """The mean of ``value`` over all ranks (a no-op in a world of one)."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.item() / self.size

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when it is True on any (so that all ranks stop at the same step)."""
        if not self.distributed:
            return flag
        tensor = torch.tensor([int(flag)], device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    def from_main(self, produce: Callable[[], T]) -> T:
        """``produce()`` run on rank 0 alone, its result on every rank; what it raises, every rank
        raises (so that no rank waits for a collective that another left)."""
        if not self.distributed:
            return produce()
        outcome: list[tuple[T | None, Exception | None]] = [(None, None)]
        if self.is_main:
            try:
                outcome = [(produce(), None)]
            except Exception as e:
                dist.broadcast_object_list([(None, _portable(e))], src=0)
                raise
        dist.broadcast_object_list(outcome, src=0)
        value, error = outcome[0]
        if error is not None:
            raise error
        return value  # type: ignore[return-value]


def join_world(device_type: str, group_of_one: bool = False) -> World:
    """Join the process group that torchrun describes in the environment (NCCL on CUDA, gloo on
    the CPU). Without torchrun, a world of one: with ``group_of_one``, in a process group of its
    own (an in-memory store, no port), else in none."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        if not group_of_one:
            return World()
        if not dist.is_initialized():
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return World(joined=True)
    world = World(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), size, joined=True)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return world


def leave_world(world: World) -> None:
    if world.joined and dist.is_initialized():
        dist.destroy_process_group()


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP shards ``model``'s weights across the processes (tfcompile.train.parallel)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 shards nothing
        return False
    return isinstance(model, FSDPModule)


def _portable(error: Exception) -> Exception:
    """``error``, or a RuntimeError with its message when it cannot be sent to the other ranks."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
