"""Positional encodings against their definitions (notes: cmu-11711-transformers.txt)."""

import math

import torch

from tfcompile.nn import POSITIONAL
from tfcompile.nn.positional import (
    PositionalDims,
    RotaryPositional,
    apply_rotary,
    relative_position_bucket,
    sinusoidal_table,
)
from tfcompile.spec.schema import RelativePositional, RopePositional


def test_sinusoidal_values_match_formula() -> None:
    d = 16
    table = sinusoidal_table(50, d)
    for t in (0, 1, 7, 49):
        for k in range(d // 2):
            w = 1 / 10000 ** (2 * k / d)
            assert math.isclose(table[t, 2 * k].item(), math.sin(w * t), abs_tol=1e-6)
            assert math.isclose(table[t, 2 * k + 1].item(), math.cos(w * t), abs_tol=1e-6)


def _rope(head_dim: int = 8, max_len: int = 64, theta: float = 10000.0) -> RotaryPositional:
    dims = PositionalDims(
        d_model=head_dim * 2, n_heads=2, head_dim=head_dim, max_seq_len=max_len, bidirectional=False
    )
    return RotaryPositional(RopePositional(theta=theta), dims)


def test_rope_matches_the_pairwise_rotation_formula() -> None:
    rope = _rope()
    x = torch.randn(1, 1, 5, 8)
    positions = torch.arange(5)
    out = apply_rotary(x, rope.rotary(positions))
    for m in range(5):
        for i in range(4):
            angle = m * 10000.0 ** (-2 * i / 8)
            x1, x2 = x[0, 0, m, 2 * i], x[0, 0, m, 2 * i + 1]
            torch.testing.assert_close(out[0, 0, m, 2 * i], x1 * math.cos(angle) - x2 * math.sin(angle))
            torch.testing.assert_close(out[0, 0, m, 2 * i + 1], x2 * math.cos(angle) + x1 * math.sin(angle))


def test_rope_score_depends_only_on_relative_offset() -> None:
    rope = _rope()
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        qm = apply_rotary(q, rope.rotary(torch.tensor([m])))
        kn = apply_rotary(k, rope.rotary(torch.tensor([n])))
        return (qm * kn).sum().item()

    for offset in (0, 1, 5, 17):
        scores = [score(m + offset, m) for m in (0, 3, 20, 40)]
        assert max(scores) - min(scores) < 1e-4, scores
    assert abs(score(5, 0) - score(0, 5)) > 1e-3  # and it does depend on the offset's sign


def test_rope_preserves_norms() -> None:
    rope = _rope()
    x = torch.randn(2, 3, 10, 8)
    out = apply_rotary(x, rope.rotary(torch.arange(10)))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_relative_buckets_follow_t5() -> None:
    rel = torch.arange(-200, 201)
    causal = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    # Keys after the query share bucket 0 in a causal model; nearby offsets are exact.
    assert (causal[rel >= 0] == 0).all()
    for d in range(16):
        assert causal[rel == -d].item() == d
    assert causal.max().item() == 31 and causal[rel == -200].item() == 31
    assert (causal[rel <= 0].flip(0).diff() >= 0).all()  # monotone in distance
    both = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert both[rel == 3].item() == 16 + 3 and both[rel == -3].item() == 3
    assert both.max().item() == 31


def test_relative_bias_shape_and_sharing() -> None:
    dims = PositionalDims(d_model=16, n_heads=4, head_dim=4, max_seq_len=32, bidirectional=False)
    rel = POSITIONAL["relative"](RelativePositional(), dims)
    bias = rel.attention_bias(torch.arange(6), torch.arange(6))
    assert bias.shape == (1, 4, 6, 6)
    # Same offset, same bias: the diagonal is constant per head.
    assert torch.allclose(bias[0, :, 2, 1], bias[0, :, 5, 4])
