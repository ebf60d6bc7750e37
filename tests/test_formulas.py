"""Whole assemblies against references written from the formulas alone, in float64.

Each reference below is plain torch, one line per formula, reading only the modules' weights:
positions count a row's real tokens; sinusoidal PE[t, 2k] = sin(t w_k), PE[t, 2k+1] = cos(t w_k),
w_k = 10000^(-2k/d) (notes: cmu-11711-transformers.txt, wisc-cs839-foundation-models.txt); RoPE as
a complex product (x_2i + i x_2i+1) e^(i m theta_i) (Su et al. 2021) or, in the halves layout,
Hugging Face's rotate_half; T5's relative buckets (Raffel et al. 2020) as scalar arithmetic;
attention softmax(scale q.k + bias) v with each K/V head serving n_heads / n_kv_heads consecutive
query heads (transformers' repeat_kv); LayerNorm and RMSNorm with eps inside the square root;
FFN f(x W1 + b1) W2 + b2 and the gated f(x W_gate) * (x W_up); pre- and post-norm residuals.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from tfcompile.models import DecoderLM, MaskedLM, Seq2Seq, VisionTransformer
from tfcompile.nn.block import TransformerBlock
from tfcompile.nn.positional import relative_position_bucket, rope_frequencies
from tfcompile.spec import Spec
from tfcompile.spec.presets import merge
from tfcompile.spec.schema import RopePositional, TransformerSpec

ACT = {
    "relu": lambda x: x.clamp(min=0),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * torch.sigmoid(x),
}
GATED = {"swiglu": ACT["silu"], "geglu": ACT["gelu"], "geglu_tanh": ACT["gelu_tanh"]}  # Shazeer 2020
ACT |= GATED


def _randomise(model: torch.nn.Module) -> torch.nn.Module:
    """float64, every weight random (norm gains and biases too, so that their places show), eval."""
    torch.manual_seed(0)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def _norm(x: torch.Tensor, module: torch.nn.Module, kind: str, eps: float) -> torch.Tensor:
    g, b = module.weight, module.bias
    if kind == "layernorm":
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    else:
        y = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
    return g * y + (0 if b is None else b)


def _ffn(x: torch.Tensor, ffn: torch.nn.Module, activation: str, d_ff: int) -> torch.Tensor:
    h = _linear(x, ffn.w_in)  # (B, T, d_ff), or gate then up (B, T, 2 d_ff)
    f = ACT[activation]
    return _linear(f(h[..., :d_ff]) * h[..., d_ff:] if activation in GATED else f(h), ffn.w_out)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 -> each real token's index among its row's real tokens (padding: 0)."""
    out = torch.zeros_like(mask)
    for b in range(mask.shape[0]):
        n = 0
        for t in range(mask.shape[1]):
            if mask[b, t]:
                out[b, t], n = n, n + 1
    return out


def _sinusoidal(positions: torch.Tensor, d: int) -> torch.Tensor:
    """(...,) -> (..., d): PE[t, 2k] = sin(t w_k), PE[t, 2k+1] = cos(t w_k), w_k = 10000^(-2k/d)."""
    out = torch.zeros(*positions.shape, d, dtype=torch.float64)
    for k in range(d // 2):
        w = 10000.0 ** (-2 * k / d)
        out[..., 2 * k] = torch.sin(positions * w)
        out[..., 2 * k + 1] = torch.cos(positions * w)
    return out


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float, layout: str) -> torch.Tensor:
    """x (B, H, T, hd), positions (B, T): pair i turns m theta^(-2i/hd) at position m."""
    hd = x.shape[-1]
    angle = positions[:, None, :, None] * theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    if layout == "interleaved":  # (x_2i + i x_2i+1) e^(i angle)
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], hd // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    rotate_half = torch.cat((-x[..., hd // 2 :], x[..., : hd // 2]), -1)
    return x * cos + rotate_half * sin


