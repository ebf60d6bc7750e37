"""Multi-head scaled dot-product attention with grouped K/V heads (MHA, GQA, MQA).

Attention(Q, K, V) = softmax(scale * Q K^T + bias) V, with -inf where a query may not attend and
scale = 1 / sqrt(d_k) unless the spec says otherwise (T5: 1) (notes:
usc-csci467-transformers-pretraining.txt, "Scaled Dot-Product Attention").

Masks follow one convention everywhere: boolean, True where a query *may attend* to a key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.nn.ops import halves
from tfcompile.nn.positional import Rotary, apply_rotary


def may_attend(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    causal: bool,
    key_padding: torch.Tensor | None,
    window: int | None = None,
) -> torch.Tensor | None:
    """Combine the causal rule, a sliding window and key padding into one may-attend mask.

    q_positions: (Tq,), k_positions: (Tk,), key_padding: (B, Tk) bool, True for real tokens;
    window: a causal query at i attends to the keys at i - window + 1 .. i only, a bidirectional
    one (an odd window) to those at i - (window - 1) / 2 .. i + (window - 1) / 2.
    Returns (B or 1, 1, Tq, Tk) bool, or None when every query may attend to every key.
    """
    mask = None
    if causal:
        mask = (k_positions[None, :] <= q_positions[:, None])[None, None]  # (1, 1, Tq, Tk)
        if window is not None:
            mask = mask & (k_positions[None, :] > q_positions[:, None] - window)[None, None]
    elif window is not None:
        mask = ((k_positions[None, :] - q_positions[:, None]).abs() <= window // 2)[None, None]
    if key_padding is not None:
        padding = key_padding[:, None, None, :]  # (B, 1, 1, Tk)
        mask = padding if mask is None else mask & padding
        # A padded query whose keys are all masked would softmax over nothing (NaN); let it see
        # its own position. Real queries never see padded keys, so their outputs are unchanged.
        mask = mask | (k_positions[None, :] == q_positions[:, None])
    return mask


def additive_mask(
    mask: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """The float form SDPA adds to the scores: 0 where ``mask`` (bool, B|1, 1, Tq, Tk) may attend,
    -inf where not, plus the positional score ``bias`` (1, H, Tq, Tk) when there is one.

    A float mask, unlike a boolean one, exports to ONNX without a NaN guard over every
    (B, H, Tq, Tk) score tensor; may_attend never masks a whole row, so there is no NaN to guard.
    """
    if mask is None:
        return None if bias is None else bias.to(dtype)
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return additive if bias is None else additive + bias.to(dtype)


def causal_mask(T: int, S: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive mask (1, 1, T, S) of T queries at the last T of S positions under the causal
    rule alone: what SDPA's is_causal applies, for the paths that write attention out."""
    mask = may_attend(torch.arange(S - T, S, device=device), torch.arange(S, device=device), True, None)
    out = additive_mask(mask, None, dtype)
    assert out is not None  # a causal rule always masks
    return out


