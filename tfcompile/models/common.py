"""What every assembly shares: its interface, the vocabulary size it needs, weight
initialisation, and the checks on token-id inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from tfcompile.spec.schema import TransformerSpec


class Assembly(nn.Module):
    """A family's model: besides ``forward``, its spec section, the task heads that a run started
    from it (``train.init_from``) leaves behind, and example inputs (summaries, tracing)."""

    spec: Any
    heads: ClassVar[tuple[str, ...]] = ()

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor | None, ...]:
        raise NotImplementedError


def require_vocab_size(spec: TransformerSpec) -> int:
    """The spec's vocab_size, which a text model needs before it can be built."""
    if spec.vocab_size is None:
        raise ValueError(
            "model.vocab_size is not set: set it in the spec, or train, which takes it from the tokenizer"
        )
    return spec.vocab_size


def init_weights(module: nn.Module, std: float) -> None:
    """Linear and Embedding weights ~ N(0, std), Linear biases zero: GPT-2's initialisation
    without its 1/sqrt(2 n_layers) scaling of the residual projections (none is scaled).
    Use as ``model.apply(partial(init_weights, std=spec.init_std))``."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def check_token_ids(ids: torch.Tensor, name: str, max_seq_len: int, past: int = 0) -> None:
    """``ids`` must be an integer (batch, seq) tensor whose seq, after ``past`` cached tokens, fits
    in ``max_seq_len``: a ValueError naming the input otherwise. The length goes unchecked while an
    ONNX export traces the model: the step graphs are traced with more cached and new tokens than a
    short context holds (tfcompile.graphs.export), and an exported graph checks no length anyway
    (its manifest states the context)."""
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name} must be an integer tensor of shape (batch, seq), "
            f"got {ids.dtype} of shape {tuple(ids.shape)}"
        )
    if torch.onnx.is_in_onnx_export():
        return
    length = past + ids.shape[1]
    if length > max_seq_len:
        label = "sequence" if name == "input_ids" else name.removesuffix("_ids")
        raise ValueError(f"{label} length {length} exceeds the model's max_seq_len {max_seq_len}")
