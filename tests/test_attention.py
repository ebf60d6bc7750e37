"""Attention against softmax(QK^T / sqrt(d) + bias) V with -inf where masked, and GQA against
MHA with repeated K/V heads."""

import math

import pytest
import torch

from tfcompile.nn.attention import Attention, CrossAttention, additive_mask, may_attend
from tfcompile.nn.positional import Rotary, apply_rotary


def _reference(attn: Attention, x: torch.Tensor, may_attend: torch.Tensor | None, bias=None, rotary=None):
    """The formula, written out with explicit per-head K/V sharing."""
    B, T, _ = x.shape
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q = qkv[..., : H * hd].view(B, T, H, hd).transpose(1, 2)
    k = qkv[..., H * hd : (H + Hkv) * hd].view(B, T, Hkv, hd).transpose(1, 2)
    v = qkv[..., (H + Hkv) * hd :].view(B, T, Hkv, hd).transpose(1, 2)
    if rotary is not None:
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
    heads = []
    for h in range(H):
        g = h // (H // Hkv)  # the K/V head that query head h reads
        scale = attn.scale if attn.scale is not None else 1 / math.sqrt(hd)
        scores = q[:, h] @ k[:, g].transpose(-1, -2) * scale  # (B, T, T)
        if bias is not None:
            scores = scores + bias[0, h]
        if may_attend is not None:
            scores = scores.masked_fill(~may_attend[:, 0], float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[:, g])
    y = torch.cat(heads, dim=-1)
    return y @ attn.out.weight.T + (attn.out.bias if attn.out.bias is not None else 0)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_attention_matches_formula(n_kv_heads: int) -> None:
    attn = Attention(32, 4, n_kv_heads, qkv_bias=True, out_bias=True, dropout=0.0)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x), _reference(attn, x, None), atol=1e-5, rtol=1e-4)


def test_head_size_and_scale_of_their_own_match_formula() -> None:
    """T5: heads of d_kv whatever d_model / n_heads is, and q.k unscaled."""
    attn = Attention(32, 4, 2, qkv_bias=False, out_bias=False, dropout=0.0, head_dim=6, scale=1.0)
    assert attn.qkv.weight.shape == ((4 + 2 * 2) * 6, 32) and attn.out.weight.shape == (32, 4 * 6)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x), _reference(attn, x, None), atol=1e-5, rtol=1e-4)
    default = Attention(32, 4, 2, qkv_bias=False, out_bias=False, dropout=0.0, head_dim=6)
    default.load_state_dict(attn.state_dict())
    assert (default(x) - attn(x)).abs().max() > 1e-3  # 1/sqrt(6) is another model


def test_cross_attention_takes_the_head_size_and_scale() -> None:
    cross = CrossAttention(16, 2, 2, qkv_bias=False, out_bias=False, dropout=0.0, head_dim=5, scale=0.5)
    x, memory = torch.randn(1, 3, 16), torch.randn(1, 4, 16)
    q = (x @ cross.q.weight.T).view(1, 3, 2, 5).transpose(1, 2)
    k, v = (memory @ cross.kv.weight.T).view(1, 4, 2, 2, 5).permute(2, 0, 3, 1, 4)
    y = torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1) @ v  # (1, H, 3, 5)
    expected = y.transpose(1, 2).reshape(1, 3, 10) @ cross.out.weight.T
    torch.testing.assert_close(cross(x, cross.project_memory(memory)), expected, atol=1e-5, rtol=1e-4)


def test_causal_kernel_equals_explicit_causal_mask() -> None:
    attn = Attention(32, 4, 4, qkv_bias=False, out_bias=False, dropout=0.0)
    x = torch.randn(2, 9, 32)
    pos = torch.arange(9)
    mask = may_attend(pos, pos, causal=True, key_padding=None)
    torch.testing.assert_close(attn(x, is_causal=True), attn(x, mask=mask), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attn(x, mask=mask), _reference(attn, x, mask), atol=1e-5, rtol=1e-4)


def test_padding_mask_with_bias_and_rope_matches_formula() -> None:
    attn = Attention(32, 4, 2, qkv_bias=False, out_bias=True, dropout=0.0)
    x = torch.randn(2, 6, 32)
    pos = torch.arange(6)
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    mask = may_attend(pos, pos, causal=True, key_padding=padding)
    bias = torch.randn(1, 4, 6, 6)
    angles = pos[:, None].float() * torch.tensor([1.0, 0.1, 0.01, 0.001])
    rotary = Rotary(angles.cos(), angles.sin())
    out = attn(x, mask=mask, bias=bias, rotary=rotary)
    expected = _reference(attn, x, mask, bias=bias, rotary=rotary)
    torch.testing.assert_close(out[:, :4], expected[:, :4], atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out).all()  # padded queries see themselves, not NaN


