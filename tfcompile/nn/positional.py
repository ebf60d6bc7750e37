"""Positional encodings (notes: cmu-11711-transformers.txt, "Positional Encoding" to "RoPE").

Schemes act in different places, so each overrides one of three hooks and inherits no-ops for the
others: ``embed`` adds to the token embeddings (sinusoidal, learned), ``rotary`` rotates queries and
keys inside attention (RoPE), ``attention_bias`` adds to the attention scores (relative).
The model calls all three once per forward and hands the results to every layer.

Positions are (T,) or, per row, (B, T): a token's position is the number of real tokens before
it (``positions_from_mask``), so a left-padded row is encoded as it would be alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tfcompile.nn.registry import POSITIONAL

if TYPE_CHECKING:
    from tfcompile.spec import schema

Rotary = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class PositionalDims:
    d_model: int
    n_heads: int
    head_dim: int
    max_seq_len: int
    bidirectional: bool  # False for causal models: relative buckets then only look back
    grid: int | None = None  # images: positions are a grid x grid patch grid (row-major) ...
    prefix: int = 0  # ... after this many tokens that have no place on it ([CLS])


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """mask (B, T), 1 at real tokens -> positions (B, T): how many real tokens come before each one.
    A left-padded row's first real token is at position 0, as it would be alone; padding (which
    nothing attends to) takes position 0 too."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class PositionalEncoding(nn.Module):
    def __init__(self, spec: Any, dims: PositionalDims) -> None:
        super().__init__()

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, T, d_model), positions: (T,) or (B, T) -> (B, T, d_model)."""
        return x

    def rotary(self, positions: torch.Tensor) -> Rotary | None:
        """positions: (T,) or (B, T) -> (cos, sin), each (T or B, T, head_dim / 2), or None."""
        return None

    def attention_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """(Tq,), (Tk,) or (B, Tq), (B, Tk) -> additive score bias (1 or B, n_heads, Tq, Tk), or None."""
        return None


def build_positional(
    spec: schema.TransformerSpec, bidirectional: bool, grid: int | None = None, prefix: int = 0
) -> PositionalEncoding:
    """The spec's positional encoding for a stack that looks both ways (encoders) or back only
    (causal decoders: relative buckets then cover earlier keys alone); images give their patch
    ``grid`` and the ``prefix`` tokens before it."""
    assert spec.max_seq_len is not None  # every family resolves it
    dims = PositionalDims(
        spec.d_model, spec.n_heads, spec.head_dim, spec.max_seq_len, bidirectional, grid, prefix
    )
    return POSITIONAL[spec.positional.type](spec.positional, dims)


@POSITIONAL.register("none")
class NoPositional(PositionalEncoding):
    pass


def sinusoidal_table(max_len: int, dim: int) -> torch.Tensor:
    """PE[t, 2k] = sin(t * w_k), PE[t, 2k+1] = cos(t * w_k), w_k = 10000^(-2k/d). -> (max_len, dim)"""
    t = torch.arange(max_len, dtype=torch.float64)[:, None]
    w = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(max_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(t * w)
    table[:, 1::2] = torch.cos(t * w)
    return table.float()


def sinusoidal_2d_table(grid: int, dim: int) -> torch.Tensor:
    """Fixed positions on a grid x grid patch grid, row-major: the first dim / 2 features are the
    1-D sinusoidal encoding of the row, the last dim / 2 of the column (as in MAE). -> (grid², dim)"""
    axis = sinusoidal_table(grid, dim // 2)  # (grid, dim / 2)
    rows = axis[:, None, :].expand(grid, grid, dim // 2)
    cols = axis[None, :, :].expand(grid, grid, dim // 2)
    return torch.cat((rows, cols), dim=-1).flatten(0, 1)


@POSITIONAL.register("sinusoidal")
class SinusoidalPositional(PositionalEncoding):
    """Fixed sin/cos of the position (Vaswani et al. 2017); on an image's patch grid, of the row
    and of the column, with zeros for the tokens in front of the grid."""

    table: torch.Tensor

    def __init__(self, spec: Any, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        if dims.grid is None:
            table = sinusoidal_table(dims.max_seq_len, dims.d_model)
        else:
            table = torch.cat(
                (torch.zeros(dims.prefix, dims.d_model), sinusoidal_2d_table(dims.grid, dims.d_model))
            )
        # Fixed, so not part of the state dict: checkpoints hold learned weights only.
        self.register_buffer("table", table, persistent=False)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.table[positions].to(x.dtype)


@POSITIONAL.register("learned")
class LearnedPositional(PositionalEncoding):
    def __init__(self, spec: Any, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        self.table = nn.Embedding(dims.max_seq_len, dims.d_model)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.table(positions).to(x.dtype)


@POSITIONAL.register("rope")
class RotaryPositional(PositionalEncoding):
    """RoPE (Su et al. 2021): rotate each pair (x_{2i}, x_{2i+1}) by the angle m * theta^(-2i/d)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, spec: schema.RopePositional, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        half = dims.head_dim // 2
        inv_freq = spec.theta ** (-torch.arange(half, dtype=torch.float64) * 2 / dims.head_dim)
        angles = torch.arange(dims.max_seq_len, dtype=torch.float64)[:, None] * inv_freq  # (T, hd/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def rotary(self, positions: torch.Tensor) -> Rotary:
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """x: (B, H, T, head_dim) with pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); cos and
    sin are (T, head_dim / 2) or, per row, (B, T, head_dim / 2)."""
    cos, sin = (t.unsqueeze(-3) for t in rotary)  # the same angles for every head
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, H, T, hd/2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.flatten(-2).type_as(x)


def relative_position_bucket(
    relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucketing of (key - query) offsets: exact for small offsets, log-spaced up to
    max_distance, and, when bidirectional, separate buckets for keys before and after the query."""
    distance = -relative  # > 0 when the key is before the query
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (distance < 0).long() * num_buckets
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


@POSITIONAL.register("relative")
class RelativePositional(PositionalEncoding):
    """T5-style learned scalar bias per head and offset bucket, shared by all layers."""

    def __init__(self, spec: schema.RelativePositional, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        self.num_buckets = spec.num_buckets
        self.max_distance = spec.max_distance
        self.bidirectional = dims.bidirectional
        self.bias = nn.Embedding(spec.num_buckets, dims.n_heads)

    def attention_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        q, k = q_positions.reshape(-1, q_positions.shape[-1]), k_positions.reshape(-1, k_positions.shape[-1])
        relative = k[:, None, :] - q[:, :, None]  # (1 or B, Tq, Tk)
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.bias(buckets).permute(0, 3, 1, 2)  # (1 or B, H, Tq, Tk)
