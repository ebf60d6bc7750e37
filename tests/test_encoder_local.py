"""An encoder's local attention (``model.window``: a query attends to the (size - 1) / 2 positions
on either side of it), the first layer's attention without its norm (``norm.first_attention:
false``), mean pooling (``pooling: mean``) and the pooler's norm (``pooler_norm``): ModernBERT's
choices. Each held to its formula, to padding, to the parameter count, refused where it has no
meaning, and exported with parity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_exports_with_parity, randomised
from test_encoder import tiny_encoder

from tfcompile.models import Classifier, Encoder
from tfcompile.nn.norms import LayerNorm
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model

ROPE = {"type": "rope", "layout": "halves"}


def _classifier(**overrides: Any) -> tuple[Spec, Classifier]:
    """A three-label classifier of the tiny encoder with ``overrides``, its weights random."""
    model = tiny_encoder(**overrides).model_dump()
    spec = Spec.model_validate(
        {"model": model, "task": {"type": "classification", "labels": ["a", "b", "c"]}}
    )
    model = build_model(spec)
    assert isinstance(model, Classifier)
    return spec, randomised(model)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", [1, 3, 5])
def test_a_local_layer_reads_the_positions_within_its_window_on_either_side(size: int) -> None:
    """One RoPE layer (scores depend on relative positions only): each position's state is the
    windowless encoder's at that position of the tokens i - h .. i + h run alone (h = (size - 1) / 2)."""
    local = randomised(Encoder(tiny_encoder(n_layers=1, positional=ROPE, window={"size": size})))
    plain = Encoder(tiny_encoder(n_layers=1, positional=ROPE)).double().eval()
    plain.load_state_dict(local.state_dict())
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    h = size // 2
    with torch.no_grad():
        states = local.encode(ids)
        for i in range(16):
            start = max(0, i - h)
            alone = plain.encode(ids[:, start : i + h + 1])[:, i - start]
            torch.testing.assert_close(states[:, i], alone, atol=1e-6, rtol=1e-6)
        assert not torch.allclose(states[:, 8], plain.encode(ids)[:, 8], atol=1e-3)  # the window mattered


def test_the_listed_layers_attend_locally_and_the_others_over_every_position() -> None:
    """The whole encoder against its blocks run by hand with masks built from their definitions."""
    spec = tiny_encoder(n_layers=3, positional=ROPE, type_vocab_size=0, window={"size": 3, "layers": [0, 2]})
    assert spec.sliding_layers == {0, 2}
    model = randomised(Encoder(spec))
    ids = torch.randint(0, 50, (2, 11))
    band = torch.ones(11, 11, dtype=torch.bool).triu(-1).tril(1)[None, None]  # |i - j| <= 1
    with torch.no_grad():
        rotary = model.positional.rotary(torch.arange(11))
        rotary = rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double())
        x = model.embed(ids)
        for block, mask in zip(model.blocks, (band, None, band), strict=True):
            x = block(x, mask, False, rotary)
        torch.testing.assert_close(model.encode(ids), model.final_norm(x))


def test_the_first_layers_attention_reads_the_embeddings_without_a_norm() -> None:
    spec = tiny_encoder(embedding_norm=True, norm={"bias": False, "first_attention": False})
    model = randomised(Encoder(spec))
    first, second = model.blocks
    assert isinstance(first.attn_norm, torch.nn.Identity) and not isinstance(
        second.attn_norm, torch.nn.Identity
    )
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        h = x + first.attn(x, None, False)  # x + attn(x), then x + ffn(norm(x))
        torch.testing.assert_close(first(x), h + first.ffn(first.ffn_norm(h)))
    assert _count(model) == spec.body_parameters()
    with_norm = tiny_encoder(embedding_norm=True, norm={"bias": False})
    assert spec.body_parameters() == with_norm.body_parameters() - 32  # one norm's scale fewer


def test_mean_pooling_reads_the_mean_of_the_real_tokens_and_the_pooler_norm_follows_the_activation() -> None:
    spec, model = _classifier(
        pooling="mean", pooler_norm=True, pooler_activation="gelu", norm={"bias": False}
    )
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        hidden = model.encode(ids, mask)
        means = torch.stack([hidden[0].mean(0), hidden[1, :6].mean(0)])
        pooled = model.pooler_norm(F.gelu(model.pooler(means)))
        torch.testing.assert_close(model(ids, mask), model.classifier(pooled))
        torch.testing.assert_close(model(ids[1:, :6]), model(ids[1:], mask[1:]))  # padding never counts
        torch.testing.assert_close(model(ids[:1]), model(ids[:1], mask[:1]))  # no mask: every token
    assert isinstance(model.pooler_norm, LayerNorm) and model.pooler_norm.bias is None
    assert _count(model) == spec.parameter_count()


MODERNBERT = {
    "positional": ROPE | {"theta": 160000.0, "local": {"theta": 10000.0, "layers": [1, 2]}},
    "window": {"size": 5, "layers": [1, 2]},
    "n_layers": 3,
    "norm": {"bias": False, "first_attention": False},
    "embedding_norm": True,
    "activation": "geglu",
    "bias": {"qkv": False, "attn_out": False, "ffn": False},
    "type_vocab_size": 0,
}


def test_a_modernbert_shaped_classifier_is_padding_invariant_and_counts_its_parameters() -> None:
    spec, model = _classifier(**MODERNBERT, pooling="mean", pooler_norm=True, pooler_activation="gelu")
    ids = torch.randint(5, 50, (1, 10))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 10 + [0] * 6])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, mask), model(ids))
    assert _count(model) == spec.parameter_count()


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ("window: {size: 4}", "model.window.size", "an odd count"),
        ("window: {size: 3, layers: [2]}", "model.window.layers", ""),
        ("norm: {position: post, first_attention: false}", "model.norm.first_attention", "post-norm"),
        ("share_layers: true, norm: {first_attention: false}", "model.norm.first_attention", "shared layers"),
        (
            "block: {type: parallel, shared_norm: true}, norm: {first_attention: false}",
            "model.norm.first_attention",
            "shared norm",
        ),
        ("pooler: false, pooling: mean", "model.pooling", "has none"),
        ("pooler: false, pooler_norm: true", "model.pooler_norm", "has none"),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str, message: str) -> None:
    text = (
        "model: {family: encoder, vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 12, "
        f"{fields}}}\ntask: masked_lm\n"
    )
    with pytest.raises(SpecError) as error:
        parse_spec(text)
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


ENCODER = "family: encoder, vocab_size: 40, d_model: 32, n_heads: 4, max_seq_len: 16"


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, extra",
    [
        (
            "task: {type: classification, labels: [a, b]}",
            "pooling: mean, pooler_norm: true, pooler_activation: gelu",
        ),
        ("task: {type: classification, labels: [a, b, c]}", "pooler_norm: true"),
    ],
    ids=["mean", "cls"],
)
def test_a_modernbert_shaped_encoder_exports_with_parity(task: str, extra: str, tmp_path: Path) -> None:
    text = (
        f"model: {{{ENCODER}, n_layers: 3, positional: {{type: rope, layout: halves, theta: 160000, "
        "local: {theta: 10000, layers: [1, 2]}}, window: {size: 5, layers: [1, 2]}, "
        "norm: {bias: false, first_attention: false}, embedding_norm: true, activation: geglu, "
        f"type_vocab_size: 0, {extra}}}\n{task}\n"
    )
    assert_exports_with_parity(text, tmp_path / "bundle")
