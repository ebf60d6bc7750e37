"""The encoder: bidirectional attention, segments, padding that never reaches real tokens, BERT sizes."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from helpers import ROOT

from tfcompile.models import Classifier, Encoder, MaskedLM
from tfcompile.models.common import init_weights
from tfcompile.spec import EncoderSpec, Spec, load_spec
from tfcompile.spec.presets import PRESETS, merge
from tfcompile.summary import summarize
from tfcompile.tasks import build_model


def tiny_encoder(**overrides: Any) -> EncoderSpec:
    base = {
        "family": "encoder",
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "max_seq_len": 16,
    }
    spec = Spec.model_validate({"model": merge(base, overrides), "task": "masked_lm"}).model
    assert isinstance(spec, EncoderSpec)
    return spec


VARIANTS = [
    {},
    {"norm": {"position": "post"}, "embedding_norm": True, "activation": "relu"},
    {"positional": "rope", "norm": {"type": "rmsnorm"}, "activation": "swiglu", "n_kv_heads": 2},
    {"positional": "relative", "type_vocab_size": 0},
    {"positional": "sinusoidal", "activation": "geglu"},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())) or "default")
def test_padding_never_changes_the_cls_output_of_a_sequence(variant: dict) -> None:
    torch.manual_seed(0)
    model = Classifier(tiny_encoder(**variant), num_labels=3).eval()
    ids = torch.randint(5, 50, (1, 9))
    types = torch.tensor([[0] * 5 + [1] * 4])
    alone = model(ids, torch.ones_like(ids), types)
    padded_ids = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 7)], dim=1).long()
    padded_types = torch.cat([types, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    batch_ids = torch.cat([padded_ids, torch.randint(5, 50, (1, 16))])
    batch = model(batch_ids, torch.cat([mask, torch.ones(1, 16).long()]), torch.cat([padded_types] * 2))
    torch.testing.assert_close(batch[:1], alone, atol=1e-5, rtol=1e-5)
    hidden_alone = model.encode(ids, None, types)[:, 0]
    hidden_padded = model.encode(padded_ids, mask, padded_types)[:, 0]
    torch.testing.assert_close(hidden_padded, hidden_alone, atol=1e-5, rtol=1e-5)


def test_attention_is_bidirectional() -> None:
    model = Encoder(tiny_encoder()).eval()
    model.apply(partial(init_weights, std=0.02))
    ids = torch.randint(5, 50, (1, 8))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 50
    # The last token reaches the first position: no causal mask.
    assert not torch.allclose(model.encode(ids)[:, 0], model.encode(changed)[:, 0])


def test_segment_embeddings_mark_the_second_sentence() -> None:
    model = Encoder(tiny_encoder()).eval()
    model.apply(partial(init_weights, std=0.02))
    ids = torch.randint(5, 50, (1, 6))
    second = torch.tensor([[0, 0, 0, 1, 1, 1]])
    assert not torch.allclose(model.encode(ids), model.encode(ids, token_type_ids=second))
    assert Encoder(tiny_encoder(type_vocab_size=0)).segment_embed is None


def test_masked_lm_heads_and_tied_embeddings() -> None:
    model = MaskedLM(tiny_encoder(), next_sentence=True).eval()
    logits, nsp = model(torch.randint(0, 50, (3, 7)))
    assert logits.shape == (3, 7, 50) and nsp is not None and nsp.shape == (3, 2)
    assert model.lm_head.weight is model.embed.weight
    _, no_nsp = MaskedLM(tiny_encoder(), next_sentence=False)(torch.randint(0, 50, (1, 4)))
    assert no_nsp is None


def test_bert_base_has_bert_base_parameter_count() -> None:
    # Devlin et al. 2019's BERT-base with its pretraining heads (MLM tied to the embeddings, NSP):
    # 110,106,428 parameters, as Hugging Face's BertForPreTraining counts them.
    spec = Spec.model_validate(PRESETS["bert"])
    assert summarize(spec).total_params == 110_106_428


def test_inputs_of_the_wrong_shape_are_refused() -> None:
    model = Encoder(tiny_encoder())
    with pytest.raises(ValueError, match="token_type_ids shape"):
        model.encode(torch.zeros(2, 5, dtype=torch.long), token_type_ids=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len 16"):
        model.encode(torch.zeros(1, 17, dtype=torch.long))


def test_classification_needs_labels_and_the_example_specs_build() -> None:
    spec = load_spec(ROOT / "specs" / "sst2-finetune.yaml", ["model.vocab_size=100", "task.labels=null"])
    with pytest.raises(ValueError, match=r"task\.labels is not set"):
        build_model(spec)
    spec = load_spec(ROOT / "specs" / "sst2-finetune.yaml", ["model.vocab_size=100", "task.labels=[a, b]"])
    assert isinstance(build_model(spec), Classifier)
    spec = load_spec(ROOT / "specs" / "bert-mini-shakespeare.yaml", ["model.vocab_size=100"])
    assert isinstance(build_model(spec), MaskedLM)


def _bert_spec(**model: Any) -> Spec:
    base = {
        "family": "encoder",
        "vocab_size": 40,
        "d_model": 16,
        "n_layers": 1,
        "n_heads": 2,
        "max_seq_len": 12,
    }
    return Spec.model_validate({"model": base | model, "task": {"type": "masked_lm"}})


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_the_masked_lm_head_applies_the_specs_activation(activation: str) -> None:
    """transformers' BertPredictionHeadTransform applies hidden_act, as the blocks do."""
    spec = _bert_spec(activation=activation, norm={"position": "post", "eps": 1e-3}, bias={"lm_head": True})
    model = build_model(spec).eval()
    assert isinstance(model, MaskedLM)
    f = {
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": partial(torch.nn.functional.gelu, approximate="tanh"),
        "relu": torch.relu,
        "silu": torch.nn.functional.silu,
    }[activation]
    ids = torch.randint(0, 40, (2, 7))
    hidden = model.encode(ids)
    transformed = f(hidden @ model.mlm_dense.weight.T + model.mlm_dense.bias)
    normed = torch.nn.functional.layer_norm(
        transformed, (16,), model.mlm_norm.weight, model.mlm_norm.bias, 1e-3
    )
    expected = normed @ model.lm_head.weight.T + model.lm_head.bias
    torch.testing.assert_close(model(ids)[0], expected, atol=1e-5, rtol=1e-4)


