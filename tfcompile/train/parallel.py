"""How the model spreads over the processes, decided in one place by ``train.parallel``.

ddp:   each process holds the whole model; DistributedDataParallel averages the gradients.
fsdp:  FSDP2 (``fully_shard``) shards the weights, gradients and optimizer state across the
       processes, one unit per Transformer block and the root (embeddings, final norm, heads):
       a block's weights are gathered just before its forward and backward and freed after, so a
       process holds its shard and one block at a time. With ``precision: bf16`` the gathered
       weights are bf16 and the gradients are reduced in fp32 (MixedPrecisionPolicy); with
       ``cpu_offload`` the shards, their gradients and the optimizer state live in host memory.

``train.activation_checkpointing`` recomputes each block's activations in the backward pass
instead of keeping them (in any world, sharded or not). Sharding and checkpointing act on the
model in place, before the optimizer is built (``prepare``); compilation and DDP give the module
the step calls (``wrap``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from tfcompile.nn.block import TransformerBlock
from tfcompile.spec.schema import TrainSpec
from tfcompile.train.distributed import World
from tfcompile.train.runs import TrainError

FSDP_TORCH = "2.6"  # the first torch with torch.distributed.fsdp.fully_shard


class FSDPUnavailable(TrainError):
    """train.parallel=fsdp with a torch that lacks FSDP2."""


def prepare(model: nn.Module, spec: TrainSpec, device: torch.device, compiles: bool) -> None:
    """In place, before the optimizer is built: activation checkpointing per block, and under
    ``parallel: fsdp`` the blocks (compiled first when ``compiles``) sharded one by one, then the root."""
    if spec.activation_checkpointing:
        for block in blocks(model):
            checkpoint_activations(block)
    if spec.parallel == "fsdp":
        shard(model, spec, device, compiles)


def wrap(model: nn.Module, spec: TrainSpec, world: World, device: torch.device, compiles: bool) -> Any:
    """The model as the training step calls it: compiled (a sharded model's blocks were compiled
    before sharding, by ``prepare``), and in DistributedDataParallel under torchrun with ddp."""
    if spec.parallel == "fsdp":
        return model
    forward = torch.compile(model) if compiles else model
    if world.distributed:
        ids = [device.index] if device.type == "cuda" else None
        forward = DistributedDataParallel(forward, device_ids=ids)
    return forward


def blocks(model: nn.Module) -> list[TransformerBlock]:
    return [m for m in model.modules() if isinstance(m, TransformerBlock)]


def checkpoint_activations(block: nn.Module) -> None:
    """Run ``block``'s forward under torch.utils.checkpoint (non-reentrant: the same dropout masks
    when it is recomputed) whenever gradients are recorded. In place: the state dict's names stay."""
    forward = block.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed


def shard(model: nn.Module, spec: TrainSpec, device: torch.device, compiles: bool) -> None:
    """``fully_shard`` each Transformer block, then the root. A block with cross-attention stays in
    the root's unit: the model computes its keys and values of the encoder's output outside the
    block's forward (``project_memory``), where a block's own unit would not be gathered."""
    fully_shard, policies = _fsdp(spec, device)
    for block in blocks(model):
        if block.cross is None:
            if compiles:
                block.compile()
            fully_shard(block, **policies)
    fully_shard(model, **policies)


@contextlib.contextmanager
def gradient_sync(forward: Any, world: World, sync: bool) -> Iterator[None]:
    """Inside: the backward passes reduce the gradients across processes only when ``sync`` (the
    last micro-batch of a step), under DDP and FSDP alike."""
    if sync or not world.distributed:
        yield
    elif isinstance(forward, DistributedDataParallel):
        with forward.no_sync():
            yield
    else:
        forward.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            forward.set_requires_gradient_sync(True)


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a number: clip_grad_norm_ returns a DTensor for sharded gradients."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _fsdp(spec: TrainSpec, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """``fully_shard`` and its policies for the spec (precision, cpu_offload), or FSDPUnavailable."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    except ImportError as e:
        raise FSDPUnavailable(
            f"train.parallel=fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard), which torch "
            f"{torch.__version__} lacks: install torch>={FSDP_TORCH}, or use train.parallel=ddp"
        ) from e
    if spec.precision == "bf16":
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        precision = MixedPrecisionPolicy()
    # Pinned host memory for the copies to the GPU; on the CPU there is nothing to pin.
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if spec.cpu_offload else OffloadPolicy()
    return fully_shard, {"mp_policy": precision, "offload_policy": offload}
