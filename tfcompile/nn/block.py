"""One Transformer layer: self-attention, cross-attention to an encoder's output (decoders of
encoder-decoder models only) and feed-forward sublayers, each wrapped in a residual connection
with the norm before (pre) or after (post) it (notes: cmu-11711, "Post- vs. Pre-")."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from tfcompile.nn.attention import Attention, CrossAttention, KVCache
from tfcompile.nn.feedforward import FeedForward
from tfcompile.nn.moe import MoE
from tfcompile.nn.positional import Rotary
from tfcompile.nn.registry import NORMS
from tfcompile.spec.schema import ParallelBlock

if TYPE_CHECKING:
    from tfcompile.spec.schema import NormSpec, TransformerSpec


OUTPUT_NORMS = ("sandwich", "output")  # the positions with a norm on each sublayer's output


def build_norm(spec: NormSpec, dim: int) -> nn.Module:
    return NORMS[spec.type](dim, eps=spec.eps, bias=spec.bias, scale=spec.scale)


Kind = TypeVar("Kind", Attention, CrossAttention)


def build_attention(kind: type[Kind], spec: TransformerSpec) -> Kind:
    """Self- or cross-attention with the spec's heads, biases, dropout, scale and q/k norms (the
    norm section's kind, over head_dim)."""
    assert spec.n_kv_heads is not None  # resolved by the schema
    return kind(
        spec.d_model,
        spec.n_heads,
        spec.n_kv_heads,
        qkv_bias=spec.bias.qkv,
        out_bias=spec.bias.attn_out,
        dropout=spec.dropout.attention,
        head_dim=spec.head_dim,
        scale=spec.attention_scale,
        qk_norm=partial(build_norm, spec.norm) if spec.qk_norm else None,
        qk_norm_over_heads=spec.qk_norm_over == "all_heads",
        qk_norm_after_rope=spec.qk_norm_after_rope,
        softcap=spec.attention_softcap,
        clip=spec.qkv_clip,
        sinks=spec.attention_sinks and kind is Attention,  # self-attention's
    )


def build_blocks(spec: TransformerSpec, count: int, cross_attention: bool = False) -> nn.ModuleList:
    """``count`` blocks whose stochastic-depth rates rise linearly from 0 at the first block to
    ``spec.dropout.path`` at the last (Huang et al. 2016, as DeiT and timm schedule it)."""
    rates = [spec.dropout.path * i / max(count - 1, 1) for i in range(count)]
    routed = spec.routed_layers(count)
    return nn.ModuleList(
        TransformerBlock(spec, cross_attention, drop_path=rate, routed=i in routed, first=i == 0)
        for i, rate in enumerate(rates)
    )


class DropPath(nn.Module):
    """Stochastic depth: while training, each example's branch is zeroed with probability ``p``
    and the kept ones scaled by 1 / (1 - p), so that the expectation is the branch itself; the
    identity in evaluation."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= self.p  # (B, 1, 1)
        return x * keep.to(x.dtype) / (1 - self.p)


def build_final_norm(spec: TransformerSpec) -> nn.Module:
    """The norm after a stack's last block where the spec has one (pre-norm), else the identity."""
    return build_norm(spec.norm, spec.d_model) if spec.norm.final else nn.Identity()


