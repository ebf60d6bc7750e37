"""Where training runs: the device, the process group under torchrun, numerics (TF32, autocast),
and the model as the step calls it (tfcompile.train.parallel: torch.compile, DDP or FSDP)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tfcompile.memory import gigabytes, physical_memory, too_large
from tfcompile.spec.schema import Spec, TrainSpec
from tfcompile.train import parallel
from tfcompile.train.distributed import World, join_world, world_size
from tfcompile.train.runs import TrainError, TrainingFailed


@dataclass(frozen=True)
class Placement:
    device: torch.device
    world: World
    precision: str  # fp32, bf16 or fp16

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def compiles(self, spec: TrainSpec) -> bool:
        """torch.compile: as the spec says; by default on CUDA, where it pays, and off on the CPU."""
        return spec.compile if spec.compile is not None else self.device.type == "cuda"

    def memory(self) -> int:
        """Bytes of memory on the device training runs on."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).total_memory
        return physical_memory()

    def check_fits(self, spec: Spec) -> None:
        """Refuse a spec whose training cannot fit in the device's memory, before anything is
        allocated (the operating system would kill the process rather than raise): a lower bound
        of what a process holds, the model's state (its shard, under FSDP) and the outputs of its
        rows of a batch, against the memory."""
        params = spec.parameter_count() or 0
        shards = self.world.size if spec.train.parallel == "fsdp" else 1
        state = 16 * params // shards  # fp32 weights and gradients, and the optimizer's two moments
        rows = self.world.share(spec.train.batch_size)
        tokens = rows * spec.context_length
        outputs = 2 * tokens * max(spec.model.vocab_size or 0, spec.model.d_model)  # 16-bit at least
        if spec.train.cpu_offload:  # the state lives in host memory, beside the device
            state = 0
        available = self.memory()
        if too_large(state + outputs, available):
            where = f"{self.device.type} memory ({gigabytes(available)})"
            share = (
                f", this process's share of the {spec.train.batch_size:,} rows"
                if self.world.distributed
                else ""
            )
            raise TrainingFailed(
                f"training needs at least {gigabytes(state)} for the model's {params:,} parameters (their "
                f"gradients and optimizer state included) and {gigabytes(outputs)} for one batch's outputs "
                f"({rows:,} x {spec.context_length:,} tokens{share}), more than the {where}: lower "
                + (
                    "model.d_model, model.n_layers or the vocabulary"
                    if state > outputs
                    else "train.batch_size"
                )
            )

    def wrap(self, model: nn.Module, spec: TrainSpec) -> Any:
        """The model as the training step calls it (tfcompile.train.parallel decides)."""
        return parallel.wrap(model, spec, self.world, self.device, self.compiles(spec))


@contextlib.contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """PyTorch's CPU threads set to ``count`` inside (None: left as they are), restored after."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def place(spec: TrainSpec) -> Placement:
    """Resolve train.device, join torchrun's process group if there is one (one GPU per local
    rank), and turn on TF32 tensor cores for fp32 matmuls on CUDA."""
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device is cuda, but no CUDA device is available; use auto or cpu")
    choice = spec.device if spec.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(choice)
    size = world_size()  # checked before joining: every process refuses alike, none left waiting
    if spec.batch_size % size:
        raise TrainError(
            f"train.batch_size ({spec.batch_size}) is the global batch and must divide evenly "
            f"among the {size} processes: use a multiple of {size}"
        )
    world = join_world(device.type, group_of_one=spec.parallel == "fsdp")
    if world.distributed and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if device.type == "cuda":  # TF32 tensor cores for fp32 matmuls (10-bit mantissa)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return Placement(device, world, spec.precision)
