"""``model.qk_norm_after_rope`` (each head's queries and keys normalised after RoPE turns them, not
before: HunYuan's query_layernorm and key_layernorm). Held to its formula, the KV cache to the full
forward, the same parameters as the norms before RoPE, refused where it has no meaning, exported
with parity, fused and generated in onnxruntime as PyTorch does. (Written by export-hf as HunYuan,
and imported: tests/test_hf_hunyuan.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_exports_with_parity, randomised, tiny_model, trained_decoder_generates_as_pytorch

from tfcompile.models import DecoderLM
from tfcompile.nn.positional import apply_rotary
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("after", [True, False], ids=["after RoPE", "before RoPE"])
def test_self_attention_normalises_each_turned_head(after: bool) -> None:
    spec = tiny_model(
        n_kv_heads=2, positional="rope", qk_norm=True, qk_norm_after_rope=after, norm={"type": "rmsnorm"}
    )
    model = randomised(DecoderLM(spec))
    attention = model.blocks[0].attn
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    rotary = model.positional.rotary(torch.arange(6))
    rotary = rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double())
    with torch.no_grad():
        q, k, v = attention.qkv(x).split([32, 16, 16], -1)
        q, k = q.view(2, 6, 4, 8).transpose(1, 2), k.view(2, 6, 2, 8).transpose(1, 2)
        v = v.view(2, 6, 2, 8).transpose(1, 2)
        if after:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        q, k = _rms(q, attention.q_norm.weight, 1e-5), _rms(k, attention.k_norm.weight, 1e-5)
        if not after:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        scores = (q @ k.transpose(-1, -2)) / 8**0.5
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        expected = attention.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 32))
        torch.testing.assert_close(attention(x, is_causal=True, rotary=rotary), expected)


def test_the_two_orders_differ_where_the_scale_is_not_alike_within_each_pair() -> None:
    """RoPE keeps each pair's length, so only a scale that weighs a turned pair's two dimensions
    unalike tells the orders apart: the field is a computation of its own."""
    before = randomised(DecoderLM(tiny_model(positional="rope", qk_norm=True, norm={"type": "rmsnorm"})))
    after = DecoderLM(
        tiny_model(positional="rope", qk_norm=True, qk_norm_after_rope=True, norm={"type": "rmsnorm"})
    )
    after.load_state_dict(before.state_dict())
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (before(ids) - after(ids)).abs().max() > 1e-3


def test_a_decoder_agrees_with_its_kv_cache() -> None:
    spec = tiny_model(n_kv_heads=1, positional="rope", qk_norm=True, qk_norm_after_rope=True)
    model = randomised(DecoderLM(spec))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :4], cache=cache)]  # a prompt, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


def test_the_spec_counts_the_same_norms_as_before_rope() -> None:
    text = "model: {vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 8, positional: rope, "
    before, after = (
        parse_spec(f"{text}qk_norm: true{extra}}}\n") for extra in ("", ", qk_norm_after_rope: true")
    )
    with torch.device("meta"):
        model = DecoderLM(after.model)
    assert after.parameter_count() == sum(p.numel() for p in model.parameters()) == before.parameter_count()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"qk_norm_after_rope": "true"}, "there is none"),
        (
            {"qk_norm_after_rope": "true", "qk_norm": "true", "qk_norm_over": "all_heads"},
            "no norms over all heads",
        ),
    ],
)
def test_the_schema_refuses_at_the_field(model: dict[str, Any], message: str) -> None:
    fields = ", ".join(f"{k}: {v}" for k, v in model.items())
    with pytest.raises(SpecError) as error:
        parse_spec(
            "model: {vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, positional: rope, "
            f"{fields}}}\n"
        )
    issues = error.value.issues
    assert any(i.path == "model.qk_norm_after_rope" and message in i.message for i in issues), error.value


@pytest.mark.slow
def test_a_decoder_exports_with_parity(tmp_path: Path) -> None:
    assert_exports_with_parity(
        "model: {vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, n_kv_heads: 1, max_seq_len: 12, "
        "positional: rope, norm: {type: rmsnorm}, qk_norm: true, qk_norm_after_rope: true}\n",
        tmp_path / "bundle",
    )


@pytest.mark.slow
def test_a_trained_hunyuan_shaped_decoder_fuses_with_parity_and_generates_as_pytorch(tmp_path: Path) -> None:
    trained_decoder_generates_as_pytorch(tmp_path, ["model.qk_norm=true", "model.qk_norm_after_rope=true"])
