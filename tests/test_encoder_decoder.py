"""The encoder-decoder: the decoder never sees future targets, cross-attention never sees padded
source tokens, cached decoding equals the full pass, and the presets' sizes match the papers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tfcompile.models import Seq2Seq
from tfcompile.spec import Spec
from tfcompile.spec.presets import PRESETS, merge
from tfcompile.spec.schema import EncoderDecoderSpec
from tfcompile.summary import summarize


def tiny_seq2seq(**overrides: Any) -> EncoderDecoderSpec:
    base = {"family": "encoder_decoder", "vocab_size": 40, "d_model": 32, "n_heads": 4, "max_seq_len": 16}
    spec = Spec.model_validate({"model": merge({**base, "n_layers": 2}, overrides), "task": "seq2seq"}).model
    assert isinstance(spec, EncoderDecoderSpec)
    return spec


VARIANTS = [
    {},
    {
        "norm": {"position": "post"},
        "positional": "sinusoidal",
        "scale_embeddings": True,
        "n_decoder_layers": 3,
    },
    {"norm": {"type": "rmsnorm", "bias": False}, "positional": "relative", "activation": "geglu"},
    {"positional": "rope", "n_kv_heads": 2, "share_embeddings": False, "tie_embeddings": False},
]


def _ids(*shape: int) -> torch.Tensor:
    return torch.randint(0, 40, shape)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())) or "default")
def test_decoder_never_sees_future_targets(variant: dict) -> None:
    model = Seq2Seq(tiny_seq2seq(**variant)).eval()
    source, target = _ids(2, 9), _ids(2, 8)
    changed = target.clone()
    changed[:, 5:] = _ids(2, 3)
    with torch.no_grad():
        a, b = model(source, None, target), model(source, None, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())) or "default")
def test_cross_attention_sees_only_real_source_tokens(variant: dict) -> None:
    model = Seq2Seq(tiny_seq2seq(**variant)).eval()
    source, target = _ids(1, 6), _ids(1, 5)
    padded = torch.cat([source, _ids(1, 4)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 4])
    with torch.no_grad():
        alone = model(source, None, target)
        torch.testing.assert_close(model(padded, mask, target), alone, atol=1e-5, rtol=1e-5)
        other = model(torch.cat([source, _ids(1, 4)], dim=1), mask, target)
    torch.testing.assert_close(other, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())) or "default")
def test_cached_decoding_equals_the_full_pass(variant: dict) -> None:
    model = Seq2Seq(tiny_seq2seq(**variant)).eval()
    source, target = _ids(3, 7), _ids(3, 9)
    source_mask = torch.ones(3, 7, dtype=torch.long)
    source_mask[2, 4:] = 0
    with torch.no_grad():
        full = model(source, source_mask, target)
        memory = model.project_memory(model.encode(source, source_mask))
        cache = model.empty_cache(3)
        steps = [model.decode(target[:, :4], memory, source_mask, cache=cache)]
        steps += [model.decode(target[:, t : t + 1], memory, source_mask, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_presets_have_the_papers_sizes() -> None:
    # T5-small as released (Raffel et al. 2020; Hugging Face's t5-small): 60,506,624 parameters.
    assert summarize(Spec.model_validate(PRESETS["t5-small"])).total_params == 60_506_624
    # Vaswani et al. 2017's base model with one 37,000-token table shared three ways: 63.1 M (the
    # paper rounds its count to 65 M).
    assert summarize(Spec.model_validate(PRESETS["vaswani-base"])).total_params == 63_082_496


def test_embeddings_are_shared_and_tied_as_the_spec_says() -> None:
    shared = Seq2Seq(tiny_seq2seq())
    assert shared.target_embed is shared.embed and shared.lm_head.weight is shared.embed.weight
    separate = Seq2Seq(tiny_seq2seq(share_embeddings=False, tie_embeddings=False))
    assert (
        separate.target_embed is not separate.embed and separate.lm_head.weight is not separate.embed.weight
    )
    assert len(Seq2Seq(tiny_seq2seq(n_decoder_layers=3)).decoder_blocks) == 3


def test_inputs_that_do_not_fit_are_refused_by_name() -> None:
    model = Seq2Seq(tiny_seq2seq())
    with pytest.raises(ValueError, match="source_ids must be an integer tensor"):
        model.encode(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="source length 17 exceeds the model's max_seq_len 16"):
        model.encode(_ids(1, 17))
    memory = model.project_memory(model.encode(_ids(1, 4)))
    cache = model.empty_cache(1)
    model.decode(_ids(1, 10), memory, None, cache=cache)
    with pytest.raises(ValueError, match="target length 17 exceeds"):
        model.decode(_ids(1, 7), memory, None, cache=cache)