def test_an_encoder_without_pooler_has_none_and_counts_none() -> None:
    spec = _bert_spec(pooler=False)
    model = build_model(spec)
    assert model.pooler is None and spec.parameter_count() == sum(p.numel() for p in model.parameters())


def test_sentence_heads_need_the_pooler() -> None:
    from tfcompile.spec import SpecError, parse_spec

    text = (
        "model: {family: encoder, vocab_size: 40, d_model: 16, n_layers: 1, n_heads: 2, pooler: false}\n"
        "task: {type: classification, labels: [a, b]}\n"
    )
    with pytest.raises(SpecError, match="pooler"):
        parse_spec(text)


def test_factorized_embeddings_are_projected_to_d_model_and_the_head_projects_back() -> None:
    """embedding_size (ALBERT, ELECTRA): tables, positions and their norm that wide, a projection to
    d_model after them, a masked-LM head back to that width; as wide as d_model, no projection."""
    model = MaskedLM(tiny_encoder(embedding_size=8, embedding_norm=True), next_sentence=False).eval()
    widths = {
        name: tuple(t.shape)
        for name, t in model.state_dict().items()
        if name.startswith(("embed", "segment", "positional", "mlm", "lm_head"))
    }
    assert widths == {
        "embed.weight": (50, 8),
        "segment_embed.weight": (2, 8),
        "positional.table.weight": (16, 8),
        "embed_norm.weight": (8,),
        "embed_norm.bias": (8,),
        "embed_project.weight": (32, 8),
        "embed_project.bias": (32,),
        "mlm_dense.weight": (8, 32),
        "mlm_dense.bias": (8,),
        "mlm_norm.weight": (8,),
        "mlm_norm.bias": (8,),
        "lm_head.weight": (50, 8),
    }
    ids = torch.randint(0, 50, (2, 7))
    changed = MaskedLM(tiny_encoder(embedding_size=8, embedding_norm=True), next_sentence=False).eval()
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        changed.embed_project.weight.mul_(2)  # the projection is on the path
        assert not torch.allclose(changed(ids)[0], model(ids)[0])
    same = MaskedLM(tiny_encoder(embedding_size=32), next_sentence=False)
    assert isinstance(same.embed_project, torch.nn.Identity)
    assert set(same.state_dict()) == set(MaskedLM(tiny_encoder(), next_sentence=False).state_dict())


def test_the_gelu_pooler_is_electras_classifier_head() -> None:
    spec = tiny_encoder(pooler_activation="gelu")
    model = Classifier(spec, num_labels=3).eval()
    hidden = torch.randn(2, 5, 32)
    dense = model.pooler
    assert dense is not None
    torch.testing.assert_close(model.pool(hidden), torch.nn.functional.gelu(dense(hidden[:, 0])))


def test_shared_layers_apply_one_blocks_weights_in_every_layer() -> None:
    """ALBERT's sharing: n_layers applications of one block, counted once; its FLOPs are those of
    every application, as unshared layers'; stochastic depth, a rate per layer, is refused."""
    from tfcompile.spec import SpecError, parse_spec
    from tfcompile.summary import forward_flops_per_token

    spec, plain = tiny_encoder(share_layers=True, n_layers=3), tiny_encoder(n_layers=3)
    model, unshared = MaskedLM(spec, next_sentence=False).eval(), MaskedLM(plain, next_sentence=False).eval()
    assert model.blocks[0] is model.blocks[2] and len(model.blocks) == 3
    assert spec.body_parameters() == plain.body_parameters() - 2 * plain.block_parameters()
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in unshared.parameters()) - (
        2 * plain.block_parameters()
    )
    assert forward_flops_per_token(model, spec) == forward_flops_per_token(unshared, plain)
    state = {k: v for k, v in model.state_dict().items()}
    for i in (1, 2):  # the unshared model with every block a copy of the first computes the same
        state |= {
            k.replace("blocks.0.", f"blocks.{i}."): v for k, v in state.items() if k.startswith("blocks.0.")
        }
    unshared.load_state_dict(state)
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids)[0], unshared(ids)[0])
    with pytest.raises(SpecError, match=r"dropout\.path"):
        parse_spec(
            "model: {family: encoder, vocab_size: 50, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 16, "
            "share_layers: true, dropout: {path: 0.1}}\ntask: masked_lm\n"
        )
