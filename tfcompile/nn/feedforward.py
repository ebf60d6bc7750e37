"""Position-wise feed-forward sublayers (notes: cmu-11711-transformers.txt, "Feed Forward Layers").

Plain:  FFN(x) = f(x W1 + b1) W2 + b2
Gated:  FFN(x) = (f(x W_gate) * (x W_up)) W2      (SwiGLU: f = SiLU, GeGLU: f = GELU; Shazeer 2020)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.nn.registry import ACTIVATIONS


@dataclass(frozen=True)
class Activation:
    fn: Callable[[torch.Tensor], torch.Tensor]
    gated: bool


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS.register("relu")(Activation(F.relu, gated=False))
ACTIVATIONS.register("gelu")(Activation(F.gelu, gated=False))
ACTIVATIONS.register("gelu_tanh")(Activation(_gelu_tanh, gated=False))
ACTIVATIONS.register("silu")(Activation(F.silu, gated=False))
ACTIVATIONS.register("swiglu")(Activation(F.silu, gated=True))
ACTIVATIONS.register("geglu")(Activation(F.gelu, gated=True))


class FeedForward(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        # A gated FFN fuses W_gate and W_up into one matmul of twice the width.
        width = 2 * d_ff if self.activation.gated else d_ff
        self.w_in = nn.Linear(d_model, width, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w_in(x)  # (B, T, d_ff) or (B, T, 2 * d_ff)
        if self.activation.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.activation.fn(gate) * up
        else:
            h = self.activation.fn(h)
        return self.w_out(h)
