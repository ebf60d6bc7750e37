"""ELECTRA (tfcompile/hf/electra.py): ``ElectraForSequenceClassification`` and the generator,
``ElectraForMaskedLM``, with factorized embeddings (``embedding_size`` narrower or wider than
``hidden_size``: the spec's ``embedding_size``) or not. Tiny random transformers models saved with
save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right and
not, two segments) and parameter counts; written back by export-hf as ELECTRA (or, a generator of
embeddings as wide as its blocks, as BERT, which computes it exactly), and tfcompile's own encoders
of those choices too, or refused by field; a row for every field of ElectraConfig."""

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

LABELS = dict(id2label={0: "neg", 1: "pos", 2: "neutral"}, label2id={"neg": 0, "pos": 1, "neutral": 2})
TINY = BERT | {"embedding_size": 8}  # electra-small's shape: embeddings half the blocks' width
FAMILIES["electra"] = Family(T.ElectraConfig, T.ElectraForMaskedLM, "bert", TINY)
FAMILIES["electra_cls"] = Family(T.ElectraConfig, T.ElectraForSequenceClassification, "bert", TINY | LABELS)


def electra(head: Any, **fields: Any) -> Any:
    return head(T.ElectraConfig(**TINY | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # a classifier fine-tuned from electra-small: embeddings projected up to the blocks
    "electra_cls": lambda: electra(T.ElectraForSequenceClassification, **LABELS),
    # from electra-base: embeddings as wide as the blocks, no projection
    "electra_cls_wide": lambda: electra(T.ElectraForSequenceClassification, embedding_size=16),
    # a generator: embeddings wider than its blocks (electra-base-generator's 768 over 256)
    "electra_generator": lambda: electra(T.ElectraForMaskedLM, embedding_size=24, hidden_act="gelu_python"),
    "electra_generator_untied": lambda: electra(T.ElectraForMaskedLM, tie_word_embeddings=False),
    # embeddings as wide as the blocks: BERT's masked LM, with the generator's head
    "electra_generator_wide": lambda: electra(T.ElectraForMaskedLM, embedding_size=16),
}
WRITTEN_AS = {
    "electra_cls": "ElectraForSequenceClassification",
    "electra_cls_wide": "ElectraForSequenceClassification",  # BERT's pooler is tanh
    "electra_generator": "ElectraForMaskedLM",
    "electra_generator_untied": "ElectraForMaskedLM",
    "electra_generator_wide": "BertForMaskedLM",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS, tokenizer="bert")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def said(name: str) -> tuple[Any, ...]:
        model = imported[name].spec.model
        return model.embedding_size, model.pooler, model.pooler_activation, model.tie_embeddings

    assert said("electra_cls") == (8, True, "gelu", True)
    assert said("electra_cls_wide") == (16, True, "gelu", True)  # as wide as d_model: no projection
    assert said("electra_generator") == (24, False, "tanh", True)
    assert said("electra_generator_untied") == (8, False, "tanh", False)
    assert said("electra_generator_wide") == (16, False, "tanh", True)
    assert imported["electra_cls"].spec.task.labels == ["neg", "pos", "neutral"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == WRITTEN_AS[name]
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model.model_dump(exclude={"pooler_activation"}) == variant.spec.model.model_dump(
        exclude={"pooler_activation"}
    )


ENCODER = (
    "model: {family: encoder, vocab_size: 64, d_model: 16, n_layers: 2, n_heads: 4, max_seq_len: 16, "
    "norm: {position: post, eps: 1.0e-12}, embedding_norm: true"
)
CLASSIFIER = "\ntask: {type: classification, labels: [a, b]}\n"
NATIVE = {
    "factorized classifier": f"{ENCODER}, embedding_size: 6, pooler_activation: gelu}}{CLASSIFIER}",
    "GELU pooler": f"{ENCODER}, pooler_activation: gelu, bias: {{qkv: false}}}}{CLASSIFIER}",
    "factorized masked LM": f"{ENCODER}, embedding_size: 24, tie_embeddings: false}}\ntask: masked_lm\n",
}


@pytest.mark.parametrize("name", list(NATIVE))
def test_export_hf_writes_tfcompiles_encoders_bert_cannot_hold_as_electra(name: str, tmp_path: Path) -> None:
    run = random_run(tmp_path, NATIVE[name])
    assert export_hf(run, tmp_path / "out").startswith("ElectraFor")
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"{ENCODER}, embedding_size: 6, activation: relu}}\ntask: masked_lm\n", "model.activation"),
        (
            f"{ENCODER}, embedding_size: 6}}\ntask: {{type: masked_lm, next_sentence: true}}\n",
            "task.next_sentence",
        ),
        (f"{ENCODER}, embedding_size: 6, pooler_activation: relu}}{CLASSIFIER}", "model.pooler_activation"),
        (f"{ENCODER}, embedding_size: 6, positional: sinusoidal}}{CLASSIFIER}", "model.positional"),
        (f"{ENCODER}, embedding_size: 6}}{CLASSIFIER}", "model.pooler_activation"),  # ELECTRA's is GELU
        (
            ENCODER.replace("position: post", "position: pre") + f", embedding_size: 6}}{CLASSIFIER}",
            "model.norm.position",
        ),
    ],
)
def test_export_hf_refuses_what_electra_cannot_compute_by_field(
    text: str, field: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, text)
    with pytest.raises(HFError, match=rf"  {field}: .* has no ELECTRA equivalent"):
        export_hf(run, tmp_path / "out")


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("electra_generator", "ElectraForPreTraining"),  # the discriminator
        ("electra_generator", "ElectraModel"),
        ("electra_cls", "ElectraForTokenClassification"),
    ],
)
def test_another_head_class_is_refused_by_architectures(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    folder = edited(imported, name, tmp_path, architectures=[head])
    with pytest.raises(HFError, match=rf"  architectures: {head} is not an ELECTRA head"):
        import_folder(folder, "head", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "head").exists()


# ------------------------------------------------------------------- every field of ElectraConfig

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "electra_cls",
        hidden_act="relu",
        layer_norm_eps=1e-3,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.2,
        classifier_dropout=0.4,
        initializer_range=0.5,
        summary_type="mean",
        summary_use_proj=False,
        summary_activation="tanh",
        summary_last_dropout=0.5,
        use_cache=False,
        spec={"activation": "relu", "norm.eps": 1e-3, "pooler_activation": "gelu"},
    ),
    case("electra", embedding_size=16, spec={"embedding_size": 16}, exported=True),  # BERT writes it
    case("electra", embedding_size=32, spec={"embedding_size": 32}, slow=True),
    case("electra_cls", embedding_size=4, spec={"embedding_size": 4}, slow=True),
    case("electra", hidden_act="gelu_python", slow=True),
    case("electra", outcome="hidden_act", hidden_act="relu"),  # the generator head's GELU is not the body's
    case("electra", outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    case("electra_cls", hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    case("electra", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("electra", type_vocab_size=1, spec={"type_vocab_size": 1}, slow=True),
    case("electra", max_position_embeddings=24, spec={"max_seq_len": 24}, slow=True),
    case("electra", num_hidden_layers=1, intermediate_size=20, num_attention_heads=2, slow=True),
    case("electra", layer_norm_eps=1e-3, slow=True),
    case("electra", hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.0, slow=True),
    case("electra_cls", classifier_dropout=0.2, slow=True),  # training only
    case("electra", pad_token_id=3, bos_token_id=2, eos_token_id=3, slow=True),
    case("electra", outcome="pad_token_id", json={"pad_token_id": 64}, slow=True),
    case("electra", outcome="is_decoder", json={"is_decoder": True}, slow=True),
    case("electra", outcome="add_cross_attention", json={"add_cross_attention": True}, slow=True),
    case("electra", initializer_range=0.0, slow=True),  # initialisation only
    case("electra", use_cache=False, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    assert uncovered("electra", CASES) == set()