class TransformerBlock(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model).

    pre-norm:  x = x + f(norm(x))          (GPT-2, LLaMA)
    post-norm: x = norm(x + f(x))          (Vaswani et al. 2017)
    sandwich:  x = x + norm'(f(norm(x)))   (Gemma 2 and 3: a norm on each sublayer's output too)
    output:    x = x + norm(f(x))          (OLMo 2: on each sublayer's output only)
    parallel:  x = x + attn(norm1(x)) + ffn(norm2(x)), norm2 = norm1 with a shared norm (GPT-J,
               GPT-NeoX, PaLM; pre-norm only)

    The feed-forward is a mixture of experts (tfcompile.nn.moe) where ``routed``; the ``first``
    block's attention reads x without its norm where the spec's norm.first_attention is false
    (ModernBERT). Each f's output
    (a parallel block's sum) is multiplied by the spec's ``residual_multiplier``
    (Granite's; 1 by default) and, while training, goes through dropout and, with ``drop_path``,
    stochastic depth.
    """

    def __init__(
        self,
        spec: TransformerSpec,
        cross_attention: bool = False,
        drop_path: float = 0.0,
        routed: bool = False,
        first: bool = False,
    ) -> None:
        super().__init__()
        assert spec.n_kv_heads is not None and spec.d_ff is not None  # resolved by the schema
        position = spec.norm.position
        self.pre_norm = position != "post"
        self.parallel = spec.block.type == "parallel"

        def output_norm() -> nn.Module:  # sandwich and output norms only
            return build_norm(spec.norm, spec.d_model) if position in OUTPUT_NORMS else nn.Identity()

        def input_norm() -> nn.Module:  # all but output norms
            return nn.Identity() if position == "output" else build_norm(spec.norm, spec.d_model)

        self.attn_norm = nn.Identity() if first and not spec.norm.first_attention else input_norm()
        self.attn = build_attention(Attention, spec)
        self.attn_out_norm = output_norm()
        self.cross: CrossAttention | None = None
        if cross_attention:
            self.cross_norm = input_norm()
            self.cross = build_attention(CrossAttention, spec)
            self.cross_out_norm = output_norm()
        shared = isinstance(spec.block, ParallelBlock) and spec.block.shared_norm
        self.ffn_norm = None if shared else input_norm()
        self.ffn: nn.Module = (
            MoE(spec.d_model, spec.moe, spec.activation, bias=spec.bias.ffn)
            if routed and spec.moe is not None
            else FeedForward(spec.d_model, spec.d_ff, spec.activation, bias=spec.bias.ffn)
        )
        self.ffn_out_norm = output_norm()
        dropout = nn.Dropout(spec.dropout.residual)
        self.drop = nn.Sequential(dropout, DropPath(drop_path)) if drop_path else dropout
        self.multiplier = spec.residual_multiplier

    def _branch(self, h: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual stream: dropped out (and stochastic
        depth) while training, times the residual multiplier."""
        h = self.drop(h)
        return h if self.multiplier == 1.0 else h * self.multiplier

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary: Rotary | None = None,
        bias: torch.Tensor | None = None,
        cache: KVCache | None = None,
        memory: KVCache | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """memory: the encoder output's keys and values for cross-attention (CrossAttention.
        project_memory); memory_mask: bool (B, 1, 1, S), True at real source tokens."""
        if (memory is None) != (self.cross is None):
            raise ValueError("memory must be given exactly when the block has cross-attention")
        if self.parallel:  # the schema keeps cross-attention out of parallel blocks
            h = self.attn_norm(x)
            attended = self.attn(h, mask, is_causal, rotary, bias, cache)
            fed = self.ffn(h if self.ffn_norm is None else self.ffn_norm(x))
            return x + self._branch(attended + fed)  # one dropout and stochastic depth for the block
        ffn_norm = self.ffn_norm
        assert ffn_norm is not None  # sequential blocks have their own
        if self.pre_norm:
            x = x + self._branch(
                self.attn_out_norm(self.attn(self.attn_norm(x), mask, is_causal, rotary, bias, cache))
            )
            if self.cross is not None and memory is not None:
                x = x + self._branch(self.cross_out_norm(self.cross(self.cross_norm(x), memory, memory_mask)))
            x = x + self._branch(self.ffn_out_norm(self.ffn(ffn_norm(x))))
        else:
            x = self.attn_norm(x + self._branch(self.attn(x, mask, is_causal, rotary, bias, cache)))
            if self.cross is not None and memory is not None:
                x = self.cross_norm(x + self._branch(self.cross(x, memory, memory_mask)))
            x = ffn_norm(x + self._branch(self.ffn(x)))
        return x