def test_gqa_equals_mha_with_repeated_kv_heads() -> None:
    gqa = Attention(32, 4, 2, qkv_bias=True, out_bias=True, dropout=0.0)
    mha = Attention(32, 4, 4, qkv_bias=True, out_bias=True, dropout=0.0)
    hd = 8
    with torch.no_grad():
        wq, wk, wv = gqa.qkv.weight.split([4 * hd, 2 * hd, 2 * hd])
        bq, bk, bv = gqa.qkv.bias.split([4 * hd, 2 * hd, 2 * hd])

        def repeat(t: torch.Tensor) -> torch.Tensor:  # K/V head g serves query heads 2g and 2g+1
            return t.unflatten(0, (2, hd)).repeat_interleave(2, dim=0).flatten(0, 1)

        mha.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(gqa(x, is_causal=True), mha(x, is_causal=True), atol=1e-6, rtol=1e-5)


def test_mask_convention_is_may_attend() -> None:
    pos = torch.arange(4)
    mask = may_attend(pos, pos, causal=True, key_padding=None)
    assert mask.dtype == torch.bool and mask.shape == (1, 1, 4, 4)
    assert torch.equal(mask[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    # With a cache offset (queries at 3..4 over keys 0..4) the rule is key <= query.
    offset = may_attend(torch.arange(3, 5), torch.arange(5), causal=True, key_padding=None)
    assert offset[0, 0].tolist() == [[True, True, True, True, False], [True] * 5]


def test_additive_mask_is_zero_where_allowed_and_minus_inf_elsewhere_plus_bias() -> None:
    pos = torch.arange(3)
    mask = may_attend(pos, pos, causal=True, key_padding=None)
    additive = additive_mask(mask, None, torch.bfloat16)
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive == 0, mask) and torch.isneginf(additive[~mask]).all()
    bias = torch.randn(1, 2, 3, 3)
    combined = additive_mask(mask, bias, torch.float32)
    assert combined.shape == (1, 2, 3, 3)
    assert torch.equal(combined[mask.expand(1, 2, 3, 3)], bias[mask.expand(1, 2, 3, 3)])
    assert additive_mask(None, None, torch.float32) is None
    assert torch.equal(additive_mask(None, bias, torch.float32), bias)


def test_bias_with_kernel_causal_is_refused() -> None:
    attn = Attention(16, 2, 2, qkv_bias=False, out_bias=False, dropout=0.0)
    with pytest.raises(ValueError, match="explicit causal mask"):
        attn(torch.randn(1, 3, 16), is_causal=True, bias=torch.zeros(1, 2, 3, 3))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_cross_attention_matches_formula_and_ignores_padded_source(n_kv_heads: int) -> None:
    cross = CrossAttention(32, 4, n_kv_heads, qkv_bias=True, out_bias=True, dropout=0.0).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    source = torch.tensor([[1] * 7, [1] * 4 + [0] * 3], dtype=torch.bool)
    out = cross(x, cross.project_memory(memory), source[:, None, None, :])
    H, Hkv, hd = 4, n_kv_heads, 8
    q = (x @ cross.q.weight.T + cross.q.bias).view(2, 5, H, hd).transpose(1, 2)
    kv = memory @ cross.kv.weight.T + cross.kv.bias
    k = kv[..., : Hkv * hd].view(2, 7, Hkv, hd).transpose(1, 2)
    v = kv[..., Hkv * hd :].view(2, 7, Hkv, hd).transpose(1, 2)
    heads = []
    for h in range(H):
        g = h // (H // Hkv)
        scores = (q[:, h] @ k[:, g].transpose(-1, -2) / math.sqrt(hd)).masked_fill(
            ~source[:, None, :], -math.inf
        )
        heads.append(torch.softmax(scores, -1) @ v[:, g])
    expected = torch.cat(heads, -1) @ cross.out.weight.T + cross.out.bias
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    # Whatever sits at the padded source positions never reaches the output.
    changed = memory.clone()
    changed[1, 4:] = torch.randn(3, 32) * 100
    torch.testing.assert_close(cross(x, cross.project_memory(changed), source[:, None, None, :])[1], out[1])
