"""The Vision Transformer's blocks against their formulas, its spec rules, and its assembly."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

from tfcompile.models import VisionTransformer
from tfcompile.nn.patches import PatchEmbedding
from tfcompile.nn.positional import sinusoidal_2d_table
from tfcompile.spec import Spec, SpecError, parse_spec
from tfcompile.spec.presets import merge
from tfcompile.spec.schema import AugmentSpec
from tfcompile.summary import summarize
from tfcompile.tasks import build_model
from tfcompile.tasks.image_classification import augment, turn_and_zoom


def vit_spec(**model: Any) -> Spec:
    base = {"family": "vit", "image_size": 8, "channels": 3, "patch_size": 4, "d_model": 32}
    base |= {"n_layers": 2, "n_heads": 4}
    return Spec.model_validate(
        {
            "model": merge(base, model),
            "data": {"builtin": "digits"},
            "task": {"type": "image_classification", "labels": ["a", "b", "c"]},
        }
    )


def test_patch_embedding_is_reshape_and_linear_and_the_strided_convolution() -> None:
    torch.manual_seed(0)
    B, C, S, p, d = 2, 3, 8, 4, 16
    embed = PatchEmbedding(C, p, d)
    pixels = torch.randn(B, C, S, S)
    out = embed(pixels)  # (B, 4, d)
    W, b = embed.proj.weight, embed.proj.bias
    for i in range(S // p):
        for j in range(S // p):
            patch = pixels[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p].reshape(B, -1)  # (C, p, p) order
            torch.testing.assert_close(out[:, i * (S // p) + j], patch @ W.T + b)
    conv = F.conv2d(pixels, W.reshape(d, C, p, p), b, stride=p)  # (B, d, 2, 2)
    torch.testing.assert_close(out, conv.flatten(2).transpose(1, 2))


def test_2d_sinusoidal_positions_encode_row_then_column() -> None:
    grid, dim = 3, 8
    table = sinusoidal_2d_table(grid, dim)
    assert table.shape == (grid * grid, dim)
    half = dim // 2
    for r in range(grid):
        for c in range(grid):
            for k in range(half // 2):
                w = 10000 ** (-2 * k / half)
                row = table[r * grid + c]
                assert row[2 * k].item() == pytest.approx(math.sin(r * w), abs=1e-6)
                assert row[2 * k + 1].item() == pytest.approx(math.cos(r * w), abs=1e-6)
                assert row[half + 2 * k].item() == pytest.approx(math.sin(c * w), abs=1e-6)
                assert row[half + 2 * k + 1].item() == pytest.approx(math.cos(c * w), abs=1e-6)


def test_the_sequence_length_follows_from_the_sizes() -> None:
    assert vit_spec().model.max_seq_len == 2 * 2 + 1
    assert vit_spec(pooling="mean").model.max_seq_len == 2 * 2
    assert vit_spec(image_size=32, patch_size=8, max_seq_len=17).model.max_seq_len == 17


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ({"patch_size": 3}, "model.patch_size", r"must divide image_size \(8\), found 3"),
        ({"max_seq_len": 10}, "model.max_seq_len", r"2x2 patches \+ \[CLS\] = 5, found 10"),
        ({"vocab_size": 100}, "model.vocab_size", "reads pixels, not tokens"),
        ({"scale_embeddings": True}, "model.scale_embeddings", "no token embeddings to scale"),
        ({"bias": {"lm_head": True}}, "model.bias.lm_head", "no language-model head"),
        ({"positional": "rope"}, "model.positional", r"learned, sinusoidal \(2-D\) or none, found 'rope'"),
        (
            {"positional": "sinusoidal", "d_model": 30, "n_heads": 2},
            "model.d_model",
            "multiple of 4, found 30",
        ),
    ],
)
def test_spec_errors_name_the_field_and_the_fix(override: dict[str, Any], field: str, message: str) -> None:
    model = {"family": "vit", "image_size": 8, "channels": 1, "patch_size": 4, "d_model": 32}
    model |= {"n_layers": 1, "n_heads": 4} | override
    text = yaml.safe_dump({"model": model, "data": {"builtin": "digits"}, "task": "image_classification"})
    with pytest.raises(SpecError) as error:
        parse_spec(text, source="vit.yaml")
    report = str(error.value)
    line = next(
        i for i, row in enumerate(text.splitlines(), 1) if row.strip().startswith(field.split(".")[-1])
    )
    assert f"vit.yaml:{line}:" in report and f"{field}: " in report and "hint:" in report
    assert re.search(message, report), report


def test_data_names_exactly_one_source_and_builtin_images_need_the_image_task() -> None:
    vit = "model: {family: vit, image_size: 8, channels: 1, patch_size: 4, d_model: 32, n_layers: 1, "
    vit += "n_heads: 4}\n"
    with pytest.raises(SpecError, match=r"give exactly one of data\.path and data\.builtin, found neither"):
        parse_spec(vit + "data: {test_fraction: 0.2}\ntask: image_classification\n", source="s.yaml")
    with pytest.raises(SpecError, match="found both"):
        parse_spec(vit + "data: {builtin: digits, path: d}\ntask: image_classification\n", source="s.yaml")
    decoder = "model: {d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 8}\n"
    with pytest.raises(
        SpecError, match=r"data\.builtin: 'digits' is an image set, but the task is 'causal_lm'"
    ):
        parse_spec(decoder + "data: {builtin: digits}\n", source="s.yaml")
    with pytest.raises(SpecError, match="task 'image_classification' needs a model of family 'vit'"):
        parse_spec(decoder + "data: {builtin: digits}\ntask: image_classification\n", source="s.yaml")


@pytest.mark.parametrize(
    "variant",
    [
        {"positional": "learned", "pooling": "cls"},
        {"positional": "sinusoidal", "pooling": "mean"},
        {"positional": "none", "pooling": "cls", "norm": {"position": "post"}},
        {"positional": "learned", "pooling": "mean", "norm": {"type": "rmsnorm"}, "activation": "swiglu"},
    ],
)
def test_every_variant_classifies_a_batch_and_each_image_on_its_own(variant: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = build_model(vit_spec(**variant)).eval()
    assert isinstance(model, VisionTransformer)
    pixels = torch.randn(5, 3, 8, 8)
    logits = model(pixels)
    assert logits.shape == (5, 3)
    # Images in a batch never see each other.
    torch.testing.assert_close(model(pixels[2:3]), logits[2:3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "none"])
def test_positions_are_what_makes_the_patch_order_matter(positional: str) -> None:
    torch.manual_seed(0)
    model = build_model(vit_spec(positional=positional, pooling="mean")).eval()
    pixels = torch.randn(2, 3, 8, 8)
    swapped = torch.cat((pixels[:, :, 4:], pixels[:, :, :4]), dim=2)  # the two rows of patches swap
    same = torch.allclose(model(swapped), model(pixels), atol=1e-5)
    assert same == (positional == "none")  # without positions, attention and mean pooling ignore order


def test_fixed_positions_are_not_weights_and_learned_ones_are() -> None:
    assert not [k for k in build_model(vit_spec(positional="sinusoidal")).state_dict() if "positional" in k]
    learned = build_model(vit_spec(positional="learned")).state_dict()
    assert learned["positional.table.weight"].shape == (5, 32) and learned["cls_token"].shape == (1, 1, 32)
    assert "cls_token" not in build_model(vit_spec(pooling="mean")).state_dict()


def test_pixels_of_the_wrong_shape_or_type_are_refused_by_name() -> None:
    model = build_model(vit_spec())
    for bad in (
        torch.randn(2, 1, 8, 8),
        torch.randn(2, 3, 16, 16),
        torch.zeros(2, 3, 8, 8, dtype=torch.long),
    ):
        with pytest.raises(
            ValueError, match=r"pixel_values must be a float tensor of shape \(batch, 3, 8, 8\)"
        ):
            model(bad)


def test_vit_base_preset_has_the_released_parameter_count() -> None:
    labels = ", ".join(f"c{i}" for i in range(1000))
    spec = parse_spec(
        f"preset: vit-base\ndata: {{builtin: digits}}\ntask: {{labels: [{labels}]}}\n", source="p"
    )
    assert spec.model.max_seq_len == 197
    assert summarize(spec).total_params == 86_567_656  # ViT-B/16 as released (timm, HF)


def test_augmentation_shifts_within_bounds_and_flips_mirror() -> None:
    images = torch.zeros(64, 1, 8, 8)
    images[:, 0, 3, 4] = 1.0
    g = torch.Generator().manual_seed(0)
    shifted = augment(images, AugmentSpec(shift=2), g)
    rows, cols = (
        shifted[:, 0].flatten(1).argmax(1).div(8, rounding_mode="floor"),
        shifted[:, 0].flatten(1).argmax(1) % 8,
    )
    assert (shifted.sum((1, 2, 3)) == 1).all()  # the pixel moved, stayed whole, nothing else appeared
    assert ((rows - 3).abs() <= 2).all() and ((cols - 4).abs() <= 2).all()
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) > 10  # shifts vary per image
    assert torch.equal(augment(images, AugmentSpec(), g), images)
    flipped = augment(images, AugmentSpec(flip=True), g)
    mirrored = flipped[:, 0, 3, 3] == 1  # column 4 mirrors to 8 - 1 - 4 = 3
    assert torch.equal(flipped[mirrored], images[mirrored].flip(-1))
    assert torch.equal(flipped[~mirrored], images[~mirrored]) and 10 < mirrored.sum() < 54


def test_turning_and_zooming_follow_their_formula() -> None:
    images = torch.rand(3, 2, 6, 6)
    one, none = torch.ones(3), torch.zeros(3)
    torch.testing.assert_close(turn_and_zoom(images, none, one), images, atol=1e-6, rtol=0)
    quarter = turn_and_zoom(images, torch.full((3,), 90.0), one)
    torch.testing.assert_close(quarter, torch.rot90(images, -1, (-2, -1)), atol=1e-5, rtol=0)  # clockwise
    # Zoom 2 about the centre: output pixel (i, j) samples the input at the centre + (p - centre) / 2.
    ramp = torch.arange(8.0).expand(1, 1, 8, 8)  # value = column index
    zoomed = turn_and_zoom(ramp, torch.zeros(1), torch.full((1,), 2.0))
    expected = 3.5 + (torch.arange(8.0) - 3.5) / 2  # at pixel centres, in column units
    torch.testing.assert_close(zoomed[0, 0], expected.expand(8, 8), atol=1e-5, rtol=0)
    shrunk = turn_and_zoom(torch.ones(1, 1, 8, 8), torch.zeros(1), torch.full((1,), 0.5))
    assert shrunk[0, 0, 0].sum() == 0 and shrunk[0, 0, 3:5, 3:5].eq(1).all()  # outside the image is 0


def test_augmentation_turns_and_zooms_each_image_within_its_bounds() -> None:
    images = torch.zeros(256, 1, 8, 8)
    images[:, 0, :, 3:5] = 1.0  # a vertical bar through the centre
    g = torch.Generator().manual_seed(0)
    turned = augment(images, AugmentSpec(rotate=30), g)
    # The bar's direction, from the second moments of the mass about the centre.
    y, x = torch.meshgrid(torch.arange(8.0) - 3.5, torch.arange(8.0) - 3.5, indexing="ij")
    w = turned[:, 0]
    sxx, syy, sxy = (w * x * x).sum((1, 2)), (w * y * y).sum((1, 2)), (w * x * y).sum((1, 2))
    tilt = torch.rad2deg(0.5 * torch.atan2(2 * sxy, syy - sxx)).abs()
    assert tilt.max() < 33 and tilt.min() < 3 and tilt.std() > 5  # within 30 degrees, each its own
    ramp = (torch.arange(8.0) - 3.5).expand(256, 1, 8, 8).contiguous()  # value = x from the centre
    zoomed = augment(ramp, AugmentSpec(scale=0.5), g)
    zoom = 0.5 / zoomed[:, 0, 3, 4]  # a zoom z shows x / z at the pixel whose x is 0.5
    assert zoom.min() >= 0.5 - 1e-4 and zoom.max() <= 1.5 + 1e-4 and zoom.std() > 0.2
    assert torch.equal(augment(images, AugmentSpec(rotate=0, scale=0), g), images)


def test_runs_from_before_positions_were_a_module_still_load() -> None:
    model = build_model(vit_spec(positional="learned"))
    state = model.state_dict()
    state["position_table"] = state.pop("positional.table.weight")  # the key older runs saved
    fresh = build_model(vit_spec(positional="learned"))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.positional.table.weight, model.positional.table.weight)
