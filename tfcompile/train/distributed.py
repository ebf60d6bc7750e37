"""Data parallelism under ``torchrun``: which process this is, and the collectives the trainer uses.

``torchrun --nproc_per_node N -m tfcompile train SPEC`` starts N processes with RANK, LOCAL_RANK
and WORLD_SIZE set; each trains on its slice of every global batch, holding the whole model (DDP)
or its shard of it (FSDP, tfcompile.train.parallel). A plain ``tfcompile train`` is a world of one,
with a process group of its own under FSDP (which shards over a group, here of one process).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from tfcompile.errors import UserError

T = TypeVar("T")
# Whether this process created a process group, whose threads outlive leave_world (see end_process).
_grouped = False
# What torchrun sets for each process, beside WORLD_SIZE, and a world of several processes needs.
TORCHRUN_VARIABLES = ("RANK", "MASTER_ADDR", "MASTER_PORT")


class WorldError(UserError, RuntimeError):
    """The processes of a run cannot work together: torchrun's environment is incomplete, or
    another process of the run stopped."""


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

    def share(self, batch_size: int) -> int:
        """How many rows of a global batch each rank takes."""
        return batch_size // self.size

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch: contiguous, equal shares."""
        share = self.share(batch_size)
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

    @contextlib.contextmanager
    def stops_with_others(self, then: Callable[[], str]) -> Iterator[None]:
        """Inside: a collective that fails because another process of the run stopped (its own
        error, a kill, the out-of-memory killer) is a WorldError saying so, then ``then()`` (which
        checkpoint is intact), instead of the backend's traceback on every surviving process."""
        try:
            yield
        except RuntimeError as e:
            if not self.distributed or not _lost_peer(e):
                raise
            raise WorldError(
                f"process {self.rank} of {self.size} stops: another process of the run stopped (the first "
                f"failure torchrun reports says why); {then()}"
            ) from e


def world_size() -> int:
    """The number of processes torchrun started (WORLD_SIZE; 1 without torchrun), known before any
    process joins a group: a refusal every process reaches before joining leaves no peer waiting
    in gloo's or NCCL's connection to it."""
    return _environment("WORLD_SIZE", "1")


def join_world(device_type: str, group_of_one: bool = False) -> World:
    """Join the process group that torchrun describes in the environment (NCCL on CUDA, gloo on
    the CPU). Without torchrun, a world of one: with ``group_of_one``, in a process group of its
    own (an in-memory store, no port), else in none."""
    global _grouped
    backend = "nccl" if device_type == "cuda" else "gloo"
    size = world_size()
    if size == 1:
        if not group_of_one:
            return World()
        if not dist.is_initialized():
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            _grouped = True
        return World(joined=True)
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise WorldError(
            f"WORLD_SIZE is {size} in the environment, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing: start the processes with torchrun "
            f"(torchrun --nproc_per_node {size} -m tfcompile train ...), which sets them all, or unset "
            f"WORLD_SIZE to train in one process"
        )
    rank = _environment("RANK")
    if rank >= size:
        raise WorldError(f"RANK is {rank} in the environment, not below WORLD_SIZE ({size})")
    world = World(rank, _environment("LOCAL_RANK", "0"), size, joined=True)
    if not dist.is_initialized():
        dist.init_process_group(backend)
        _grouped = True
    return world


def leave_world(world: World) -> None:
    if world.joined and dist.is_initialized():
        dist.destroy_process_group()


def end_process(status: int) -> int:
    """``status``, where this process created no process group; where it did, the process ends
    here with ``status`` (os._exit, its output flushed) instead of finalizing the interpreter.

    A gloo worker thread drops its reference to a collective's tensors after the collective has
    returned (it still held them when all_reduce returned in 3% to 13% of 2,000 calls per process,
    measured under torchrun on a 2-core machine), and destroy_process_group stops no thread while
    DDP or FSDP still holds the group. When the worker's reference is the last one to a tensor
    Python created, dropping it takes the GIL, and CPython ends a thread that takes the GIL while
    the interpreter finalizes with pthread_exit, which unwinds through gloo's noexcept destructor:
    std::terminate, SIGABRT, and torchrun reports a run that finished as failed. By the time the
    command returns, the run's files are written and closed and its lock released: no finalizer is
    left that the run needs."""
    if not _grouped:
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP shards ``model``'s weights across the processes (tfcompile.train.parallel)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 shards nothing
        return False
    return isinstance(model, FSDPModule)


def _environment(name: str, default: str = "0") -> int:
    """The number in torchrun's environment variable ``name`` (WORLD_SIZE at least 1), or a WorldError."""
    text = os.environ.get(name, default)
    if not text.strip().isdigit() or (name == "WORLD_SIZE" and int(text) < 1):
        raise WorldError(
            f"{name} is {text!r} in the environment, not a number of processes or a process's index: "
            f"torchrun sets it for the processes it starts; unset it to train in one process"
        )
    return int(text)


def _lost_peer(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective failing because another process left: a c10d error
    (NCCL's, the store's) or a broken connection of gloo's transport."""
    return isinstance(error, dist.DistError) or "/gloo/transport/" in str(error)


def _portable(error: Exception) -> Exception:
    """``error``, or a RuntimeError with its message when it cannot be sent to the other ranks."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