def _t5_bucket(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of the offset key - query, as scalar arithmetic."""
    bucket, n = 0, -relative
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets * (n < 0)
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    far = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(far, num_buckets - 1)


def _relative_bias(
    table: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, bidirectional: bool, nb: int, md: int
) -> torch.Tensor:
    """table (num_buckets, H), qpos (B, Tq), kpos (B, Tk) -> (B, H, Tq, Tk)."""
    B, Tq, Tk = qpos.shape[0], qpos.shape[1], kpos.shape[1]
    buckets = torch.tensor(
        [
            [
                [_t5_bucket(int(kpos[b, j] - qpos[b, i]), bidirectional, nb, md) for j in range(Tk)]
                for i in range(Tq)
            ]
            for b in range(B)
        ]
    )
    return table[buckets].permute(0, 3, 1, 2)


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float, bias: Any
) -> torch.Tensor:
    """q (B, H, T, hd), k v (B, Hkv, S, hd), allowed (B, 1, T, S) -> (B, T, H * hd)."""
    B, H, T, hd = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    # transformers' repeat_kv: query head h reads K/V head h // (H / Hkv)
    k = k[:, :, None].expand(B, Hkv, H // Hkv, S, hd).reshape(B, H, S, hd)
    v = v[:, :, None].expand(B, Hkv, H // Hkv, S, hd).reshape(B, H, S, hd)
    scores = scale * q @ k.transpose(-1, -2) + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)


def _split_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    B, T, _ = x.shape
    return x.reshape(B, T, n, -1).transpose(1, 2)


class _Context:
    """What every block of a stack shares: positions, the may-attend mask, the score bias."""

    def __init__(self, spec: TransformerSpec, qpos: torch.Tensor, allowed: torch.Tensor, bias: Any) -> None:
        self.spec, self.qpos, self.allowed, self.bias = spec, qpos, allowed, bias


def _self_attention(x: torch.Tensor, attn: torch.nn.Module, ctx: _Context) -> torch.Tensor:
    s = ctx.spec
    assert s.n_kv_heads is not None and s.head_dim is not None and s.attention_scale is not None
    q, k, v = _linear(x, attn.qkv).split([s.n_heads * s.head_dim] + [s.n_kv_heads * s.head_dim] * 2, -1)
    q, k, v = _split_heads(q, s.n_heads), _split_heads(k, s.n_kv_heads), _split_heads(v, s.n_kv_heads)
    if s.positional.type == "rope":
        q = _rope(q, ctx.qpos, s.positional.theta, s.positional.layout)
        k = _rope(k, ctx.qpos, s.positional.theta, s.positional.layout)
    return _linear(_attention(q, k, v, ctx.allowed, s.attention_scale, ctx.bias), attn.out)


def _cross_attention(x: torch.Tensor, memory: torch.Tensor, cross: Any, s: Any, allowed: Any) -> torch.Tensor:
    q = _split_heads(_linear(x, cross.q), s.n_heads)
    k, v = _linear(memory, cross.kv).chunk(2, -1)
    k, v = _split_heads(k, s.n_kv_heads), _split_heads(v, s.n_kv_heads)
    return _linear(_attention(q, k, v, allowed, s.attention_scale, 0.0), cross.out)


def _block(
    x: torch.Tensor, block: TransformerBlock, ctx: _Context, memory: Any = None, memory_allowed: Any = None
) -> torch.Tensor:
    s = ctx.spec
    assert s.d_ff is not None

    def norm(module: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        return _norm(h, module, s.norm.type, s.norm.eps)

    sublayers = [(block.attn_norm, lambda h: _self_attention(h, block.attn, ctx))]
    if memory is not None:
        sublayers.append(
            (block.cross_norm, lambda h: _cross_attention(h, memory, block.cross, s, memory_allowed))
        )
    sublayers.append((block.ffn_norm, lambda h: _ffn(h, block.ffn, s.activation, s.d_ff)))
    for norm_module, f in sublayers:
        x = x + f(norm(norm_module, x)) if s.norm.position == "pre" else norm(norm_module, x + f(x))
    return x


def _embed(
    ids: torch.Tensor, table: torch.nn.Embedding, positional: Any, spec: Any, pos: torch.Tensor
) -> Any:
    x = table.weight[ids] * (math.sqrt(spec.d_model) if spec.scale_embeddings else 1.0)
    if spec.positional.type == "sinusoidal":
        x = x + _sinusoidal(pos.double(), spec.d_model)
    elif spec.positional.type == "learned":
        x = x + positional.table.weight[pos]
    return x


def _final(x: torch.Tensor, module: torch.nn.Module, spec: Any) -> torch.Tensor:
    return _norm(x, module, spec.norm.type, spec.norm.eps) if spec.norm.final else x


def reference_decoder(model: DecoderLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    s = model.spec
    pos = _positions(mask)
    T = ids.shape[1]
    causal = torch.arange(T)[None, :] <= torch.arange(T)[:, None]  # (T, T): key <= query
    # Real queries read real keys up to their own; a padded one (whose output nobody reads) itself.
    allowed = ((causal[None] & mask.bool()[:, None, :]) | torch.eye(T, dtype=torch.bool))[
        :, None
    ]  # (B, 1, T, T)
    bias: Any = 0.0
    if s.positional.type == "relative":
        p = s.positional
        bias = _relative_bias(model.positional.bias.weight, pos, pos, False, p.num_buckets, p.max_distance)
    x = _embed(ids, model.embed, model.positional, s, pos)
    ctx = _Context(s, pos, allowed, bias)
    for block in model.blocks:
        x = _block(x, block, ctx)
    x = _final(x, model.final_norm, s) * (s.d_model**-0.5 if s.scale_output else 1.0)
    return _linear(x, model.lm_head)[..., : s.vocab_size]


DECODERS = [
    {"positional": "sinusoidal", "activation": "gelu"},
    {"positional": "learned", "norm": {"position": "post"}, "activation": "relu", "scale_embeddings": True},
    {"positional": "rope", "norm": {"type": "rmsnorm"}, "activation": "swiglu", "n_kv_heads": 2},
    {
        "positional": {"type": "rope", "layout": "halves", "theta": 500.0},
        "n_kv_heads": 1,
        "activation": "silu",
    },
    {"positional": "relative", "activation": "geglu_tanh", "head_dim": 6, "attention_scale": 1.0},
    {
        "positional": "none",
        "norm": {"type": "rmsnorm", "position": "post", "eps": 0.1},
        "activation": "gelu_tanh",
    },
    {"positional": "learned", "n_kv_heads": 2, "vocab_multiple_of": 16, "scale_output": True},
]


def _left_padded(lengths: tuple[int, ...], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width))
    mask = torch.stack([torch.arange(width) >= width - n for n in lengths]).long()
    return ids, mask


@pytest.mark.parametrize(
    "variant",
    DECODERS,
    ids=lambda v: str(v["positional"]) if isinstance(v["positional"], str) else "rope-halves",
)
def test_the_decoder_is_its_formula(variant: dict[str, Any]) -> None:
    model = _randomise(DecoderLM(tiny_model(d_model=24, n_heads=4, max_seq_len=12, **variant)))
    ids, mask = _left_padded((12, 7, 1), 50)
    real = mask.bool()
    with torch.no_grad():
        expected = reference_decoder(model, ids, mask)
        torch.testing.assert_close(model(ids, mask)[real], expected[real], atol=1e-5, rtol=1e-5)
        # Incremental decoding with a cache reads the same, one token at a time after a prompt of 5.
        cache = model.empty_cache(3)
        steps = [model(ids[:, :5], mask[:, :5], cache=cache)]
        steps += [model(ids[:, t : t + 1], mask[:, : t + 1], cache=cache) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, 1)[real], expected[real], atol=1e-5, rtol=1e-5)


def _stack(
    x: torch.Tensor, blocks: Any, ctx: _Context, memory: Any = None, memory_allowed: Any = None
) -> Any:
    for block in blocks:
        x = _block(x, block, ctx, memory, memory_allowed)
    return x


def _bias(positional: Any, spec: Any, qpos: torch.Tensor, kpos: torch.Tensor, bidirectional: bool) -> Any:
    if spec.positional.type != "relative":
        return 0.0
    p = spec.positional
    return _relative_bias(positional.bias.weight, qpos, kpos, bidirectional, p.num_buckets, p.max_distance)


def reference_seq2seq(
    model: Seq2Seq, src: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor, tgt_mask: torch.Tensor
) -> torch.Tensor:
    s = model.spec
    S, T = src.shape[1], tgt.shape[1]
    spos, tpos = _positions(src_mask), _positions(tgt_mask)
    real_keys = src_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    enc_allowed = real_keys | torch.eye(S, dtype=torch.bool)  # (B, 1, S, S)
    x = _embed(src, model.embed, model.encoder_positional, s, spos)
    enc = _Context(s, spos, enc_allowed, _bias(model.encoder_positional, s, spos, spos, True))
    memory = _final(_stack(x, model.encoder_blocks, enc), model.encoder_norm, s)
    causal = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    dec_allowed = ((causal[None] & tgt_mask.bool()[:, None, :]) | torch.eye(T, dtype=torch.bool))[:, None]
    y = _embed(tgt, model.target_embed, model.decoder_positional, s, tpos)
    dec = _Context(s, tpos, dec_allowed, _bias(model.decoder_positional, s, tpos, tpos, False))
    y = _stack(y, model.decoder_blocks, dec, memory, real_keys.expand(-1, -1, T, -1))
    y = _final(y, model.decoder_norm, s) * (s.d_model**-0.5 if s.scale_output else 1.0)
    return _linear(y, model.lm_head)


SEQ2SEQS = [
    {  # T5 v1.0: relative buckets, RMSNorm, no biases, d_kv of its own, unscaled scores, scaled output
        "positional": {"type": "relative", "num_buckets": 8, "max_distance": 10},
        "norm": {"type": "rmsnorm"},
        "activation": "relu",
        "bias": {"qkv": False, "attn_out": False, "ffn": False},
        "head_dim": 5,
        "attention_scale": 1.0,
        "scale_output": True,
    },
    {  # Vaswani et al.: sinusoidal, post-norm, scaled embeddings
        "positional": "sinusoidal",
        "norm": {"position": "post"},
        "scale_embeddings": True,
        "n_decoder_layers": 3,
    },
    {"positional": "rope", "n_kv_heads": 2, "share_embeddings": False, "tie_embeddings": False},
    {"positional": "learned", "activation": "geglu", "n_kv_heads": 1},
]


@pytest.mark.parametrize("variant", SEQ2SEQS, ids=["t5", "vaswani", "rope-gqa", "learned-mqa"])
def test_the_encoder_decoder_is_its_formula(variant: dict[str, Any]) -> None:
    base = {"family": "encoder_decoder", "vocab_size": 40, "d_model": 24, "n_layers": 2, "n_heads": 4}
    spec = Spec.model_validate(
        {"model": merge({**base, "max_seq_len": 12}, variant), "task": "seq2seq"}
    ).model
    model = _randomise(Seq2Seq(spec))
    src = torch.randint(0, 40, (3, 11))
    src_mask = torch.stack([torch.arange(11) < n for n in (11, 6, 2)]).long()  # right-padded sources
    tgt, tgt_mask = _left_padded((9, 4, 1), 40)
    real = tgt_mask.bool()
    with torch.no_grad():
        expected = reference_seq2seq(model, src, src_mask, tgt, tgt_mask)
        torch.testing.assert_close(
            model(src, src_mask, tgt, tgt_mask)[real], expected[real], atol=1e-5, rtol=1e-5
        )
        memory = model.project_memory(model.encode(src, src_mask))
        cache = model.empty_cache(3)
        steps = [model.decode(tgt[:, :3], memory, src_mask, tgt_mask[:, :3], cache)]
        steps += [
            model.decode(tgt[:, t : t + 1], memory, src_mask, tgt_mask[:, : t + 1], cache)
            for t in range(3, 9)
        ]
        torch.testing.assert_close(torch.cat(steps, 1)[real], expected[real], atol=1e-5, rtol=1e-5)


def reference_masked_lm(
    model: MaskedLM, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT: LN(token + position + segment), bidirectional blocks, the MLM head dense -> f -> norm
    -> vocabulary, NSP from tanh(dense([CLS]))."""
    s = model.spec
    pos = _positions(mask)
    x = _embed(ids, model.embed, model.positional, s, pos) + model.segment_embed.weight[types]
    if s.embedding_norm:
        x = _norm(x, model.embed_norm, s.norm.type, s.norm.eps)
    allowed = mask.bool()[:, None, None, :] | torch.eye(ids.shape[1], dtype=torch.bool)
    ctx = _Context(s, pos, allowed, _bias(model.positional, s, pos, pos, True))
    h = _final(_stack(x, model.blocks, ctx), model.final_norm, s)
    head = _norm(ACT[s.activation](_linear(h, model.mlm_dense)), model.mlm_norm, s.norm.type, s.norm.eps)
    assert model.nsp_head is not None and model.pooler is not None
    return _linear(head, model.lm_head), _linear(torch.tanh(_linear(h[:, 0], model.pooler)), model.nsp_head)


ENCODERS = [
    {"norm": {"position": "post"}, "embedding_norm": True, "positional": "learned"},
    {"positional": {"type": "relative", "num_buckets": 6, "max_distance": 7}, "norm": {"type": "rmsnorm"}},
    {"positional": "rope", "activation": "gelu_tanh", "n_kv_heads": 2},
    {"positional": "sinusoidal", "activation": "relu", "scale_embeddings": True},
]


@pytest.mark.parametrize("variant", ENCODERS, ids=["bert", "relative", "rope", "sinusoidal"])
def test_the_encoder_is_its_formula(variant: dict[str, Any]) -> None:
    base = {
        "family": "encoder",
        "vocab_size": 40,
        "d_model": 24,
        "n_layers": 2,
        "n_heads": 4,
        "max_seq_len": 12,
    }
    spec = Spec.model_validate({"model": merge(base, variant), "task": "masked_lm"}).model
    model = _randomise(MaskedLM(spec, next_sentence=True))
    ids = torch.randint(0, 40, (3, 12))
    mask = torch.stack([torch.arange(12) < n for n in (12, 5, 2)]).long()
    types = (torch.arange(12) >= 3).long().expand(3, -1)
    real = mask.bool()
    with torch.no_grad():
        logits, nsp = model(ids, mask, types)
        expected_logits, expected_nsp = reference_masked_lm(model, ids, mask, types)
    torch.testing.assert_close(logits[real], expected_logits[real], atol=1e-5, rtol=1e-5)
    assert nsp is not None
    torch.testing.assert_close(nsp, expected_nsp, atol=1e-5, rtol=1e-5)


def reference_vit(model: VisionTransformer, pixels: torch.Tensor) -> torch.Tensor:
    """Patches by the strided convolution, [CLS] in front, positions, blocks, the [CLS] state or
    the mean patch state, the head."""
    s = model.spec
    p = s.patch_size
    w = model.patch_embed.proj.weight.reshape(s.d_model, s.channels, p, p)
    x = F.conv2d(pixels, w, model.patch_embed.proj.bias, stride=p).flatten(2).transpose(1, 2)  # (B, N, d)
    if s.pooling == "cls":
        assert model.cls_token is not None
        x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), 1)
    if s.positional.type == "learned":
        x = x + model.positional.table.weight
    elif s.positional.type == "sinusoidal":  # rows in the first half, columns in the second
        n = torch.arange(s.grid**2)
        d = s.d_model // 2
        grid = torch.cat((_sinusoidal((n // s.grid).double(), d), _sinusoidal((n % s.grid).double(), d)), -1)
        x = x + torch.cat((torch.zeros(s.prefix_tokens, s.d_model, dtype=torch.float64), grid))
    T = x.shape[1]
    ctx = _Context(s, torch.arange(T)[None], torch.ones(1, 1, T, T, dtype=torch.bool), 0.0)
    h = _final(_stack(x, model.blocks, ctx), model.final_norm, s)
    return _linear(h[:, 0] if s.pooling == "cls" else h.mean(1), model.head)


@pytest.mark.parametrize(
    "variant",
    [
        {"positional": "learned"},
        {"positional": "sinusoidal", "pooling": "mean"},
        {"positional": "sinusoidal"},
    ],
    ids=["learned-cls", "sinusoidal-mean", "sinusoidal-cls"],
)
def test_the_vision_transformer_is_its_formula(variant: dict[str, Any]) -> None:
    base = {"family": "vit", "image_size": 12, "channels": 3, "patch_size": 4, "d_model": 24}
    spec = Spec.model_validate(
        {
            "model": merge({**base, "n_layers": 2, "n_heads": 4, "activation": "gelu"}, variant),
            "data": {"builtin": "digits"},
            "task": {"type": "image_classification", "labels": ["a", "b", "c"]},
        }
    ).model
    model = _randomise(VisionTransformer(spec, 3))
    pixels = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(pixels), reference_vit(model, pixels), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_relative_buckets_are_t5s_over_every_offset(bidirectional: bool) -> None:
    offsets = torch.arange(-300, 301)
    for num_buckets, max_distance in [(32, 128), (4, 3), (7, 5), (33, 40), (64, 1000)]:
        got = relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
        expected = [_t5_bucket(int(r), bidirectional, num_buckets, max_distance) for r in offsets]
        assert got.tolist() == expected, (num_buckets, max_distance)


SCALINGS = [
    {"type": "linear", "factor": 4.0},
    {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
        "truncate": False,
        "beta_fast": 16.0,
    },
    {
        "type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 512,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
    {  # 16 pairs of the test's heads of 32
        "type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
        "short_factor": [1.0 + i / 10 for i in range(16)],
        "long_factor": [2.0 + i for i in range(16)],
    },
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["type"])
def test_rope_scalings_are_the_frequencies_transformers_computes(scaling: dict[str, Any]) -> None:
    """Within the model's context (dynamic: the original length): the same angle per pair and the
    same factor on cos and sin as transformers' rope_init functions, for two thetas."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim = 32
    for theta in (10000.0, 500000.0):
        rope = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": scaling["type"]}
        config = LlamaConfig(
            hidden_size=4 * head_dim,
            num_attention_heads=4,
            max_position_embeddings=4 * 512,
            rope_parameters={**rope, "rope_theta": theta},
        )
        # LongRoPE's long factors: those of a sequence past the original length
        lengths = (None, 513) if scaling["type"] == "longrope" else (None,)
        for length, long in zip(lengths, (False, True), strict=False):
            inv_freq, factor = ROPE_INIT_FUNCTIONS[scaling["type"]](config, "cpu", seq_len=length)
            spec = RopePositional(theta=theta, scaling=scaling)
            ours, our_factor = rope_frequencies(spec, head_dim, long)
            torch.testing.assert_close(ours.float(), inv_freq.float(), rtol=1e-6, atol=0)
            assert our_factor == pytest.approx(factor, rel=1e-12)
