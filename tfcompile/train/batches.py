"""Training and validation batches, reproducible and off the critical path.

Batch ``index`` of a split depends only on (seed, split, index, micro-batch), so a resumed run
reads exactly the batches the uninterrupted run would have read, and the global batch is the same
whatever the number of processes (each takes its rows). On CUDA the next step's batches are built
and pinned in a background thread while the current step runs, then copied asynchronously.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from tfcompile.spec.schema import TrainSpec
from tfcompile.tasks.task import Batch, Task
from tfcompile.train.distributed import World


class BatchStream:
    def __init__(self, task: Task, spec: TrainSpec, world: World, device: torch.device) -> None:
        self.task = task
        self.spec = spec
        self.world = world
        self.device = device
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="batches")
        self._next: tuple[int, Future[list[Batch]]] | None = None

    def generator(self, split: str, index: int, micro: int = 0, seed: int | None = None) -> torch.Generator:
        key = f"{self.spec.seed if seed is None else seed}:{split}:{index}:{micro}".encode()
        return torch.Generator().manual_seed(
            int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")
        )

    def for_step(self, step: int) -> list[Batch]:
        """Step ``step``'s micro-batches, on the CPU; built while the previous step ran, and the
        next step's started now."""
        pending = self._next
        batches = pending[1].result() if pending and pending[0] == step else self._build(step)
        if step < self.spec.steps:
            self._next = (step + 1, self._prefetch.submit(self._build, step + 1))
        return batches

    def validation(self) -> Iterator[Batch]:
        """The batches every evaluation sees (the same each time, drawn with train.eval_seed), on
        the device. Every process evaluates all of them, in pieces of the rows it trains on: a
        global batch at once could exhaust a GPU that holds one process's share in training (the
        tasks' metrics are sums over rows, whatever pieces they come in)."""
        seed = self.spec.eval_seed
        batches = self.task.eval_batches(
            self.spec.eval_batches, self.spec.batch_size, lambda i: self.generator("val", i, seed=seed)
        )
        share = self.world.share(self.spec.batch_size)
        return (self.to_device(piece) for batch in batches for piece in _pieces(batch, share))

    def to_device(self, batch: Batch) -> Batch:
        return {name: t.to(self.device, non_blocking=True) for name, t in batch.items()}

    def close(self) -> None:
        self._prefetch.shutdown(cancel_futures=True)

    def _build(self, step: int) -> list[Batch]:
        """This rank's rows of each global micro-batch, pinned on CUDA for an asynchronous copy."""
        out = []
        for micro in range(self.spec.grad_accum):
            batch = self.task.batch("train", self.spec.batch_size, self.generator("train", step, micro))
            if self.world.distributed:
                rows = self.world.rows(self.spec.batch_size)
                batch = {name: tensor[rows] for name, tensor in batch.items()}
            if self.device.type == "cuda":
                batch = {name: tensor.pin_memory() for name, tensor in batch.items()}
            out.append(batch)
        return out


def _pieces(batch: Batch, rows: int) -> Iterator[Batch]:
    """``batch`` cut into pieces of at most ``rows`` rows, in order."""
    count = len(next(iter(batch.values())))
    for start in range(0, count, rows):
        yield {name: tensor[start : start + rows] for name, tensor in batch.items()}
