"""Positional encodings against their definitions (notes: cmu-11711-transformers.txt)."""

import math

import pytest
import torch

from tfcompile.nn import POSITIONAL
from tfcompile.nn.positional import (
    PositionalDims,
    RotaryPositional,
    apply_rotary,
    relative_position_bucket,
    rope_frequencies,
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


def test_sinusoidal_halves_holds_the_sines_then_the_cosines_as_marian() -> None:
    """Marian's table (transformers' create_weight, written out): position / 10000^(2 (j // 2) / d)
    for each feature j, the sines of the even js in the first half, the cosines of the odd ones in
    the second."""
    d, length = 12, 30
    table = sinusoidal_table(length, d, "halves")
    angles = [[t / 10000 ** (2 * (j // 2) / d) for j in range(d)] for t in range(length)]
    expected = torch.tensor(
        [[math.sin(a) for a in row[0::2]] + [math.cos(a) for a in row[1::2]] for row in angles]
    )
    assert torch.allclose(table, expected, atol=1e-6)
    interleaved = sinusoidal_table(length, d)
    assert torch.equal(table, torch.cat((interleaved[:, 0::2], interleaved[:, 1::2]), dim=-1))


def test_sinusoidal_layout_reaches_the_model_and_a_vit_grid() -> None:
    """The spec's layout builds its table in the text families and in each half of a ViT's 2-D one."""
    from tfcompile.spec.schema import SinusoidalPositional as Spec

    text = PositionalDims(d_model=8, n_heads=2, head_dim=4, max_seq_len=6, bidirectional=True)
    grid = PositionalDims(
        d_model=8, n_heads=2, head_dim=4, max_seq_len=5, bidirectional=True, grid=2, prefix=1
    )
    module = POSITIONAL["sinusoidal"]
    assert torch.equal(module(Spec(layout="halves"), text).table, sinusoidal_table(6, 8, "halves"))
    halves, interleaved = module(Spec(layout="halves"), grid).table, module(Spec(), grid).table
    axis = sinusoidal_table(2, 4, "halves")
    assert torch.equal(halves[1:, :4], axis.repeat_interleave(2, dim=0))  # the row's half
    assert torch.equal(halves[1:, 4:], axis.repeat(2, 1))  # the column's
    assert not torch.equal(halves, interleaved) and torch.equal(halves[0], torch.zeros(8))


def test_tensor2tensor_spacing_and_an_offset_follow_fairseqs_formula() -> None:
    """w_k = 10000^(-k/(d/2 - 1)) (the last pair's exactly 1/10000), row i the position offset + i,
    in the model's table too (M2M100's and NLLB's)."""
    from tfcompile.spec.schema import SinusoidalPositional as Spec

    d, offset = 12, 3
    table = sinusoidal_table(20, d, "halves", "tensor2tensor", offset)
    for i in (0, 1, 19):
        for k in range(d // 2):
            angle = (offset + i) * 10000 ** (-k / (d // 2 - 1))
            assert math.isclose(table[i, k].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[i, d // 2 + k].item(), math.cos(angle), abs_tol=1e-6)
    assert torch.equal(sinusoidal_table(20, d, offset=offset), sinusoidal_table(23, d)[offset:])
    dims = PositionalDims(d_model=d, n_heads=2, head_dim=6, max_seq_len=20, bidirectional=True)
    spec = Spec(layout="halves", spacing="tensor2tensor", offset=offset)
    assert torch.equal(POSITIONAL["sinusoidal"](spec, dims).table, table)


@pytest.mark.parametrize(
    "model, field",
    [
        (
            "d_model: 2, n_heads: 1, positional: {type: sinusoidal, spacing: tensor2tensor}",
            "positional.spacing",
        ),
        (
            "family: vit, image_size: 8, patch_size: 4, d_model: 8, n_heads: 2, "
            "positional: {type: sinusoidal, offset: 2}",
            "positional.offset",
        ),
        (
            "family: vit, image_size: 8, patch_size: 4, d_model: 4, n_heads: 2, "
            "positional: {type: sinusoidal, spacing: tensor2tensor}",
            "positional.spacing",
        ),
    ],
)
def test_a_spacing_or_offset_without_meaning_is_refused_at_its_field(model: str, field: str) -> None:
    from tfcompile.spec import parse_spec
    from tfcompile.spec.errors import SpecError

    task = "image_classification, labels: [a, b]" if "vit" in model else "causal_lm"
    with pytest.raises(SpecError) as error:
        parse_spec(
            f"model: {{vocab_size: 20, n_layers: 1, max_seq_len: 8, {model}}}\ntask: {{type: {task}}}\n"
        )
    assert any(issue.path == f"model.{field}" for issue in error.value.issues), error.value


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


def _scaled_rope(scaling: dict | None, head_dim: int = 16, max_len: int = 64, **fields) -> RotaryPositional:
    spec = RopePositional.model_validate({"theta": 10000.0, "scaling": scaling, **fields})
    dims = PositionalDims(head_dim * 2, 2, head_dim, max_len, bidirectional=False)
    return RotaryPositional(spec, dims)


def test_rope_halves_layout_rotates_each_dimension_with_the_one_half_a_head_away() -> None:
    """transformers' rotate_half: the pair (x_i, x_{i + d/2}) turns by m * theta^(-2i/d)."""
    rope = _scaled_rope(None, head_dim=8, layout="halves")
    x = torch.randn(1, 1, 5, 8)
    out = apply_rotary(x, rope.rotary(torch.arange(5)))
    for m in range(5):
        for i in range(4):
            angle = m * 10000.0 ** (-2 * i / 8)
            x1, x2 = x[0, 0, m, i], x[0, 0, m, i + 4]
            torch.testing.assert_close(out[0, 0, m, i], x1 * math.cos(angle) - x2 * math.sin(angle))
            torch.testing.assert_close(out[0, 0, m, i + 4], x2 * math.cos(angle) + x1 * math.sin(angle))


def test_rope_halves_equals_interleaved_on_permuted_dimensions() -> None:
    """Why importing needs no weight permutation once the layout is a choice."""
    halves, pairs = _scaled_rope(None, 8, layout="halves"), _scaled_rope(None, 8)
    x, positions = torch.randn(2, 3, 6, 8), torch.arange(6)
    order = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # interleaved dimension j is halves dimension order[j]
    expected = apply_rotary(x[..., order], pairs.rotary(positions))
    torch.testing.assert_close(apply_rotary(x, halves.rotary(positions))[..., order], expected)


def _angles(rope: RotaryPositional, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = rope.rotary(positions)
    return rotary.cos, rotary.sin


def test_rope_linear_scaling_divides_positions_by_its_factor() -> None:
    scaled, plain = _scaled_rope({"type": "linear", "factor": 4.0}), _scaled_rope(None)
    cos, sin = _angles(scaled, torch.arange(0, 64, 4))
    torch.testing.assert_close((cos, sin), _angles(plain, torch.arange(16)))


def test_rope_llama3_scaling_matches_metas_formula() -> None:
    """Meta's apply_scaling (llama-models), per frequency, in float64."""
    factor, low, high, original, d = 8.0, 1.0, 4.0, 32, 16
    scaling = {
        "type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    expected = []
    for i in range(d // 2):
        freq = 10000.0 ** (-2 * i / d)
        wavelength = 2 * math.pi / freq
        if wavelength < original / high:
            expected.append(freq)
        elif wavelength > original / low:
            expected.append(freq / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            expected.append((1 - smooth) * freq / factor + smooth * freq)
    assert {"kept", "divided", "blended"} <= _kinds(expected, d, factor)
    inv_freq, attention_factor = rope_frequencies(RopePositional.model_validate({"scaling": scaling}), d)
    torch.testing.assert_close(inv_freq, torch.tensor(expected, dtype=torch.float64))
    assert attention_factor == 1.0


def _kinds(freqs: list[float], d: int, factor: float) -> set[str]:
    """Which branches of a scaling a test's frequencies reach."""
    plain = [10000.0 ** (-2 * i / d) for i in range(d // 2)]
    return {
        "kept" if math.isclose(f, p) else "divided" if math.isclose(f, p / factor) else "blended"
        for f, p in zip(freqs, plain, strict=True)
    }


def test_rope_yarn_scaling_matches_the_paper() -> None:
    """YaRN (Peng et al. 2023, eq. 18-21): pair i is interpolated by gamma(r_i), r_i the turns it
    makes over the original context, with a linear ramp between beta_slow and beta_fast; cos and
    sin are multiplied by 0.1 ln(factor) + 1."""
    factor, original, d, theta = 4.0, 1024, 16, 10000.0
    scaling = {
        "type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "truncate": False,
    }
    inv_freq, attention_factor = rope_frequencies(RopePositional.model_validate({"scaling": scaling}), d)

    def dim_of(turns: float) -> float:  # the pair index that makes ``turns`` turns over the original length
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(32.0), dim_of(1.0)
    expected = []
    for i in range(d // 2):
        freq = theta ** (-2 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep (fast pairs), 1: interpolate
        expected.append(freq / factor * ramp + freq * (1 - ramp))
    assert {"kept", "divided", "blended"} <= _kinds(expected, d, factor)
    torch.testing.assert_close(inv_freq, torch.tensor(expected, dtype=torch.float64))
    assert math.isclose(attention_factor, 0.1 * math.log(factor) + 1)
    rope = _scaled_rope(scaling, head_dim=d)
    cos, _ = _angles(rope, torch.tensor([0]))
    torch.testing.assert_close(cos, torch.full_like(cos, attention_factor))  # cos 0 = 1, times the factor


def test_rope_yarn_attention_factor_from_mscale_and_given_outright() -> None:
    base = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64}
    spec = RopePositional.model_validate({"scaling": base | {"mscale": 1.0, "mscale_all_dim": 0.5}})
    m = (0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1)
    assert math.isclose(rope_frequencies(spec, 16)[1], m)
    given = RopePositional.model_validate({"scaling": base | {"attention_factor": 0.7}})
    assert rope_frequencies(given, 16)[1] == 0.7


def test_rope_yarn_turn_bounds_at_the_ends_of_the_floats_give_the_clamped_ramp() -> None:
    """A beta_fast so large that beta_fast x 2 pi overflows, and a beta_slow so small that the
    original length over it overflows, are valid spec values: the ramp's ends are computed from
    logarithms (where the quotients overflowed: ValueError, OverflowError) and clamped to the
    pairs, as those of a less extreme value past the same clamp."""
    base = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    for extreme, moderate in (
        ({"beta_fast": 1e308}, {"beta_fast": 1e100}),
        ({"beta_slow": 1e-308}, {"beta_slow": 1e-100}),
    ):
        for truncate in (False, True):
            frequencies = [
                rope_frequencies(
                    RopePositional.model_validate({"scaling": base | betas | {"truncate": truncate}}), 16
                )
                for betas in (extreme, moderate)
            ]
            assert torch.isfinite(frequencies[0][0]).all()
            torch.testing.assert_close(frequencies[0], frequencies[1])


def test_rope_theta_must_exceed_one() -> None:
    """theta 1 turns every pair at one frequency, and YaRN divides by log(theta): refused by name."""
    import pytest
    from pydantic import ValidationError

    for theta in (1.0, 0.5):
        with pytest.raises(ValidationError, match="theta"):
            RopePositional(theta=theta)


def test_rope_dynamic_scaling_is_plain_within_the_original_length_and_ntk_beyond() -> None:
    """NTK-aware: past the original length L0, theta becomes theta (f L / L0 - (f - 1))^(d / (d - 2))
    for a sequence of L positions."""
    factor, original, d = 2.0, 16, 8
    scaling = {"type": "dynamic", "factor": factor, "original_max_position_embeddings": original}
    dynamic, plain = _scaled_rope(scaling, head_dim=d), _scaled_rope(None, head_dim=d)
    short = torch.arange(original)
    torch.testing.assert_close(_angles(dynamic, short), _angles(plain, short))
    length = 40
    theta = 10000.0 * (factor * length / original - (factor - 1)) ** (d / (d - 2))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * theta ** (-torch.arange(0, d, 2) / d)
    cos, sin = _angles(dynamic, torch.arange(length))
    torch.testing.assert_close((cos, sin), (angles.cos().float(), angles.sin().float()), atol=1e-5, rtol=1e-4)


def test_rope_longrope_turns_a_sequence_at_the_long_factors_once_it_passes_the_original_length() -> None:
    """LongRoPE (Ding et al. 2024): pair i turns theta^(-2i/d) / short_factor[i] per position while
    the sequence fits the original length, / long_factor[i] at every position of a longer one; cos
    and sin times sqrt(1 + ln(factor) / ln(original))."""
    d, original, factor = 8, 6, 4.0
    short, long = [1.0, 1.5, 2.0, 2.5], [3.0, 5.0, 7.0, 9.0]
    scaling = {
        "type": "longrope",
        "factor": factor,
        "original_max_position_embeddings": original,
        "short_factor": short,
        "long_factor": long,
    }
    rope = _scaled_rope(scaling, head_dim=d)
    attention = math.sqrt(1 + math.log(factor) / math.log(original))
    for length, factors in ((original, short), (original + 1, long), (40, long)):
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / torch.tensor(factors)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
        expected = ((angles.cos() * attention).float(), (angles.sin() * attention).float())
        torch.testing.assert_close(_angles(rope, torch.arange(length)), expected)
    # rows of a batch (B, T) each by its own longest position
    rows = torch.stack([torch.arange(8), torch.arange(8).clamp(max=original - 1)])
    cos, _ = _angles(rope, rows)
    torch.testing.assert_close(cos[0], _angles(rope, torch.arange(8))[0])
    torch.testing.assert_close(cos[1, :original], _angles(rope, torch.arange(original))[0])


@pytest.mark.parametrize(
    "scaling",
    [
        "{type: dynamic, factor: 4.0, original_max_position_embeddings: 4}",
        "{type: longrope, factor: 4.0, original_max_position_embeddings: 8, short_factor: [1, 2, 3, 4, 5, 6, "
        "7, 8], long_factor: [9, 8, 7, 6, 5, 4, 3, 2]}",
    ],
    ids=["dynamic", "longrope"],
)
def test_rope_scaling_by_length_encodes_a_padded_row_as_it_would_be_alone(scaling: str) -> None:
    """The scaled frequencies follow each row's own length: taken from the longest row of the
    batch, a short left-padded row (a prompt in a batch, a generation step) got other logits than
    alone."""
    from tfcompile.models import DecoderLM
    from tfcompile.spec import parse_spec

    spec = parse_spec(
        "model: {vocab_size: 20, d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 16, init_std: 0.5, "
        f"positional: {{type: rope, scaling: {scaling}}}}}\n"
    )
    model = DecoderLM(spec.model).eval()
    ids = torch.randint(0, 20, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    with torch.no_grad():
        batch, alone = model(ids, mask), model(ids[1:, 10:])
    torch.testing.assert_close(batch[1, 10:], alone[0])
