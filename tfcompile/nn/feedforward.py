"""Position-wise feed-forward sublayers (notes: cmu-11711-transformers.txt, "Feed Forward Layers").

Plain:  FFN(x) = f(x W1 + b1) W2 + b2            (f = ReLU, GELU, SiLU, or squared ReLU: relu2, Primer)
Gated:  FFN(x) = (f(x W_gate) * u(x W_up)) W2     (SwiGLU: f = SiLU, GeGLU: f = GELU; Shazeer 2020;
                                                   u the identity but for GPT-OSS's swiglu_clamped:
                                                   f(g) = c(g) sigmoid(1.702 c(g)), c(g) = min(g, 7),
                                                   u(v) = clamp(v, -7, 7) + 1)

GELU is exact, x Phi(x) with the normal CDF (erf), or its tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (``gelu_tanh``, ``geglu_tanh``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.nn.ops import halves
from tfcompile.nn.registry import ACTIVATIONS
from tfcompile.spec.choices import GATED

# Each name's nonlinearity f; whether it gates is the spec's to say (tfcompile.spec.choices).
ACTIVATIONS.register("relu")(F.relu)
ACTIVATIONS.register("gelu")(F.gelu)
ACTIVATIONS.register("silu")(F.silu)
ACTIVATIONS.register("swiglu")(F.silu)
ACTIVATIONS.register("geglu")(F.gelu)


@ACTIVATIONS.register("relu2")
def _relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


CLAMP = 7.0  # GPT-OSS's swiglu_limit
SIGMOID_SCALE = 1.702  # its swiglu_alpha: x sigmoid(1.702 x) is the sigmoid approximation of GELU


@ACTIVATIONS.register("swiglu_clamped")
def _clamped_gate(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(max=CLAMP)
    return x * torch.sigmoid(SIGMOID_SCALE * x)


def _clamped_up(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-CLAMP, CLAMP) + 1


# What a gated activation does to the up projection before the product (the identity elsewhere).
UP: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"swiglu_clamped": _clamped_up}


@ACTIVATIONS.register("gelu_tanh")
@ACTIVATIONS.register("geglu_tanh")
def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.fn = ACTIVATIONS[activation]
        self.gated = activation in GATED
        self.up = UP.get(activation)
        # A gated FFN fuses W_gate and W_up into one matmul of twice the width.
        width = 2 * d_ff if self.gated else d_ff
        self.w_in = nn.Linear(d_model, width, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w_in(x)  # (B, T, d_ff) or (B, T, 2 * d_ff)
        if self.gated:
            gate, up = halves(h)
            h = self.fn(gate) * (up if self.up is None else self.up(up))
        else:
            h = self.fn(h)
        return self.w_out(h)
