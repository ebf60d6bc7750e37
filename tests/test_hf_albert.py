"""ALBERT (tfcompile/hf/albert.py): ``AlbertForMaskedLM`` and ``AlbertForSequenceClassification``
with one block's weights in every layer (the spec's ``share_layers``) or a group per layer (BERT's
unshared stack), factorized embeddings (``embedding_size``). Tiny random transformers models saved
with save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right
and not, two segments) and parameter counts; written back by export-hf as ALBERT (a stack of a
group per layer as ELECTRA, which computes it exactly where its head's GELU is the model's), and
tfcompile's own encoders of shared layers too, or refused by field; a row for every field of
AlbertConfig."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import random_run
from hf_models import BERT, Imported, edited, imported_variants
from test_hf_export import _loads_alike
from test_hf_fields import FAMILIES, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

LABELS = dict(id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
# albert-base's shape, tiny: embeddings of 8 under blocks of 16, the other fields AlbertConfig's
TINY = BERT | {"embedding_size": 8, "hidden_act": "gelu_new"}
FAMILIES["albert"] = Family(T.AlbertConfig, T.AlbertForMaskedLM, "bert", TINY)
FAMILIES["albert_cls"] = Family(T.AlbertConfig, T.AlbertForSequenceClassification, "bert", TINY | LABELS)


def albert(head: Any, **fields: Any) -> Any:
    return head(T.AlbertConfig(**TINY | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    "albert": lambda: albert(T.AlbertForMaskedLM, num_hidden_layers=3),
    "albert_cls": lambda: albert(T.AlbertForSequenceClassification, **LABELS),
    "albert_untied_wide": lambda: albert(T.AlbertForMaskedLM, tie_word_embeddings=False, embedding_size=24),
    # a group per layer: unshared, as BERT's, with the erf GELU ELECTRA's writer takes
    "albert_groups": lambda: albert(T.AlbertForMaskedLM, num_hidden_groups=2, hidden_act="gelu"),
}
WRITTEN_AS = {
    "albert": "AlbertForMaskedLM",
    "albert_cls": "AlbertForSequenceClassification",
    "albert_untied_wide": "AlbertForMaskedLM",
    "albert_groups": "ElectraForMaskedLM",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS, tokenizer="bert")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    """Untied, transformers keeps the head's bias twice (predictions.bias beside the decoder's own,
    which it applies); tfcompile once."""
    hf = imported[name].hf
    imported[name].assert_counts_match(0 if hf.config.tie_word_embeddings else hf.config.vocab_size)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def said(name: str) -> tuple[Any, ...]:
        model = imported[name].spec.model
        return model.embedding_size, model.share_layers, model.n_layers, model.activation, model.pooler

    assert said("albert") == (8, True, 3, "gelu_tanh", False)
    assert said("albert_cls") == (8, True, 2, "gelu_tanh", True)
    assert said("albert_untied_wide") == (24, True, 2, "gelu_tanh", False)
    assert said("albert_groups") == (8, False, 2, "gelu", False)
    model = imported["albert"].model
    assert model.blocks[0] is model.blocks[2]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == WRITTEN_AS[name]
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


ENCODER = (
    "model: {family: encoder, vocab_size: 64, d_model: 16, n_layers: 3, n_heads: 4, max_seq_len: 16, "
    "norm: {position: post, eps: 1.0e-12}, embedding_norm: true, share_layers: true"
)
CLASSIFIER = "\ntask: {type: classification, labels: [a, b]}\n"
NATIVE = {
    "classifier": f"{ENCODER}, embedding_size: 6}}{CLASSIFIER}",
    "masked LM": f"{ENCODER}, embedding_size: 20, activation: relu, bias: {{qkv: false}}}}"
    "\ntask: masked_lm\n",
}


@pytest.mark.parametrize("name", list(NATIVE))
def test_export_hf_writes_tfcompiles_encoders_of_shared_layers_as_albert(name: str, tmp_path: Path) -> None:
    run = random_run(tmp_path, NATIVE[name])
    assert export_hf(run, tmp_path / "out").startswith("AlbertFor")
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"{ENCODER}}}{CLASSIFIER}", "model.embedding_size"),  # ALBERT always projects
        (f"{ENCODER}, embedding_size: 6, pooler_activation: relu}}{CLASSIFIER}", "model.pooler_activation"),
        (
            f"{ENCODER}, embedding_size: 6}}\ntask: {{type: masked_lm, next_sentence: true}}\n",
            "task.next_sentence",
        ),
        (f"{ENCODER}, embedding_size: 6, n_kv_heads: 2}}{CLASSIFIER}", "model.n_kv_heads"),
    ],
)
def test_export_hf_refuses_what_albert_cannot_compute_by_field(text: str, field: str, tmp_path: Path) -> None:
    run = random_run(tmp_path, text)
    with pytest.raises(HFError, match=rf"  {field}: .* has no ALBERT equivalent"):
        export_hf(run, tmp_path / "out")


@pytest.mark.parametrize("text", [f"{ENCODER}, embedding_size: 6}}{CLASSIFIER}"])
def test_bert_and_electra_refuse_shared_layers(text: str, tmp_path: Path) -> None:
    """Each spec is one writer's: BERT and ELECTRA hold share_layers to false."""
    from tfcompile.hf.bert import Bert
    from tfcompile.hf.electra import Electra
    from tfcompile.spec import parse_spec

    spec = parse_spec(text)
    assert not Bert().candidate(spec) and not Electra().candidate(spec)
    unshared = spec.model_copy(update={"model": spec.model.model_copy(update={"share_layers": False})})
    assert Electra().candidate(unshared)
    assert [p.field for p in Electra().exportable(spec) if "share" in p.field] == ["model.share_layers"]


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("albert", "AlbertForPreTraining"),
        ("albert", "AlbertModel"),
        ("albert_cls", "AlbertForTokenClassification"),
    ],
)
def test_another_head_class_is_refused_by_architectures(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    folder = edited(imported, name, tmp_path, architectures=[head])
    with pytest.raises(HFError, match=rf"  architectures: {head} is not an ALBERT head"):
        import_folder(folder, "head", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "head").exists()


# -------------------------------------------------------------------- every field of AlbertConfig

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "albert_cls",
        hidden_act="relu",
        layer_norm_eps=1e-3,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.2,
        classifier_dropout_prob=0.4,
        initializer_range=0.5,
        spec={"activation": "relu", "norm.eps": 1e-3},
    ),
    case("albert", hidden_act="gelu", spec={"activation": "gelu"}, slow=True),
    case("albert", hidden_act="relu", spec={"activation": "relu"}, slow=True),  # the head applies it too
    case("albert", outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    case("albert", embedding_size=32, spec={"embedding_size": 32}, slow=True),
    case("albert", outcome="embedding_size", embedding_size=16),  # as wide as the blocks, still projected
    case("albert", num_hidden_layers=4, spec={"n_layers": 4, "share_layers": True}, slow=True),
    case("albert", num_hidden_layers=1, spec={"share_layers": True}, slow=True),  # one group of one
    case("albert", num_hidden_groups=2, hidden_act="gelu", spec={"share_layers": False}),
    case("albert", outcome="num_hidden_groups", num_hidden_layers=4, num_hidden_groups=2, slow=True),
    case("albert", outcome="inner_group_num", inner_group_num=2),
    case("albert", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("albert", type_vocab_size=1, spec={"type_vocab_size": 1}, slow=True),
    case("albert", max_position_embeddings=24, spec={"max_seq_len": 24}, slow=True),
    case("albert", num_attention_heads=4, intermediate_size=20, slow=True),
    case("albert", hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.1, slow=True),
    case("albert_cls", classifier_dropout_prob=0.2, slow=True),  # training only
    case("albert", pad_token_id=3, bos_token_id=2, eos_token_id=3, slow=True),
    case("albert", outcome="pad_token_id", json={"pad_token_id": 64}, slow=True),
    case("albert", initializer_range=0.0, slow=True),  # initialisation only
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    assert uncovered("albert", CASES) == set()


def test_a_masked_lm_holding_a_pooler_keeps_it_for_a_classifier(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """albert-base-v2, an AlbertForMaskedLM, holds the pooler it was pretrained with: unread by the
    masked LM (its logits are transformers'), kept (model.pooler: true) for the classifier
    AlbertForSequenceClassification.from_pretrained would start from it; not an unread tensor."""
    import torch
    from hf_models import max_difference, with_tensors

    pooler = {"albert.pooler.weight": torch.randn(16, 16), "albert.pooler.bias": torch.randn(16)}
    folder = with_tensors(imported, "albert", tmp_path, pooler)
    result = import_folder(folder, "pooled", tmp_path / "specs", tmp_path / "runs")
    spec, model = load_trained_model(result.run_dir)
    assert spec.model.pooler and torch.equal(model.pooler.weight, pooler["albert.pooler.weight"])
    for padded in (False, True):
        assert max_difference(imported["albert"].hf, model, padded) <= 1e-5
