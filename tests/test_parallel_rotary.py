"""``model.block: parallel`` (x + attn(norm1(x)) + ffn(norm2(x)), one norm with ``shared_norm``:
GPT-J, GPT-NeoX, Phi, PaLM) and ``positional.rotary_dims`` (RoPE on the first dimensions of each
head only: GPT-NeoX's rotary_pct, GPT-J's rotary_dim, Phi's partial_rotary_factor). Held to their
formulas, counted by the spec in every family that takes them, refused where they have no meaning,
exported with parity (step graphs too), generated with the KV cache in onnxruntime as PyTorch
does, fused by ``tfcompile optimize`` with parity, and refused by field by export-hf where the
architecture has neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_exports_with_parity, randomised, tiny_model, trained_decoder_generates_as_pytorch
from pydantic import ValidationError

from tfcompile.models import DecoderLM
from tfcompile.nn.block import TransformerBlock
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model


@pytest.mark.parametrize("shared", [False, True], ids=["two norms", "shared norm"])
def test_a_parallel_block_adds_attention_and_feed_forward_of_the_same_input(shared: bool) -> None:
    spec = tiny_model(block={"type": "parallel", "shared_norm": shared}, positional="rope")
    block = randomised(TransformerBlock(spec))
    assert (block.ffn_norm is None) == shared
    ffn_norm = block.attn_norm if shared else block.ffn_norm
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    rotary = DecoderLM(spec).double().positional.rotary(torch.arange(5))
    with torch.no_grad():
        expected = x + block.attn(block.attn_norm(x), is_causal=True, rotary=rotary) + block.ffn(ffn_norm(x))
        torch.testing.assert_close(block(x, is_causal=True, rotary=rotary), expected)


def test_a_parallel_block_drops_the_sum_of_its_sublayers_once() -> None:
    """While training, one dropout over attn + ffn (GPT-J's and timm's parallel blocks), not one each."""
    spec = tiny_model(block="parallel", dropout={"residual": 0.5})
    block = randomised(TransformerBlock(spec)).train()
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    with torch.no_grad():
        both = block.attn(block.attn_norm(x), is_causal=True) + block.ffn(block.ffn_norm(x))
        torch.manual_seed(0)
        expected = x + F.dropout(both, 0.5)
        torch.manual_seed(0)
        torch.testing.assert_close(block(x, is_causal=True), expected)


def _rope(t: torch.Tensor, positions: torch.Tensor, dims: int, theta: float, layout: str) -> torch.Tensor:
    """RoPE's formula on the first ``dims`` features of t (B, H, T, hd), pair i turning
    theta^(-2i/dims) per position, as transformers' rotate_half (halves) or GPT-J's
    rotate_every_two (interleaved); the other features as they are."""
    angles = positions[:, None].double() * theta ** (-torch.arange(0, dims, 2).double() / dims)  # (T, dims/2)
    rot, rest = t[..., :dims], t[..., dims:]
    if layout == "halves":
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        turned = torch.cat([-rot[..., dims // 2 :], rot[..., : dims // 2]], -1)
    else:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        turned = torch.stack([-rot[..., 1::2], rot[..., 0::2]], -1).flatten(-2)
    return torch.cat([rot * cos + turned * sin, rest], -1)


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_partial_rotary_turns_the_first_dimensions_of_each_head_and_passes_the_rest(layout: str) -> None:
    """Self-attention against the formula with 4 of each head's 10 dimensions rotated at the
    frequencies of a 4-wide head; with the KV cache, the same one token at a time."""
    spec = tiny_model(
        d_model=40, n_heads=4, n_kv_heads=2, positional={"type": "rope", "rotary_dims": 4, "layout": layout}
    )
    model = randomised(DecoderLM(spec))
    attn, hd = model.blocks[0].attn, spec.head_dim
    assert spec.n_kv_heads is not None and hd == 10 and spec.attention_scale is not None
    x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([4 * hd, 2 * hd, 2 * hd], -1)
    q, k, v = (t.reshape(2, 6, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
    positions = torch.arange(6)
    q, k = (_rope(t, positions, 4, spec.positional.theta, layout) for t in (q, k))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = spec.attention_scale * q @ k.transpose(-1, -2)
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, -1)
    expected = F.linear(y, attn.out.weight, attn.out.bias)
    close = {"rtol": 1e-6, "atol": 1e-6}  # RoPE turns q and k in float32
    with torch.no_grad():
        torch.testing.assert_close(
            attn(x, is_causal=True, rotary=model.positional.rotary(positions)), expected, **close
        )
        cache = model.empty_cache(2)[0]
        steps = [
            attn(x[:, t : t + 1], rotary=model.positional.rotary(torch.tensor([t])), cache=cache)
            for t in range(6)
        ]
        torch.testing.assert_close(torch.cat(steps, 1), expected, **close)


def test_partial_rotary_scales_the_frequencies_of_the_rotated_width() -> None:
    """Linear scaling divides the 4-wide head's frequencies; dynamic scaling raises theta to
    d / (d - 2) with d the rotated width (transformers' partial rotary does both over that width)."""
    linear = tiny_model(
        positional={"type": "rope", "rotary_dims": 4, "scaling": {"type": "linear", "factor": 2}}
    )
    rope = DecoderLM(linear).positional
    expected = torch.arange(16)[:, None].double() * 10000.0 ** (-torch.arange(0, 4, 2).double() / 4) / 2
    torch.testing.assert_close(rope.cos, expected.cos().float())
    scaling = {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    dynamic = DecoderLM(
        tiny_model(positional={"type": "rope", "rotary_dims": 4, "scaling": scaling})
    ).positional
    cos = dynamic.rotary(torch.arange(8)).cos  # L = 8: theta' = theta (2 * 8 / 4 - 1)^(4 / 2)
    theta = 10000.0 * 3.0**2
    expected = torch.arange(8)[:, None].double() * theta ** (-torch.arange(0, 4, 2).double() / 4)
    torch.testing.assert_close(cos, expected.cos().float())


FAMILIES = {
    "decoder": ({"positional": {"type": "rope", "rotary_dims": 2}, "n_kv_heads": 2}, {"type": "causal_lm"}),
    "encoder": ({"positional": {"type": "rope", "rotary_dims": 4}}, {"type": "masked_lm"}),
    "vit": ({"image_size": 8, "patch_size": 4}, {"type": "image_classification", "labels": ["a", "b"]}),
}


def _spec(family: str, **fields: Any) -> Spec:
    model, task = FAMILIES[family]
    base: dict[str, Any] = {"family": family, "d_model": 32, "n_layers": 2, "n_heads": 4}
    if family != "vit":
        base |= {"vocab_size": 50, "max_seq_len": 16}
    return Spec.model_validate({"model": base | model | fields, "task": task})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_spec_counts_one_norm_less_per_layer_for_a_shared_norm(family: str) -> None:
    for block, norms in (("sequential", 2), ("parallel", 2), ({"type": "parallel", "shared_norm": True}, 1)):
        spec = _spec(family, block=block)
        with torch.device("meta"):
            model = build_model(spec)
        assert spec.parameter_count() == sum(p.numel() for p in model.parameters()), block
        per_layer = sum("norm" in name for name, _ in model.blocks[0].named_parameters())
        assert per_layer == 2 * norms, block  # a layernorm's weight and bias each
    assert (
        _spec(family).parameter_count()
        - _spec(family, block={"type": "parallel", "shared_norm": True}).parameter_count()
        == 2 * 32 * 2
    )


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        ({"positional": {"type": "rope", "rotary_dims": 3}}, "model.positional.rotary_dims", "must be even"),
        ({"positional": {"type": "rope", "rotary_dims": 10}}, "model.positional.rotary_dims", "at most 8"),
        ({"positional": {"type": "rope", "rotary_dims": 0}}, "model.positional.rotary_dims", "greater than"),
        ({"positional": {"type": "learned", "rotary_dims": 4}}, "model.positional.rotary_dims", ""),
        ({"block": "parallel", "norm": {"position": "post"}}, "model.block", "no post-norm form"),
        ({"block": {"type": "parallel", "shared": True}}, "model.block.shared", ""),
        ({"block": "diagonal"}, "model.block", ""),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(
    model: dict[str, Any], field: str, message: str
) -> None:
    fields = ", ".join(f"{k}: {v!r}".replace("'", "") for k, v in model.items())
    with pytest.raises(SpecError) as error:
        parse_spec(
            f"model: {{vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, {fields}}}\n"
        )
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


def test_an_encoder_decoder_has_no_parallel_blocks() -> None:
    with pytest.raises(SpecError, match="which a parallel block has no place for"):
        parse_spec(
            "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, "
            "max_seq_len: 8, block: parallel}\ntask: seq2seq\n"
        )


def test_an_odd_head_may_rotate_an_even_part_and_a_resolved_spec_says_how_much() -> None:
    odd = tiny_model(d_model=30, n_heads=2, positional={"type": "rope", "rotary_dims": 6})
    assert (odd.head_dim, odd.positional.rotary_dims) == (15, 6)
    with pytest.raises(ValidationError, match="head size must be even"):
        tiny_model(d_model=30, n_heads=2, positional="rope")
    full = tiny_model(positional="rope")
    assert full.positional.rotary_dims == full.head_dim == 8
    assert tiny_model(**full.model_dump()) == full  # the resolved value reads back the same


# Random models of each kind of graph: step graphs read and extend the cache of partly rotated
# keys; opset 23 writes RMSNorm as RMSNormalization, fp16 as well.
TINY_MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 8"
BUNDLES = {
    "decoder, parallel, interleaved, opset 17": f"model: {{{TINY_MODEL}, "
    "positional: {type: rope, rotary_dims: 4}, block: parallel}\nexport: {opset: 17}\n",
    "decoder, shared norm, halves, opset 23, fp16": f"model: {{{TINY_MODEL}, n_kv_heads: 1, "
    "positional: {type: rope, layout: halves, rotary_dims: 2}, norm: {type: rmsnorm}, "
    "block: {type: parallel, shared_norm: true}}\nexport: {opset: 23, precision: fp16}\n",
    "encoder classifier, parallel": f"model: {{family: encoder, {TINY_MODEL}, "
    "positional: {type: rope, rotary_dims: 4}, block: parallel}\n"
    "task: {type: classification, labels: [a, b]}\n",
    "vit, shared norm": "model: {family: vit, image_size: 8, patch_size: 4, d_model: 16, n_layers: 1, "
    "n_heads: 2, block: {type: parallel, shared_norm: true}}\n"
    "task: {type: image_classification, labels: [a, b]}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_a_trained_parallel_partial_rotary_decoder_fuses_with_parity_and_generates_as_pytorch(
    layout: str, tmp_path: Path
) -> None:
    """Trained, exported, fused by `tfcompile optimize` (attention as onnxruntime's contrib
    operators, parity kept); the bundles, source and fused, generate PyTorch's greedy tokens with
    the KV cache, prompts of two lengths left-padded in one batch."""
    overrides = [
        "model.block=parallel",
        "model.positional.rotary_dims=6",
        f"model.positional.layout={layout}",
    ]
    done = trained_decoder_generates_as_pytorch(tmp_path, overrides)
    assert any(op.startswith("com.microsoft::") for step in done.steps for op in step.operators), done.steps
