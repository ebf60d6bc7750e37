"""Data parallelism under ``torchrun``: which process this is, and the collectives the trainer uses.

``torchrun --nproc_per_node N -m tfcompile train SPEC`` starts N processes with RANK, LOCAL_RANK
and WORLD_SIZE set; each holds the whole model (DistributedDataParallel averages the gradients)
and trains on its slice of every global batch. A plain ``tfcompile train`` is a world of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

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


def join_world(device_type: str) -> World:
    """Join the process group that torchrun describes in the environment (NCCL on CUDA, gloo on
    the CPU), or return a world of one when there is none."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    world = World(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), size)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return world


def leave_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