@dataclass
class KVCache:
    """One layer's keys and values so far, each (batch, n_kv_heads, length, head_dim). Attention
    appends the new tokens' keys and values, so after a forward pass it holds past + new."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def length(self) -> int:
        return self.key.shape[2]

    @classmethod
    def empty(
        cls,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> KVCache:
        """A cache holding no tokens: key and value (batch, n_kv_heads, 0, head_dim)."""
        shape = (batch, n_kv_heads, 0, head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )


class _MultiHead(nn.Module):
    """What self- and cross-attention share: head sizes, K/V head sharing, SDPA, the output
    projection. n_kv_heads = n_heads is MHA, 1 is MQA, anything between that divides n_heads is
    GQA: each K/V head serves n_heads / n_kv_heads query heads. Heads are ``head_dim`` wide
    (d_model / n_heads unless given: T5's d_kv), and the scores are q.k times ``scale``
    (1 / sqrt(head_dim) unless given). With ``qk_norm`` (a norm of a given width), each head's
    queries and keys are normalised over head_dim before RoPE (Qwen3, Gemma 3): one norm for the
    queries and one for the keys, each shared by every head; ``qk_norm_over_heads``, all the
    queries at once and all the keys at once (OLMo 2); ``qk_norm_after_rope``, each head's after
    RoPE turns it (HunYuan). With ``softcap`` c, the scaled scores
    become c * tanh(scores / c) before the mask and the softmax (Gemma 2, Grok), which bounds them
    to (-c, c). With ``clip`` c, the projected queries, keys and values are clamped to [-c, c]
    before any norm or rotation (OLMo, MPT). With ``sinks``, each head learns a logit s_h that
    joins every query's softmax as one more key, whose value is zero (GPT-OSS): the weights of the
    real keys are exp(score) / (sum exp(scores) + exp(s_h)), summing to less than 1. Each kind
    makes its input projections in ``_project``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        qkv_bias: bool,
        out_bias: bool,
        dropout: float,
        head_dim: int | None = None,
        scale: float | None = None,
        qk_norm: Callable[[int], nn.Module] | None = None,
        softcap: float | None = None,
        clip: float | None = None,
        qk_norm_over_heads: bool = False,
        qk_norm_after_rope: bool = False,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim or d_model // n_heads
        self.scale = scale
        self.softcap = softcap
        self.clip = clip
        self.dropout = dropout
        self.over_heads = qk_norm_over_heads
        self.norm_after_rope = qk_norm_after_rope
        q_width, k_width = (n_heads, n_kv_heads) if qk_norm_over_heads else (1, 1)
        self.q_norm = qk_norm(q_width * self.head_dim) if qk_norm is not None else nn.Identity()
        self.k_norm = qk_norm(k_width * self.head_dim) if qk_norm is not None else nn.Identity()
        self.out = nn.Linear(n_heads * self.head_dim, d_model, bias=out_bias)
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        self._project(d_model, qkv_bias)

    def _project(self, d_model: int, bias: bool) -> None:
        raise NotImplementedError

    def _clipped(self, x: torch.Tensor) -> torch.Tensor:
        """A projection's queries, keys or values clamped to [-clip, clip], where there is a clip."""
        return x if self.clip is None else x.clamp(-self.clip, self.clip)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """(B, T, n * hd) -> (B, n, T, hd)"""
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def _normed_heads(self, x: torch.Tensor, norm: nn.Module, n: int) -> torch.Tensor:
        """Projected queries or keys (B, T, n * hd) -> normed heads (B, n, T, hd): the norm over
        all n heads at once, or over each head's hd."""
        return self._heads(norm(x), n) if self.over_heads else norm(self._heads(x, n))

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """q (B, H, T, hd), k and v (B, Hkv, S, hd), attn_mask additive (.., T, S) -> (B, T, d_model).

        Grouped K/V heads go to SDPA as they are (``enable_gqa``, no copies) where its fused kernels
        take them: without a mask (with one, CUDA falls back to the math kernel) and outside an ONNX
        export, whose graphs keep the repeated form that `tfcompile optimize`'s fusers match. Elsewhere
        each K/V head is repeated for the query heads it serves."""
        B, _, T, _ = q.shape
        grouped = self.n_kv_heads != self.n_heads
        enable_gqa = (
            grouped
            and attn_mask is None
            and not torch.onnx.is_in_onnx_export()
            and not self.softcap
            and self.sinks is None
        )
        if grouped and not enable_gqa:
            repeats = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(repeats, dim=1)  # (B, H, S, hd)
            v = v.repeat_interleave(repeats, dim=1)
        if self.sinks is not None:
            k, v, attn_mask = self._with_sink(q, k, v, attn_mask, is_causal)
            is_causal = False
        dropout = self.dropout if self.training else 0.0
        if self.softcap:
            y = self._softcapped(q, k, v, attn_mask, is_causal, dropout)
        else:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout,
                is_causal=is_causal,
                scale=self.scale,
                enable_gqa=enable_gqa,
            )  # (B, H, T, hd)
        return self.out(y.transpose(1, 2).clone(memory_format=torch.contiguous_format).view(B, T, -1))

    def _with_sink(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each head's sink as one more key: k and v (B, H, S, hd) -> (B, H, S + 1, hd), the new key
        and value zero (its score q.0 = 0), and the additive mask -> (B|1, H, T, S + 1), s_h in the
        new column, so that SDPA's softmax counts exp(s_h) in every query's denominator."""
        assert self.sinks is not None
        T, S = q.shape[2], k.shape[2]
        if attn_mask is None:
            attn_mask = (
                causal_mask(T, S, q.dtype, q.device)
                if is_causal
                else torch.zeros((1, 1, T, S), dtype=q.dtype, device=q.device)
            )
        heads = attn_mask.expand(-1, self.n_heads, T, S)
        sink = self.sinks.to(q.dtype).view(1, -1, 1, 1).expand(heads.shape[0], -1, T, 1)
        zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
        return torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2), torch.cat([heads, sink], dim=-1)

    def _softcapped(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        dropout: float,
    ) -> torch.Tensor:
        """SDPA's computation written out, for the capped scores no fused kernel takes: q (B, H, T,
        hd), k and v (B, H, S, hd) -> (B, H, T, hd). The softmax runs in float32, as transformers'."""
        assert self.softcap is not None
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        scores = q @ k.transpose(-1, -2) * scale  # (B, H, T, S)
        scores = self.softcap * torch.tanh(scores / self.softcap)
        if is_causal:
            scores = scores + causal_mask(q.shape[2], k.shape[2], scores.dtype, scores.device)
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = F.dropout(scores.float().softmax(-1).to(q.dtype), dropout)
        return weights @ v


