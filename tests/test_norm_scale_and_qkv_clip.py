"""``model.norm.scale: false`` (a norm that learns no scale g: OLMo's, with ``bias: false``, learns
nothing) and ``model.qkv_clip`` (every projected query, key and value clamped to [-c, c]: OLMo's
and MPT's ``clip_qkv``). Held to their formulas, the blocks to a computation written out here, the
KV cache to the full forward, the parameter counts to the built models in every family, refused
where they have no meaning, exported with parity, and refused by field by export-hf. (OLMo's
import: tests/test_hf_olmo.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_exports_with_parity, random_run, randomised, tiny_model

from tfcompile.models import DecoderLM
from tfcompile.nn import NORMS
from tfcompile.nn.attention import Attention, CrossAttention
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model

NORM_TYPES = tuple(NORMS[name] for name in NORMS.names())
MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 12"


@pytest.mark.parametrize("bias", [False, True])
def test_a_layernorm_without_a_scale_normalises_and_shifts_only(bias: bool) -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 4 + 2
    norm = randomised(NORMS["layernorm"](16, eps=1e-5, bias=bias, scale=False))
    assert norm.weight is None and [p.numel() for p in norm.parameters()] == ([16] if bias else [])
    mu = x.mean(-1, keepdim=True)
    expected = (x - mu) / ((x - mu) ** 2).mean(-1, keepdim=True).add(1e-5).sqrt()
    torch.testing.assert_close(norm(x), expected + (norm.bias if bias else 0))


@pytest.mark.parametrize("bias", [False, True])
def test_an_rmsnorm_without_a_scale_divides_by_the_rms_only(bias: bool) -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 3 + 1
    norm = randomised(NORMS["rmsnorm"](16, eps=1e-6, bias=bias, scale=False))
    expected = x / (x**2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(norm(x), expected + (norm.bias if bias else 0))


def _clipped_attention(attention: Attention, x: torch.Tensor, clip: float) -> torch.Tensor:
    """Causal self-attention written out, its projections clamped to [-clip, clip]."""
    B, T, _ = x.shape
    hd, H = attention.head_dim, attention.n_heads
    q, k, v = attention.qkv(x).clamp(-clip, clip).split(H * hd, dim=-1)
    q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / hd**0.5
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    return attention.out(y)


def test_self_attention_clamps_q_k_and_v_before_attending() -> None:
    attention = randomised(Attention(16, 2, 2, qkv_bias=True, out_bias=True, dropout=0.0, clip=0.2))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = _clipped_attention(attention, x, 0.2)
        torch.testing.assert_close(attention(x, is_causal=True), expected)
        assert attention.qkv(x).abs().max() > 0.2  # the clip bites
        attention.clip = None
        assert not torch.allclose(attention(x, is_causal=True), expected, atol=1e-3)


def test_cross_attention_clamps_the_queries_and_the_sources_keys_and_values() -> None:
    cross = randomised(CrossAttention(16, 2, 2, qkv_bias=False, out_bias=False, dropout=0.0, clip=0.1))
    x, memory = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        q = cross.q(x).clamp(-0.1, 0.1).view(2, 3, 2, 8).transpose(1, 2)
        k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in cross.kv(memory).clamp(-0.1, 0.1).chunk(2, -1))
        y = ((q @ k.transpose(-1, -2)) / 8**0.5).softmax(-1) @ v
        expected = cross.out(y.transpose(1, 2).reshape(2, 3, 16))
        torch.testing.assert_close(cross(x, cross.project_memory(memory)), expected)


def test_a_clipped_decoder_agrees_with_its_kv_cache() -> None:
    model = randomised(DecoderLM(tiny_model(n_kv_heads=2, positional="rope", qkv_clip=0.3)))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :4], cache=cache)]  # a prompt, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


FAMILIES = {
    "decoder": f"model: {{{MODEL}, norm: {{scale: false}}}}\n",
    "decoder rmsnorm qk_norm": f"model: {{{MODEL}, norm: {{type: rmsnorm, scale: false, bias: true}}, "
    "qk_norm: true, positional: rope}\n",
    "encoder": f"model: {{{MODEL}, family: encoder, norm: {{scale: false, position: post}}}}\n"
    "task: {type: classification, labels: [a, b]}\n",
    "encoder_decoder": f"model: {{{MODEL}, family: encoder_decoder, norm: {{scale: false}}}}\n"
    "task: seq2seq\n",
    "vit": "model: {family: vit, image_size: 8, patch_size: 4, channels: 1, d_model: 16, n_layers: 1, "
    "n_heads: 2, norm: {scale: false}}\ntask: {type: image_classification, labels: [a, b]}\n",
}


@pytest.mark.parametrize("text", FAMILIES.values(), ids=FAMILIES)
def test_the_parameter_count_leaves_out_every_scale(text: str) -> None:
    spec, with_scales = parse_spec(text), parse_spec(text.replace("scale: false", "scale: true"))
    model, scaled = build_model(spec), build_model(with_scales)
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    assert all(getattr(m, "weight", None) is None for m in model.modules() if type(m) in NORM_TYPES)
    scales = [m.weight.numel() for m in scaled.modules() if type(m) in NORM_TYPES]
    assert scales and with_scales.parameter_count() - spec.parameter_count() == sum(scales)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ("qkv_clip: 0", "model.qkv_clip"),
        ("qkv_clip: -1", "model.qkv_clip"),
        ("qkv_clip: clip", "model.qkv_clip"),
        ("norm: {scale: sometimes}", "model.norm.scale"),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {fields}}}\n")
    assert [issue.path for issue in error.value.issues] == [field], error.value


BUNDLES = {
    "decoder, RoPE, grouped K/V, opset 23": f"model: {{{MODEL}, n_kv_heads: 1, positional: rope, "
    "norm: {type: rmsnorm, scale: false}, qkv_clip: 0.5}\nexport: {opset: 23}\n",
    "decoder, learned positions, opset 17": f"model: {{{MODEL}, norm: {{scale: false, bias: false}}, "
    "qkv_clip: 0.5}\nexport: {opset: 17}\n",
    "encoder-decoder": f"model: {{{MODEL}, family: encoder_decoder, norm: {{scale: false}}, qkv_clip: 0.5}}\n"
    "task: seq2seq\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_decoder_without_norm_scales_and_clipped_fuses_and_generates_as_pytorch(
    tmp_path: Path,
) -> None:
    from helpers import trained_decoder_generates_as_pytorch

    trained_decoder_generates_as_pytorch(tmp_path, ["model.norm.scale=false", "model.qkv_clip=0.5"])


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("n_layers: 1, norm: {scale: false}", "model.norm.scale"),  # GPT-2
        ("n_layers: 1, qkv_clip: 2.0", "model.qkv_clip"),
        (  # Llama
            "n_layers: 1, positional: rope, norm: {type: rmsnorm, scale: false}, activation: swiglu, "
            "bias: {qkv: false, attn_out: false, ffn: false}",
            "model.norm.scale",
        ),
    ],
    ids=["gpt2 norm", "gpt2 clip", "llama norm"],
)
def test_export_hf_refuses_them_by_field(model: str, field: str, tmp_path: Path) -> None:
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    run = random_run(
        tmp_path, f"model: {{vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 24, {model}}}\n"
    )
    with pytest.raises(HFError, match=rf"\n  {re.escape(field)}: "):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_norm_without_a_scale_is_functional_and_keeps_the_input_dtype() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    for name in NORMS.names():
        out = NORMS[name](8, scale=False, bias=False)(x)
        assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        NORMS["layernorm"](8, scale=False, bias=False)(x.float()), F.layer_norm(x.float(), (8,))
    )
