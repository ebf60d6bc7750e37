"""ERNIE (tfcompile/hf/ernie.py): ``ErnieForMaskedLM``, ``ErnieForPreTraining`` and
``ErnieForSequenceClassification``, BERT's body under ``ernie.`` with ERNIE 3.0's task-type
embeddings (``use_task_id``) or without. Tiny random transformers models saved with
save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right and
not, two segments) and parameter counts (less the task-type table, folded into the positions);
written back by export-hf as BERT, which computes them exactly; a row for every field of
ErnieConfig."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import BERT, Imported, edited, imported_variants
from test_hf_export import _loads_alike
from test_hf_fields import FAMILIES, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder

transformers = pytest.importorskip("transformers")
T = transformers

LABELS = dict(id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
TASK = dict(use_task_id=True, task_type_vocab_size=3)  # ERNIE 3.0's
FAMILIES["ernie"] = Family(T.ErnieConfig, T.ErnieForMaskedLM, "bert", BERT | TASK)
FAMILIES["ernie_cls"] = Family(T.ErnieConfig, T.ErnieForSequenceClassification, "bert", BERT | LABELS)


def ernie(head: Any, **fields: Any) -> Any:
    model = head(T.ErnieConfig(**BERT | fields))
    table = getattr(model.ernie.embeddings, "task_type_embeddings", None)
    if table is not None:  # rows unlike one another and unlike zero
        with torch.no_grad():
            table.weight.normal_()
    return model


VARIANTS: dict[str, Callable[[], Any]] = {
    "ernie_task": lambda: ernie(T.ErnieForMaskedLM, **TASK),  # ERNIE 3.0's masked LM
    "ernie_cls": lambda: ernie(T.ErnieForSequenceClassification, **LABELS | TASK),
    "ernie_pretraining": lambda: ernie(T.ErnieForPreTraining),  # ERNIE 1.0 and 2.0: no task types
}
WRITTEN_AS = {
    "ernie_task": "BertForMaskedLM",
    "ernie_cls": "BertForSequenceClassification",
    "ernie_pretraining": "BertForPreTraining",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS, tokenizer="bert")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers_less_the_task_type_table(
    imported: dict[str, Imported], name: str
) -> None:
    variant = imported[name]
    config = variant.hf.config
    variant.assert_counts_match(config.task_type_vocab_size * config.hidden_size if config.use_task_id else 0)


def test_the_task_types_row_0_is_what_moves_the_outputs(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """Without the fold, the import would give another model's logits: transformers' own model
    with that row zeroed differs from the import."""
    variant = imported["ernie_task"]
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = variant.model(ids, torch.ones_like(ids))[0]
        assert (variant.hf(input_ids=ids).logits - ours).abs().max() <= 1e-5
        variant.hf.ernie.embeddings.task_type_embeddings.weight[0].zero_()
        assert (variant.hf(input_ids=ids).logits - ours).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_as_bert(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == WRITTEN_AS[name]
    _loads_alike(tmp_path / "out", variant.model)


def test_another_head_class_is_refused_by_architectures(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    head = "ErnieForTokenClassification"
    folder = edited(imported, "ernie_cls", tmp_path, architectures=[head])
    with pytest.raises(HFError, match=rf"  architectures: {head} is not an ERNIE head"):
        import_folder(folder, "head", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "head").exists()


# -------------------------------------------------------------------- every field of ErnieConfig

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "ernie_cls",
        hidden_act="relu",
        layer_norm_eps=1e-3,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.2,
        classifier_dropout=0.4,
        initializer_range=0.5,
        use_cache=False,
        spec={"activation": "relu", "norm.eps": 1e-3},
    ),
    case("ernie", use_task_id=False, slow=True),
    case("ernie", outcome="use_task_id", json={"use_task_id": False}),  # a table transformers reads not
    case("ernie", task_type_vocab_size=1, slow=True),
    case("ernie", task_type_vocab_size=7, slow=True),
    case("ernie", outcome="task_type_vocab_size", json={"task_type_vocab_size": 0}),  # no row 0 to add
    case("ernie", hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    case("ernie", outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    case("ernie", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("ernie", type_vocab_size=1, spec={"type_vocab_size": 1}, slow=True),
    case("ernie", max_position_embeddings=24, spec={"max_seq_len": 24}, slow=True),
    case("ernie", num_hidden_layers=1, intermediate_size=20, num_attention_heads=4, slow=True),
    case("ernie_cls", classifier_dropout=0.2, slow=True),  # training only
    case("ernie", pad_token_id=3, bos_token_id=2, eos_token_id=3, slow=True),
    case("ernie", outcome="is_decoder", json={"is_decoder": True}, slow=True),
    case("ernie", outcome="add_cross_attention", json={"add_cross_attention": True}, slow=True),
    case("ernie", initializer_range=0.0, slow=True),  # initialisation only
    case("ernie", use_cache=False, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    assert uncovered("ernie", CASES) == set()
