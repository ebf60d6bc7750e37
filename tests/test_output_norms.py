"""``model.norm.position: output`` (x + norm(f(x)): a norm on each sublayer's output and none on
its input, OLMo 2's) and ``model.qk_norm_over: all_heads`` (the queries normalised over all
n_heads x head_dim of them at once, the keys over all n_kv_heads x head_dim, before the split into
heads and RoPE: OLMo 2's). Held to their formulas in self- and cross-attention and the block, the
KV cache to the full forward, counted by the spec in every family, refused where they have no
meaning, exported with parity, fused and generated in onnxruntime as PyTorch does. (Written by
export-hf as OLMo 2, and imported: tests/test_hf_olmo.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_exports_with_parity, randomised, tiny_model, trained_decoder_generates_as_pytorch

from tfcompile.models import DecoderLM
from tfcompile.nn.attention import Attention, CrossAttention
from tfcompile.nn.block import TransformerBlock, build_attention
from tfcompile.nn.positional import apply_rotary
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model


@pytest.mark.parametrize("cross", [False, True], ids=["self", "with cross-attention"])
def test_an_output_norm_block_normalises_each_sublayers_output_only(cross: bool) -> None:
    spec = tiny_model(norm={"position": "output", "type": "rmsnorm"})
    block = randomised(TransformerBlock(spec, cross_attention=cross))
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    memory = block.cross.project_memory(torch.randn(2, 3, spec.d_model).double()) if block.cross else None
    with torch.no_grad():
        expected = x + block.attn_out_norm(block.attn(x, is_causal=True))
        if block.cross is not None and memory is not None:
            expected = expected + block.cross_out_norm(block.cross(expected, memory))
        expected = expected + block.ffn_out_norm(block.ffn(expected))
        torch.testing.assert_close(block(x, is_causal=True, memory=memory), expected)
    inputs = [block.attn_norm, block.ffn_norm] + ([block.cross_norm] if cross else [])
    assert all(isinstance(norm, torch.nn.Identity) for norm in inputs)
    outputs = [block.attn_out_norm, block.ffn_out_norm] + ([block.cross_out_norm] if cross else [])
    assert not any(isinstance(norm, torch.nn.Identity) for norm in outputs)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


def test_self_attention_normalises_all_queries_and_all_keys_at_once_before_rope() -> None:
    spec = tiny_model(
        n_kv_heads=2, positional="rope", qk_norm=True, qk_norm_over="all_heads", norm={"type": "rmsnorm"}
    )
    model = randomised(DecoderLM(spec))
    attention = model.blocks[0].attn
    assert (attention.q_norm.weight.numel(), attention.k_norm.weight.numel()) == (4 * 8, 2 * 8)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    rotary = model.positional.rotary(torch.arange(6))
    rotary = rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double())
    with torch.no_grad():
        q, k, v = attention.qkv(x).split([32, 16, 16], -1)
        q = _rms(q, attention.q_norm.weight, 1e-5).view(2, 6, 4, 8).transpose(1, 2)
        k = _rms(k, attention.k_norm.weight, 1e-5).view(2, 6, 2, 8).transpose(1, 2)
        v = v.view(2, 6, 2, 8).transpose(1, 2)
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        scores = (q @ k.transpose(-1, -2)) / 8**0.5
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        expected = attention.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 32))
        torch.testing.assert_close(attention(x, is_causal=True, rotary=rotary), expected)


def test_cross_attention_normalises_all_the_decoders_queries_and_all_the_sources_keys() -> None:
    spec = tiny_model(n_kv_heads=2, qk_norm=True, qk_norm_over="all_heads", norm={"type": "rmsnorm"})
    cross = randomised(build_attention(CrossAttention, spec))
    x, memory = torch.randn(2, 3, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        q = _rms(cross.q(x), cross.q_norm.weight, 1e-5).view(2, 3, 4, 8).transpose(1, 2)
        k, v = cross.kv(memory).chunk(2, -1)
        k = _rms(k, cross.k_norm.weight, 1e-5).view(2, 5, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
        v = v.reshape(2, 5, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
        y = ((q @ k.transpose(-1, -2)) / 8**0.5).softmax(-1) @ v
        expected = cross.out(y.transpose(1, 2).reshape(2, 3, 32))
        torch.testing.assert_close(cross(x, cross.project_memory(memory)), expected)


def test_a_decoder_of_output_norms_agrees_with_its_kv_cache() -> None:
    spec = tiny_model(
        n_kv_heads=1, positional="rope", qk_norm=True, qk_norm_over="all_heads", norm={"position": "output"}
    )
    model = randomised(DecoderLM(spec))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :4], cache=cache)]  # a prompt, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


FAMILIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "decoder": ({"positional": "rope", "n_kv_heads": 2}, {"type": "causal_lm"}),
    "encoder": ({}, {"type": "masked_lm"}),
    "encoder_decoder": ({"n_kv_heads": 1}, {"type": "seq2seq"}),
    "vit": ({"image_size": 8, "patch_size": 4}, {"type": "image_classification", "labels": ["a", "b"]}),
}


def _spec(family: str, **fields: Any) -> Spec:
    model, task = FAMILIES[family]
    base: dict[str, Any] = {"family": family, "d_model": 32, "n_layers": 2, "n_heads": 4}
    if family != "vit":
        base |= {"vocab_size": 50, "max_seq_len": 16}
    return Spec.model_validate({"model": base | model | fields, "task": task})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_spec_counts_output_norms_and_q_and_k_norms_over_all_heads(family: str) -> None:
    """Output norms are as many as pre-norms (one per sublayer, a final one); q and k norms over
    all heads are n_heads x head_dim and n_kv_heads x head_dim wide."""
    spec = _spec(family, norm={"position": "output"}, qk_norm=True, qk_norm_over="all_heads")
    assert spec.model.norm.final
    with torch.device("meta"):
        model = build_model(spec)
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    per_head = _spec(family, qk_norm=True)
    assert spec.model.n_kv_heads is not None
    wider = (4 - 1) * 8 + (spec.model.n_kv_heads - 1) * 8  # each layer's q and k norms, past a head's
    attentions = sum(isinstance(m, Attention | CrossAttention) for m in model.modules())
    assert spec.parameter_count() - per_head.parameter_count() == wider * attentions * 2  # weight and bias


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        ({"qk_norm_over": "all_heads"}, "model.qk_norm_over", "qk_norm is false"),
        ({"qk_norm_over": "everything", "qk_norm": "true"}, "model.qk_norm_over", ""),
        ({"norm": {"position": "output"}, "block": "parallel"}, "model.block", "no output-norm form"),
    ],
)
def test_the_schema_refuses_at_the_field(model: dict[str, Any], field: str, message: str) -> None:
    fields = ", ".join(f"{k}: {v!r}".replace("'", "") for k, v in model.items())
    with pytest.raises(SpecError) as error:
        parse_spec(
            f"model: {{vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, {fields}}}\n"
        )
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 12"
BUNDLES = {
    "decoder, RoPE, grouped K/V, opset 23": f"model: {{{MODEL}, n_kv_heads: 1, positional: rope, "
    "norm: {type: rmsnorm, position: output}, qk_norm: true, qk_norm_over: all_heads}\nexport: {opset: 23}\n",
    "decoder, learned positions, opset 17": f"model: {{{MODEL}, norm: {{position: output}}}}\n"
    "export: {opset: 17}\n",
    "encoder-decoder": f"model: {{{MODEL}, family: encoder_decoder, norm: {{position: output}}, "
    "qk_norm: true, qk_norm_over: all_heads}\ntask: seq2seq\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_olmo_2_shaped_decoder_fuses_with_parity_and_generates_as_pytorch(tmp_path: Path) -> None:
    trained_decoder_generates_as_pytorch(
        tmp_path, ["model.norm.position=output", "model.qk_norm=true", "model.qk_norm_over=all_heads"]
    )
