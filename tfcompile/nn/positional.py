"""Positional encodings (notes: cmu-11711-transformers.txt, "Positional Encoding" to "RoPE").

Schemes act in different places, so each overrides one of three hooks and inherits no-ops for the
others: ``embed`` adds to the token embeddings (sinusoidal, learned), ``rotary`` rotates queries and
keys inside attention (RoPE), ``attention_bias`` adds to the attention scores (relative).
The model calls all three once per forward and hands the results to every layer (``layer_rotaries``:
each layer its RoPE, where some layers turn at their own theta).

Positions are (T,) or, per row, (B, T): a token's position is the number of real tokens before
it (``positions_from_mask``), so a left-padded row is encoded as it would be alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from tfcompile.nn.ops import halves
from tfcompile.nn.registry import POSITIONAL

if TYPE_CHECKING:
    from tfcompile.spec import schema


class Rotary(NamedTuple):
    """RoPE's angles for the positions at hand: cos and sin (T or B, T, rotary_dims / 2), and which
    dimensions rotate together (the spec's ``layout``). A head's first rotary_dims dimensions
    rotate (all of head_dim unless the spec's ``rotary_dims`` says fewer). ``query_scale``: what
    each turned query is multiplied by (T or B, T, 1), where the spec has ``query_scaling``."""

    cos: torch.Tensor
    sin: torch.Tensor
    layout: str = "interleaved"
    query_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class PositionalDims:
    d_model: int  # the embeddings' width, which added positions take (an encoder's embedding_size)
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
        """positions: (T,) or (B, T) -> (cos, sin), each (T or B, T, rotary_dims / 2), or None."""
        return None

    def layer_rotaries(self, positions: torch.Tensor, n_layers: int) -> list[Rotary | None]:
        """The rotary of each of a stack's ``n_layers`` layers: ``rotary``'s, the same for all."""
        return [self.rotary(positions)] * n_layers

    def attention_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """(Tq,), (Tk,) or (B, Tq), (B, Tk) -> additive score bias (1 or B, n_heads, Tq, Tk), or None."""
        return None


def build_positional(
    spec: schema.TransformerSpec, bidirectional: bool, grid: int | None = None, prefix: int = 0
) -> PositionalEncoding:
    """The spec's positional encoding for a stack that looks both ways (encoders) or back only
    (causal decoders: relative buckets then cover earlier keys alone); images give their patch
    ``grid`` and the ``prefix`` tokens before it."""
    assert spec.max_seq_len is not None and spec.head_dim is not None  # every family resolves them
    dims = PositionalDims(
        spec.embedding_width, spec.n_heads, spec.head_dim, spec.max_seq_len, bidirectional, grid, prefix
    )
    return POSITIONAL[spec.positional.type](spec.positional, dims)


@POSITIONAL.register("none")
class NoPositional(PositionalEncoding):
    pass


def sinusoidal_table(
    max_len: int, dim: int, layout: str = "interleaved", spacing: str = "vaswani", offset: int = 0
) -> torch.Tensor:
    """PE[t, 2k] = sin(t * w_k), PE[t, 2k+1] = cos(t * w_k), w_k = 10000^(-2k/d) (spacing
    tensor2tensor: 10000^(-k/(d/2 - 1)), fairseq's and M2M100's); with the halves layout the same
    values as [sin(t * w), cos(t * w)] (Marian's). Row i is position t = offset + i. -> (max_len, dim)"""
    t = torch.arange(offset, offset + max_len, dtype=torch.float64)[:, None]
    k = torch.arange(dim // 2, dtype=torch.float64)
    steps = dim / 2 if spacing == "vaswani" else dim // 2 - 1
    w = torch.exp(-math.log(10000.0) * k / steps)
    sin, cos = torch.sin(t * w), torch.cos(t * w)  # (max_len, dim / 2)
    if layout == "halves":
        return torch.cat((sin, cos), dim=-1).float()
    return torch.stack((sin, cos), dim=-1).flatten(1).float()  # sin, cos, sin, cos, ...


def sinusoidal_2d_table(
    grid: int, dim: int, layout: str = "interleaved", spacing: str = "vaswani"
) -> torch.Tensor:
    """Fixed positions on a grid x grid patch grid, row-major: the first dim / 2 features are the
    1-D sinusoidal encoding of the row, the last dim / 2 of the column, each in ``layout``. MAE's
    table holds the halves layout's values with the column's half first; as the table is fixed and
    never saved, the order matters to no checkpoint. -> (grid², dim)"""
    axis = sinusoidal_table(grid, dim // 2, layout, spacing)  # (grid, dim / 2)
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
            table = sinusoidal_table(dims.max_seq_len, dims.d_model, spec.layout, spec.spacing, spec.offset)
        else:  # a ViT's: from 0 (the schema keeps the offset out)
            grid = sinusoidal_2d_table(dims.grid, dims.d_model, spec.layout, spec.spacing)
            table = torch.cat((torch.zeros(dims.prefix, dims.d_model), grid))
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


def rope_frequencies(
    spec: schema.RopePositional, width: int, long: bool = False
) -> tuple[torch.Tensor, float]:
    """The angle per position of each rotated pair, (width / 2,) float64, and the factor cos and
    sin are multiplied by, for a scaling that does not depend on the sequence (transformers'
    rope_init functions, in float64), for RoPE over ``width`` dimensions of a head (its rotary_dims).
    Pair i turns theta^(-2i/width) per position unscaled. LongRoPE's: its short factors', or with
    ``long`` its long factors' (a sequence past the original length)."""
    d = width
    inv_freq = spec.theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    scaling = spec.scaling
    if scaling is None or scaling.type == "dynamic":  # dynamic is plain up to the original length
        return inv_freq, 1.0
    if scaling.type == "longrope":
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float64)
        assert scaling.attention_factor is not None  # the section resolves it
        return inv_freq / factors, scaling.attention_factor
    if scaling.type == "linear":
        return inv_freq / scaling.factor, 1.0
    if scaling.type == "llama3":
        original = scaling.original_max_position_embeddings
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        wavelength = 2 * math.pi / inv_freq
        # Long wavelengths (low frequencies) are interpolated, short ones kept, those between blended.
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / scaling.factor, inv_freq)
        medium = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(medium, blended, scaled), 1.0
    return _yarn_frequencies(scaling, spec.theta, inv_freq, d)


def _yarn_frequencies(
    scaling: schema.YarnRopeScaling, theta: float, inv_freq: torch.Tensor, d: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the pairs that turn fewer than beta_slow times over the original context,
    keep those that turn more than beta_fast times, ramp linearly between."""
    factor, original = scaling.factor, scaling.original_max_position_embeddings

    def m_scale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.attention_factor
    if attention_factor is None:
        if scaling.mscale is not None and scaling.mscale_all_dim is not None:
            attention_factor = m_scale(factor, scaling.mscale) / m_scale(factor, scaling.mscale_all_dim)
        else:
            attention_factor = m_scale(factor)

    def pair_turning(turns: float) -> float:
        """The (fractional) pair index that turns ``turns`` times over the original context (a
        difference of logarithms: finite for any positive float, where a quotient overflows)."""
        return d * (math.log(original / (2 * math.pi)) - math.log(turns)) / (2 * math.log(theta))

    low, high = pair_turning(scaling.beta_fast), pair_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp), attention_factor


@POSITIONAL.register("rope")
class RotaryPositional(PositionalEncoding):
    """RoPE (Su et al. 2021): rotate each pair of dimensions by the angle m * theta^(-2i/d) at
    position m, the pairs (x_{2i}, x_{2i+1}) or, with ``layout: halves``, (x_i, x_{i+d/2}); with
    ``scaling``, the frequencies (and a factor on cos and sin) of a longer context (LongRoPE's
    two sets: a table of each, and a choice per row). The layers that
    ``local`` lists turn at its theta and scaling instead (a second RoPE of the same layout and
    width)."""

    cos: torch.Tensor
    sin: torch.Tensor
    cos_long: torch.Tensor  # LongRoPE's, at its long factors
    sin_long: torch.Tensor

    def __init__(self, spec: schema.RopePositional, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        self.layout = spec.layout
        rotated = spec.width(dims.head_dim)
        self.dynamic = spec.scaling if spec.scaling is not None and spec.scaling.type == "dynamic" else None
        self.longrope = spec.scaling if spec.scaling is not None and spec.scaling.type == "longrope" else None
        positions = torch.arange(dims.max_seq_len, dtype=torch.float64)[:, None]
        for suffix, long in [("", False)] + [("_long", True)] * (self.longrope is not None):
            inv_freq, factor = rope_frequencies(spec, rotated, long)
            angles = positions * inv_freq  # (T, hd/2)
            self.register_buffer(f"cos{suffix}", (angles.cos() * factor).float(), persistent=False)
            self.register_buffer(f"sin{suffix}", (angles.sin() * factor).float(), persistent=False)
        self.theta, self.rotated = spec.theta, rotated
        local = spec.local
        self.local = (
            RotaryPositional(
                spec.model_copy(update={"theta": local.theta, "scaling": local.scaling, "local": None}), dims
            )
            if local is not None
            else None
        )
        self.local_layers = frozenset(local.layers) if local is not None else frozenset()
        self.nope_layers = frozenset(spec.nope_layers or ())
        self.query_scaling = spec.query_scaling

    def rotary(self, positions: torch.Tensor) -> Rotary:
        """The angles (and query scale) at ``positions`` (T or B, T)."""
        scale = None
        if self.query_scaling is not None:  # 1 + beta ln(1 + floor(m / length)), float32 as transformers
            steps = torch.floor(positions.float() / self.query_scaling.length)
            scale = (1 + self.query_scaling.beta * torch.log1p(steps))[..., None]  # (T or B, T, 1)
        if self.dynamic is not None:
            cos, sin = self._dynamic_angles(positions)
        elif self.longrope is not None:
            # A row whose last position is past the original length turns at the long factors
            # throughout, as transformers turns a call's positions by its largest.
            original = self.longrope.original_max_position_embeddings
            long = (positions.amax(dim=-1, keepdim=True) >= original)[..., None]  # (1, 1) or (B, 1, 1)
            cos = torch.where(long, self.cos_long[positions], self.cos[positions])
            sin = torch.where(long, self.sin_long[positions], self.sin[positions])
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        return Rotary(cos, sin, self.layout, scale)

    def layer_rotaries(self, positions: torch.Tensor, n_layers: int) -> list[Rotary | None]:
        """positional.theta's rotary for each layer; local.theta's for local.layers, none for
        nope_layers."""
        shared = self.rotary(positions)
        local = self.local.rotary(positions) if self.local is not None else None
        return [
            None if i in self.nope_layers else local if i in self.local_layers else shared
            for i in range(n_layers)
        ]

    def _dynamic_angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """NTK-aware scaling by the row's sequence, L = max(positions) + 1 but at least the
        original length: theta' = theta (factor L / original - (factor - 1))^(d / (d - 2)). Each
        row of (B, T) positions takes its own L, so that a padded row in a batch is encoded as it
        would be alone. Computed in float32 in the graph, as transformers computes it."""
        assert self.dynamic is not None
        d, factor = self.rotated, self.dynamic.factor
        original = self.dynamic.original_max_position_embeddings
        length = (positions.amax(dim=-1, keepdim=True) + 1).clamp(min=original).float()  # (1,) or (B, 1)
        theta = self.theta * (factor * length / original - (factor - 1)) ** (d / (d - 2))
        exponents = torch.arange(0, d, 2, device=positions.device).float() / d  # (hd/2,)
        inv_freq = 1.0 / theta[..., None] ** exponents  # (1, hd/2) or (B, 1, hd/2)
        angles = positions.float()[..., None] * inv_freq  # (T or B, T, hd/2)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """x: (B, H, T, head_dim) -> each pair (x1, x2) of its first r = rotary_dims dimensions rotated
    to (x1 cos - x2 sin, x2 cos + x1 sin), the rest as they are: pairs (x_{2i}, x_{2i+1}) in the
    interleaved layout, (x_i, x_{i+r/2}) in halves. cos and sin are (T, r / 2) or, per row,
    (B, T, r / 2)."""
    width = 2 * rotary.cos.shape[-1]
    if width < x.shape[-1]:
        head, rest = x.split([width, x.shape[-1] - width], dim=-1)
        return torch.cat((apply_rotary(head, rotary), rest), dim=-1)
    cos, sin = (t.unsqueeze(-3) for t in rotary[:2])  # the same angles for every head
    if rotary.layout == "halves":
        x1, x2 = halves(x.float())  # (B, H, T, hd/2) each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)
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


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's slope per head, (n_heads,) float64: 2^(-8h/n), h = 1..n, for n a power of two; for
    other counts those of the power of two below, then every other slope of the one above (Press
    et al. 2021's code, and BLOOM's)."""
    below = 2 ** math.floor(math.log2(n_heads))
    slopes = 2.0 ** (-8.0 * torch.arange(1, below + 1, dtype=torch.float64) / below)
    odd = torch.arange(1, 2 * (n_heads - below) + 1, 2, dtype=torch.float64)  # empty for a power of two
    extra = 2.0 ** (-8.0 * odd / (2 * below))
    return torch.cat((slopes, extra))


@POSITIONAL.register("alibi")
class AlibiPositional(PositionalEncoding):
    """ALiBi (Press et al. 2021): a fixed bias on each head's scores, -m_h times the distance from
    the query back to the key (causal stacks; later keys are masked) or, looking both ways, its
    absolute value; nothing is added to the tokens and nothing is learned."""

    slopes: torch.Tensor

    def __init__(self, spec: schema.AlibiPositional, dims: PositionalDims) -> None:
        super().__init__(spec, dims)
        self.bidirectional = dims.bidirectional
        self.register_buffer("slopes", alibi_slopes(dims.n_heads).float(), persistent=False)

    def attention_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        q, k = q_positions.reshape(-1, q_positions.shape[-1]), k_positions.reshape(-1, k_positions.shape[-1])
        distance = (q[:, :, None] - k[:, None, :]).float()  # (1 or B, Tq, Tk)
        if self.bidirectional:
            distance = distance.abs()
        return -self.slopes[:, None, None] * distance[:, None]  # (1 or B, H, Tq, Tk)
