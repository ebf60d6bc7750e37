"""Pre-norm and post-norm wiring (notes: cmu-11711-transformers.txt, "Post- vs. Pre- Layer Norm")."""

import pytest
import torch
from helpers import tiny_model

from tfcompile.models import DecoderLM
from tfcompile.nn.block import DropPath, TransformerBlock, build_blocks


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


def test_stochastic_depth_drops_whole_examples_and_keeps_the_expectation() -> None:
    drop = DropPath(0.25).train()
    x = torch.randn(4000, 5, 8)
    y = drop(x)
    kept = (y != 0).flatten(1).any(1)
    torch.testing.assert_close(y[kept], x[kept] / 0.75)  # kept examples are scaled whole
    assert y[~kept].eq(0).all() and 0.2 < 1 - kept.float().mean() < 0.3
    assert torch.equal(drop.eval()(x), x)


def test_stochastic_depth_rises_linearly_with_depth_and_leaves_the_weights_alone() -> None:
    spec = tiny_model(n_layers=4, dropout={"path": 0.3})
    rates = [
        block.drop[1].p if isinstance(block.drop, torch.nn.Sequential) else 0.0
        for block in build_blocks(spec, 4)
    ]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    plain, dropped = DecoderLM(tiny_model(n_layers=4)), DecoderLM(spec)
    assert plain.state_dict().keys() == dropped.state_dict().keys()  # checkpoints and exports unchanged
    ids = torch.randint(0, spec.vocab_size or 1, (2, 6))
    dropped.load_state_dict(plain.state_dict())
    torch.testing.assert_close(dropped.eval()(ids), plain.eval()(ids))  # the identity in evaluation
    torch.manual_seed(0)
    assert not torch.equal(dropped.train()(ids), dropped.train()(ids))  # random while training
