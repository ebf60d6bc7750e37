"""``positional: alibi`` (Press et al. 2021; BLOOM, MPT): each head's scores get -m_h times the
query-to-key distance (its absolute value in encoders), nothing added to the tokens; and a
decoder's ``embedding_norm`` (BLOOM's word_embeddings_layernorm). Held to their formulas (the
slopes to BLOOM's for head counts that are and are not powers of two), counted by the spec,
exported with parity (step graphs too), generated with the KV cache in onnxruntime as PyTorch does,
left-padded rows as they would be alone, and refused by field by export-hf."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_exports_with_parity, random_run, tiny_model, trained_decoder_generates_as_pytorch

from tfcompile.models import DecoderLM
from tfcompile.nn.attention import may_attend
from tfcompile.nn.positional import alibi_slopes
from tfcompile.spec import Spec
from tfcompile.tasks import build_model


def test_the_slopes_are_the_papers_and_blooms() -> None:
    """2^(-8h/n) for n a power of two; else the power of two below's, then every other slope of
    the one above (6 heads: four of 4, then the 1st and 3rd of 8)."""
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** (-torch.arange(1, 9, dtype=torch.float64)))
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected, dtype=torch.float64))
    assert alibi_slopes(1).tolist() == [2**-8]


def test_blooms_bias_differs_from_ours_by_a_constant_per_query() -> None:
    """BLOOM adds m_h * (key position) to every score of a row, tfcompile -m_h * (query - key):
    the same softmax. Checked against transformers' build_alibi_tensor where it is installed."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for heads in (3, 8, 12):
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        theirs = bloom.build_alibi_tensor(mask, heads, torch.float64).view(2, heads, 1, 5)
        expected = alibi_slopes(heads)[:, None, None] * torch.arange(3)  # (H, 1, 3)
        torch.testing.assert_close(theirs[..., 2:] - theirs[..., 2:3], expected.expand(2, -1, -1, -1))


@pytest.mark.parametrize("padded", [False, True])
def test_decoder_attention_subtracts_each_heads_slope_times_the_distance(padded: bool) -> None:
    """A decoder layer's attention against softmax(q.k / sqrt(hd) - m_h (i - j) + mask) v with
    positions counted over real tokens; with the KV cache, the same one token at a time."""
    spec = tiny_model(positional="alibi", n_heads=4, n_kv_heads=2)
    model = DecoderLM(spec).double().eval()
    attn, hd = model.blocks[0].attn, spec.head_dim
    assert hd is not None
    x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
    padding = torch.ones(2, 6, dtype=torch.bool)
    if padded:
        padding[1, :2] = False  # left padding: row 1's real tokens are at positions 0..3
    positions = (padding.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([4 * hd, 2 * hd, 2 * hd], -1)
    q, k, v = (t.reshape(2, 6, -1, hd).transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    distance = (positions[:, :, None] - positions[:, None, :]).double()  # (B, T, T)
    scores = q @ k.transpose(-1, -2) / hd**0.5 - alibi_slopes(4)[:, None, None] * distance[:, None]
    allowed = may_attend(torch.arange(6), torch.arange(6), True, padding if padded else None)
    assert allowed is not None
    y = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(2, 6, -1)
    expected = F.linear(y, attn.out.weight, attn.out.bias)
    bias = model.positional.attention_bias(positions, positions)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, allowed, bias=bias), expected)
        if not padded:
            cache = model.empty_cache(2)[0]
            steps = []
            for t in range(6):
                step_bias = model.positional.attention_bias(torch.tensor([t]), torch.arange(t + 1))
                mask = may_attend(torch.tensor([t]), torch.arange(t + 1), True, None)
                steps.append(attn(x[:, t : t + 1], mask, bias=step_bias, cache=cache))
            torch.testing.assert_close(torch.cat(steps, 1), expected)


def _spec(family: str, **fields: object) -> Spec:
    task = {"decoder": "causal_lm", "encoder": "masked_lm"}[family]
    model = {
        "family": family,
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "max_seq_len": 16,
    }
    return Spec.model_validate({"model": model | fields, "task": {"type": task}})


def test_an_encoder_looks_both_ways_at_the_absolute_distance() -> None:
    encoder = build_model(_spec("encoder", positional="alibi"))
    bias = encoder.positional.attention_bias(torch.arange(5), torch.arange(5))  # (1, H, T, T)
    distance = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs().float()
    torch.testing.assert_close(bias, -alibi_slopes(4).float()[None, :, None, None] * distance)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_alibi_adds_no_parameters_and_an_embedding_norm_one_norm(family: str) -> None:
    for fields, added in (
        ({"positional": "alibi"}, 0),
        ({"positional": "alibi", "embedding_norm": True}, 64),
    ):
        spec = _spec(family, **fields)
        with torch.device("meta"):
            model = build_model(spec)
        assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
        plain = _spec(family, positional="none")
        assert spec.parameter_count() - plain.parameter_count() == added, fields


def test_a_decoders_embedding_norm_normalises_the_embeddings_before_the_blocks() -> None:
    model = DecoderLM(tiny_model(positional="alibi", embedding_norm=True, n_layers=1)).double().eval()
    with torch.no_grad():
        model.embed_norm.weight.normal_()
        ids = torch.randint(0, 50, (2, 5))
        h = model.embed_norm(model.embed(ids))
        expected = model.final_norm(
            model.blocks[0](
                h,
                is_causal=False,
                mask=torch.ones(5, 5).tril().bool()[None, None],
                bias=model.positional.attention_bias(torch.arange(5), torch.arange(5)),
            )
        )
        torch.testing.assert_close(model.hidden(ids), expected)


TINY_MODEL = "vocab_size: 20, n_layers: 2, max_seq_len: 8, positional: alibi"
BUNDLES = {
    "decoder, embedding norm, opset 17": f"model: {{{TINY_MODEL}, d_model: 16, n_heads: 4, n_kv_heads: 2, "
    "embedding_norm: true}\nexport: {opset: 17}\n",
    "decoder, 3 heads, opset 23, fp16": f"model: {{{TINY_MODEL}, d_model: 24, n_heads: 3, "
    "norm: {type: rmsnorm}}\nexport: {opset: 23, precision: fp16}\n",
    "encoder classifier": f"model: {{family: encoder, {TINY_MODEL}, d_model: 16, n_heads: 2}}\n"
    "task: {type: classification, labels: [a, b]}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_alibi_decoder_fuses_with_parity_and_generates_as_pytorch(tmp_path: Path) -> None:
    """Trained, exported, fused with parity; the bundles generate PyTorch's greedy tokens with the
    KV cache, and a left-padded row generates what it would alone."""
    trained_decoder_generates_as_pytorch(tmp_path, ["model.positional=alibi", "model.embedding_norm=true"])


def test_export_hf_refuses_a_decoders_embedding_norm_by_field(tmp_path: Path) -> None:
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    model = "vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16"
    run = random_run(tmp_path / "gpt2", f"model: {{{model}, embedding_norm: true}}\n")
    with pytest.raises(HFError, match=r"model\.embedding_norm: True has no GPT-2 equivalent"):
        export_hf(run, tmp_path / "out")
    # an ALiBi decoder is BLOOM's to write, which normalises its embeddings
    alibi = random_run(tmp_path / "alibi", f"model: {{{model}, positional: alibi, activation: gelu_tanh}}\n")
    with pytest.raises(HFError, match=r"1 problem:\n  model\.embedding_norm: False has no BLOOM equivalent"):
        export_hf(alibi, tmp_path / "out")
    assert not (tmp_path / "out").exists()
