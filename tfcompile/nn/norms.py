"""Normalisation layers (notes: cmu-11711-transformers.txt, "Layer Normalization", "RMSNorm").

Every norm takes ``(dim, eps, bias, scale)`` and maps ``(..., dim) -> (..., dim)``; without
``scale`` it has no g (OLMo's), without ``bias`` no b.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.nn.registry import NORMS


@NORMS.register("layernorm")
class LayerNorm(nn.Module):
    """LayerNorm(x) = g * (x - mean(x)) / sqrt(var(x) + eps) + b  (Ba et al. 2016)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


@NORMS.register("rmsnorm")
class RMSNorm(nn.Module):
    """RMSNorm(x) = g * x / sqrt(mean(x^2) + eps)  (Zhang and Sennrich 2019): no mean, no bias.

    The statistic is computed in float32 so that bf16/fp16 activations keep their precision; the
    weight scales the result in the input's type, the output's, as Llama's and T5's reference
    code do. (Scaled in float32, an fp16 graph of opset 23, where the exporter fuses the whole
    into one RMSNormalization, mixed an fp16 input with a float32 scale, which onnx rejects.)
    """

    def __init__(self, dim: int, eps: float = 1e-6, bias: bool = False, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        # eps as a one-element tensor: the ONNX exporter's optimizer removes the addition of a scalar
        # it finds close to 0 (within 1e-8), which left Helium's 1e-8 out and made a zero row inf;
        # made in float64 and cast, as a Python float is added, so that one past float32's range is inf
        eps = x32.new_tensor([self.eps], dtype=torch.float64).float()
        out = (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)).type_as(x)
        out = out if self.weight is None else out * self.weight.type_as(x)
        return out if self.bias is None else out + self.bias.type_as(x)
