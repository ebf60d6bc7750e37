"""Pre-norm and post-norm wiring (notes: cmu-11711-transformers.txt, "Post- vs. Pre- Layer Norm")."""

import pytest
import torch
from helpers import tiny_model

from tfcompile.nn.block import TransformerBlock


def _block(position: str) -> TransformerBlock:
    block = TransformerBlock(tiny_model(norm={"position": position}))
    with torch.no_grad():  # non-trivial norm gains, so that the order of operations shows
        for norm in (block.attn_norm, block.ffn_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
    return block.eval()


def test_pre_norm_is_x_plus_f_of_norm_x() -> None:
    block = _block("pre")
    x = torch.randn(2, 5, 32)
    h = x + block.attn(block.attn_norm(x), is_causal=True)
    expected = h + block.ffn(block.ffn_norm(h))
    torch.testing.assert_close(block(x, is_causal=True), expected)


def test_post_norm_is_norm_of_x_plus_f_x() -> None:
    block = _block("post")
    x = torch.randn(2, 5, 32)
    h = block.attn_norm(x + block.attn(x, is_causal=True))
    expected = block.ffn_norm(h + block.ffn(h))
    torch.testing.assert_close(block(x, is_causal=True), expected)


def test_post_norm_output_is_normalised_and_pre_norm_is_not() -> None:
    x = torch.randn(2, 5, 32) * 10
    post, pre = TransformerBlock(tiny_model(norm={"position": "post"})), TransformerBlock(tiny_model())
    out = post.eval()(x, is_causal=True)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    assert pre.eval()(x, is_causal=True).std(-1).mean() > 5  # the residual stream keeps its scale


def test_cross_attention_sits_between_self_attention_and_the_feed_forward() -> None:
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    source = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    for position in ("pre", "post"):
        block = TransformerBlock(tiny_model(norm={"position": position}), cross_attention=True).eval()
        assert block.cross is not None
        kv = block.cross.project_memory(memory)
        if position == "pre":
            h = x + block.attn(block.attn_norm(x), is_causal=True)
            h = h + block.cross(block.cross_norm(h), kv, source)
            expected = h + block.ffn(block.ffn_norm(h))
        else:
            h = block.attn_norm(x + block.attn(x, is_causal=True))
            h = block.cross_norm(h + block.cross(h, kv, source))
            expected = block.ffn_norm(h + block.ffn(h))
        torch.testing.assert_close(block(x, is_causal=True, memory=kv, memory_mask=source), expected)
    with pytest.raises(ValueError, match="memory must be given exactly when"):
        block(x, is_causal=True)
    with pytest.raises(ValueError, match="memory must be given exactly when"):
        TransformerBlock(tiny_model())(x, is_causal=True, memory=kv)