class Attention(_MultiHead):
    """Self-attention, (batch, seq, d_model) -> (batch, seq, d_model)."""

    def _project(self, d_model: int, bias: bool) -> None:
        self.qkv = nn.Linear(d_model, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary: Rotary | None = None,
        bias: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: (B, T, d_model); mask: bool (B|1, 1, T, S) may-attend, S = cached + T; is_causal: use
        the causal kernel instead of a mask; rotary: RoPE (cos, sin) for the new positions; bias:
        (1, H, T, S) added to scores; cache: past keys and values, extended in place."""
        q, k, v = self._clipped(self.qkv(x)).split(
            [self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim],
            dim=-1,
        )
        if self.norm_after_rope:
            q, k = self._heads(q, self.n_heads), self._heads(k, self.n_kv_heads)
        else:
            q = self._normed_heads(q, self.q_norm, self.n_heads)  # (B, H, T, hd)
            k = self._normed_heads(k, self.k_norm, self.n_kv_heads)  # (B, Hkv, T, hd)
        v = self._heads(v, self.n_kv_heads)  # (B, Hkv, T, hd)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
            if rotary.query_scale is not None:  # (T or B, T, 1): the same for every head
                q = q * rotary.query_scale.unsqueeze(-3).to(q.dtype)
        if self.norm_after_rope:  # each head's turned queries and keys
            q, k = self.q_norm(q), self.k_norm(k)
        if cache is not None:
            k = cache.key = torch.cat([cache.key, k], dim=2)  # (B, Hkv, S, hd)
            v = cache.value = torch.cat([cache.value, v], dim=2)
        if bias is not None and is_causal:
            raise ValueError("an attention bias needs an explicit causal mask, not is_causal")
        return self._attend(q, k, v, additive_mask(mask, bias, q.dtype), is_causal and mask is None)


class CrossAttention(_MultiHead):
    """Queries from the decoder, keys and values from the encoder's output (the memory):
    (batch, tgt_seq, d_model) x (batch, src_seq, d_model) -> (batch, tgt_seq, d_model)."""

    def _project(self, d_model: int, bias: bool) -> None:
        self.q = nn.Linear(d_model, self.n_heads * self.head_dim, bias=bias)
        self.kv = nn.Linear(d_model, 2 * self.n_kv_heads * self.head_dim, bias=bias)

    def project_memory(self, memory: torch.Tensor) -> KVCache:
        """memory (B, S, d_model) -> its keys and values (B, Hkv, S, hd): computed once per source
        sentence, reused at every decoding step."""
        k, v = halves(self._clipped(self.kv(memory)))
        return KVCache(self._normed_heads(k, self.k_norm, self.n_kv_heads), self._heads(v, self.n_kv_heads))

    def forward(self, x: torch.Tensor, memory: KVCache, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d_model); memory: project_memory's keys and values; mask: bool (B, 1, 1, S),
        True at real source tokens."""
        q = self._normed_heads(self._clipped(self.q(x)), self.q_norm, self.n_heads)  # (B, H, T, hd)
        if mask is not None:  # a row per query: onnxruntime's Attention (opset 23) broadcasts none
            mask = mask.expand(-1, -1, q.shape[2], -1)  # (B, 1, T, S)
        return self._attend(q, memory.key, memory.value, additive_mask(mask, None, q.dtype), False)
