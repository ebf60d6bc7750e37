"""GPT-OSS's choices as spec fields: ``attention_sinks`` (a learned logit per head in every
query's softmax, a key whose value is zero), ``activation: swiglu_clamped`` (g sigmoid(1.702 g)
(u + 1), the gate clamped to at most 7 and the up projection to [-7, 7]) and ``moe.router_bias``.
Held to their formulas (sinks with grouped K/V heads, padding, a sliding window and the KV cache),
counted by the spec (tests/test_counts.py), refused by field where they have no meaning, exported
with parity and generated with the KV cache in onnxruntime as PyTorch does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import randomised, tiny_model, trained_decoder_generates_as_pytorch

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.nn.attention import may_attend
from tfcompile.nn.feedforward import FeedForward
from tfcompile.nn.moe import MoE
from tfcompile.nn.positional import apply_rotary
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.spec.schema import MoESpec


@pytest.mark.parametrize("case", ["causal", "padded", "window"])
def test_sinks_join_every_querys_softmax_as_a_key_of_no_value(case: str) -> None:
    """Self-attention with grouped K/V heads against softmax([s, s_h]) over the keys and the sink,
    the sink's weight dropped: exp(s_i) / (sum_j exp(s_j) + exp(s_h)); with the KV cache, the same
    one token at a time."""
    window = {"window": {"size": 3}} if case == "window" else {}
    spec = tiny_model(attention_sinks=True, n_kv_heads=2, positional="rope", **window)
    model = randomised(DecoderLM(spec))
    attn, hd = model.blocks[0].attn, spec.head_dim
    assert hd is not None and attn.sinks is not None and attn.sinks.shape == (4,)
    x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([4 * hd, 2 * hd, 2 * hd], -1)
    q, k, v = (t.reshape(2, 6, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
    rotary = model.positional.rotary(torch.arange(6))
    q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2) / hd**0.5  # (B, H, T, T)
    padding = torch.ones(2, 6, dtype=torch.bool)
    if case == "padded":
        padding[1, 4:] = False
    size = 3 if case == "window" else None
    mask = may_attend(torch.arange(6), torch.arange(6), True, padding if case == "padded" else None, size)
    assert mask is not None
    scores = scores.masked_fill(~mask, float("-inf"))
    sinks = attn.sinks.view(1, 4, 1, 1).expand(2, 4, 6, 1)
    weights = torch.cat([scores, sinks], -1).softmax(-1)[..., :-1]
    assert (weights.sum(-1) < 0.9).sum() > 6  # the sinks take a part
    y = (weights @ v).transpose(1, 2).reshape(2, 6, -1)
    expected = F.linear(y, attn.out.weight, attn.out.bias)
    close = {"rtol": 1e-6, "atol": 1e-6}  # RoPE turns q and k in float32
    with torch.no_grad():
        torch.testing.assert_close(attn(x, mask, rotary=rotary), expected, **close)
        if case == "causal":
            torch.testing.assert_close(attn(x, is_causal=True, rotary=rotary), expected, **close)
            cache = model.empty_cache(2)[0]
            steps = [
                attn(x[:, t : t + 1], rotary=model.positional.rotary(torch.tensor([t])), cache=cache)
                for t in range(6)
            ]
            torch.testing.assert_close(torch.cat(steps, 1), expected, **close)


def test_the_clamped_swiglu_is_gpt_oss_formula() -> None:
    """FFN(x) = (c(g) sigmoid(1.702 c(g)) (clamp(u, -7, 7) + 1)) W2, c(g) = min(g, 7): values past
    the clamps on both sides."""
    ffn = randomised(FeedForward(8, 6, "swiglu_clamped", bias=True))
    with torch.no_grad():
        ffn.w_in.weight.mul_(20)  # gates and ups past +-7
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    gate, up = F.linear(x, ffn.w_in.weight, ffn.w_in.bias).chunk(2, -1)
    assert gate.max() > 7 and up.min() < -7 and up.max() > 7
    g = gate.clamp(max=7.0)
    h = g * torch.sigmoid(1.702 * g) * (up.clamp(-7.0, 7.0) + 1)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), F.linear(h, ffn.w_out.weight, ffn.w_out.bias))


def test_a_router_bias_shifts_each_experts_logit() -> None:
    """softmax(x W_r + b_r) routes: a large bias on one expert sends every token to it."""
    moe = randomised(MoE(8, MoESpec(experts=4, top_k=1, d_ff=6, router_bias=True), "swiglu", bias=False))
    assert moe.router.bias is not None and moe.router.bias.shape == (4,)
    with torch.no_grad():
        moe.router.bias.copy_(torch.tensor([0.0, 0.0, 100.0, 0.0], dtype=torch.float64))
        x = torch.randn(2, 5, 8, dtype=torch.float64)
        torch.testing.assert_close(moe(x), moe.experts[2](x))


def test_sinks_with_a_capped_score_are_refused_by_field() -> None:
    with pytest.raises(SpecError, match=r"model\.attention_sinks: with attention_softcap"):
        parse_spec(
            "model: {vocab_size: 50, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 16, "
            "attention_sinks: true, attention_softcap: 20.0}\n"
        )


TINY_MODEL = "vocab_size: 64, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 16"
BUNDLES = {
    "decoder": f"model: {{{TINY_MODEL}, attention_sinks: true, positional: rope, activation: swiglu_clamped, "
    "window: {size: 4, layers: [0]}, moe: {experts: 3, top_k: 2, router_bias: true}}\n",
    "translator": f"model: {{family: encoder_decoder, {TINY_MODEL}, attention_sinks: true, "
    "activation: swiglu_clamped}\ntask: seq2seq\n",
    "classifier": f"model: {{family: encoder, {TINY_MODEL}, attention_sinks: true}}\n"
    "task: {type: classification, labels: [a, b]}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    reports = export_bundle(parse_spec(text), Source(seed=0), tmp_path / "bundle")
    assert all(r.passed for r in reports.values()), {n: r.to_dict() for n, r in reports.items()}


@pytest.mark.slow
def test_a_trained_gpt_oss_shaped_decoder_generates_as_pytorch(tmp_path: Path) -> None:
    """Trained one step, exported, optimized with parity; the bundles generate PyTorch's greedy
    tokens with the KV cache, a left-padded row as it would alone."""
    overrides = [
        "model.n_kv_heads=1",
        "model.attention_sinks=true",
        "model.activation=swiglu_clamped",
        "model.moe={experts: 3, top_k: 2, router_bias: true}",
        "model.bias.qkv=true",
        "model.bias.attn_out=true",
    ]
    trained_decoder_generates_as_pytorch(tmp_path, overrides)


LLAMA = "positional: rope, norm: {type: rmsnorm, bias: false}"


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (f"{LLAMA}, activation: swiglu, attention_sinks: true", "model.activation: 'swiglu' has no GPT-OSS"),
        (f"{LLAMA}, activation: swiglu_clamped", "model.attention_sinks: False has no GPT-OSS"),
        (
            f"{LLAMA}, activation: swiglu, moe: {{experts: 2, top_k: 1, router_bias: true}}",
            "model.attention_sinks: False has no GPT-OSS",
        ),
        ("attention_sinks: true", "model.attention_sinks: True has no GPT-2 equivalent"),
        ("activation: swiglu_clamped", "model.activation: 'swiglu_clamped' has no GPT-2 equivalent"),
    ],
)
def test_export_hf_refuses_them_by_field(tmp_path: Path, model: str, field: str) -> None:
    """Only GPT-OSS has sinks, the clamped SwiGLU and a router's bias: a LLaMA-like decoder with one
    of them is written as GPT-OSS, which names the others it lacks; any other architecture refuses
    them, as written without them the folder would compute otherwise."""
    from helpers import random_run

    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    run = random_run(
        tmp_path,
        f"model: {{vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, {model}}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert field in str(error.value)
    assert not (tmp_path / "out").exists()
