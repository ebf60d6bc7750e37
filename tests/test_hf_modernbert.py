"""ModernBERT (``ModernBertForMaskedLM``, ``ModernBertForSequenceClassification``): a pre-norm encoder
whose first attention reads the normalised embeddings as they are, RoPE at a global and a local
theta, local attention over ``local_attention`` // 2 positions on either side in all but every
``global_attn_every_n_layers``-th layer (or as ``layer_types`` says), GeGLU, LayerNorms without
shifts, and a classifier that pools [CLS] or the mean of the real tokens through a dense layer,
GELU and a LayerNorm. Tiny random transformers models saved with save_pretrained, imported, and
held to transformers' logits (float32, rows padded on the right and not, past the window), their
parameter counts and, for a classifier, the bundle's probabilities; export-hf writes each back (and
a run of tfcompile's own of RoPE) to the same logits, the window's layers where
global_attn_every_n_layers can say them. A row for every field of ModernBertConfig
(tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, from_pretrained, imported_variants, max_difference
from test_hf_fields import DELETE, FAMILIES, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.spec.presets import merge
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# The "bert" tokenizer's special tokens come first: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4.
TOKENS = dict(pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
MODERNBERT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=32,
    local_attention=6,  # 3 positions on either side: rows of 20 reach past it
)
LABELS = {"id2label": {0: "neg", 1: "pos", 2: "neutral"}, "label2id": {"neg": 0, "pos": 1, "neutral": 2}}
FAMILIES["modernbert"] = Family(T.ModernBertConfig, T.ModernBertForMaskedLM, "bert", MODERNBERT | TOKENS)
FAMILIES["modernbert_cls"] = Family(
    T.ModernBertConfig, T.ModernBertForSequenceClassification, "bert", MODERNBERT | TOKENS | LABELS
)


def modernbert(head: Any = T.ModernBertForMaskedLM, **fields: Any) -> Any:
    return head(T.ModernBertConfig(**MODERNBERT | TOKENS | fields))


CLASSIFIER = T.ModernBertForSequenceClassification
VARIANTS: dict[str, Callable[[], Any]] = {
    # ModernBERT-base's shape, shrunk: every third layer global, the others local, tied
    "modernbert": lambda: modernbert(),
    # its classifier over the mean of the real tokens, biases everywhere, another pattern and thetas
    "modernbert_mean": lambda: modernbert(
        CLASSIFIER,
        classifier_pooling="mean",
        classifier_bias=True,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        num_labels=3,
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        },
    ),
    # the [CLS] classifier, a ReLU head, the tanh GELU's gate
    "modernbert_cls": lambda: modernbert(
        CLASSIFIER, classifier_activation="relu", hidden_activation="gelu_pytorch_tanh", num_labels=2
    ),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS, tokenizer="bert")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    """Where classifier_bias is false the head's dense layer has no bias, the spec's one of zeros."""
    biased = imported[name].hf.config.classifier_bias
    imported[name].assert_counts_match(unread=0 if biased else -imported[name].hf.config.hidden_size)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    mlm, mean = imported["modernbert"].spec.model, imported["modernbert_mean"].spec.model
    plain = imported["modernbert_cls"].spec.model
    assert (mlm.norm.position, mlm.norm.bias, mlm.norm.first_attention, mlm.embedding_norm) == (
        "pre",
        False,
        False,
        True,
    )
    assert mlm.window is not None and (mlm.window.size, mlm.window.layers) == (7, [1, 2])
    assert mlm.positional.local is not None
    assert (mlm.positional.theta, mlm.positional.local.theta, mlm.positional.local.layers) == (
        160000.0,
        10000.0,
        [1, 2],
    )
    assert (mlm.activation, mlm.bias.qkv, mlm.bias.ffn, mlm.bias.lm_head, mlm.tie_embeddings) == (
        "geglu",
        False,
        False,
        True,
        True,
    )
    assert (mlm.pooler, mlm.type_vocab_size) == (False, 0)
    assert mean.window is not None and mean.window.layers == [1, 3]
    assert (mean.pooling, mean.pooler_norm, mean.pooler_activation, mean.norm.bias, mean.bias.qkv) == (
        "mean",
        True,
        "gelu",
        True,
        True,
    )
    assert (plain.pooling, plain.pooler_activation, plain.activation) == ("cls", "relu", "geglu_tanh")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_is_written_back_to_transformers_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    assert export_hf(imported[name].result.run_dir, tmp_path / "out").startswith("ModernBert")
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    for padded in (False, True):
        assert max_difference(reloaded, imported[name].model, padded, length=20) <= 1e-5
    read = imported[name].hf.config  # the run's [CLS] and [SEP], not ModernBertConfig's 50281, 50282
    assert (reloaded.config.cls_token_id, reloaded.config.sep_token_id) == (
        read.cls_token_id,
        read.sep_token_id,
    )


OWN_MLM = {
    "family": "encoder",
    "vocab_size": 64,
    "d_model": 32,
    "n_heads": 4,
    "max_seq_len": 24,
    "n_layers": 4,
    "positional": {
        "type": "rope",
        "layout": "halves",
        "theta": 1000,
        "local": {"theta": 100, "layers": [1, 2]},
    },
    "window": {"size": 5, "layers": [1, 2]},
    "norm": {"bias": False, "first_attention": False},
    "embedding_norm": True,
    "activation": "geglu",
    "type_vocab_size": 0,
    "pooler": False,
}


TWO_LABELS = {"type": "classification", "labels": ["a", "b"]}
RUNS = {
    "masked_lm": {"model": OWN_MLM, "task": "masked_lm"},
    "mean": {
        "model": OWN_MLM
        | {"pooler": True, "pooling": "mean", "pooler_norm": True, "pooler_activation": "gelu"},
        "task": TWO_LABELS,
    },
    "no window": {  # the local layers at their own theta only, SwiGLU, LayerNorms with shifts
        "model": {k: v for k, v in OWN_MLM.items() if k not in ("window", "norm", "pooler")}
        | {"activation": "swiglu", "norm": {"first_attention": False}, "pooler_norm": True},
        "task": TWO_LABELS,
    },
}


@pytest.mark.parametrize("kind", list(RUNS))
def test_a_run_of_tfcompiles_own_loads_in_transformers(kind: str, tmp_path: Path) -> None:
    """Biases and shifts the run has (the pooler's, the norms') and a window over every position
    where the local layers only turn at their own theta."""
    run = random_run(tmp_path, json.dumps(RUNS[kind]))
    assert export_hf(run, tmp_path / "out").startswith("ModernBert")
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    model = load_trained_model(run)[1]
    for padded in (False, True):
        assert max_difference(reloaded, model, padded, length=20) <= 1e-5


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"window": {"layers": [0, 2]}, "positional": {"local": {"layers": [0, 2]}}}, "model.window.layers"),
        ({"positional": {"local": {"layers": [1]}}}, "model.positional.local.layers"),  # the window's
        ({"norm": {"first_attention": True}}, "model.norm.first_attention"),
        ({"positional": {"layout": "interleaved"}}, "model.positional.layout"),
        ({"type_vocab_size": 2}, "model.type_vocab_size"),
        ({"activation": "gelu"}, "model.activation"),
        ({"embedding_size": 16}, "model.embedding_size"),  # (RoPE: ModernBERT's to write, not ELECTRA's)
        ({"n_kv_heads": 2}, "model.n_kv_heads"),
        ({"bias": {"qkv": True, "attn_out": False}}, "model.bias.attn_out"),
    ],
)
def test_what_modernbert_cannot_say_is_refused_by_field(
    edit: dict[str, Any], field: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, json.dumps({"model": merge(OWN_MLM, edit), "task": "masked_lm"}))
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert f"  {field}" in str(error.value) and "ModernBERT" in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modernbert_mean", "modernbert_cls"])
def test_a_classifier_bundle_gives_transformers_probabilities(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """Exported with parity (the windows, mean pooling and the head's norm in ONNX), the runtime's
    probabilities for texts of several lengths in one batch are transformers' for each alone."""
    from tfcompile.cli import main
    from tfcompile.runtime import load

    bundle = tmp_path / "bundle"
    assert main(["export", str(imported[name].result.run_dir), "--out", str(bundle)]) == 0
    texts = ["the cat sat by a door", "a hat", "that is a hit, said he"]  # within the context of 32
    tokenizer = T.AutoTokenizer.from_pretrained(imported[name].folder)
    for text, prediction in zip(texts, load(bundle).classify(texts), strict=True):
        with torch.no_grad():
            expected = imported[name].hf(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0]
        assert list(prediction.probabilities.values()) == pytest.approx(expected.tolist(), abs=1e-5)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A ModernBERT masked-LM row: imported, and written back where it imports."""
    return case("modernbert", **fields)


def cls_row(**fields: Any) -> Case:
    return case("modernbert_cls", **fields)


def thetas(full: Any, local: Any) -> dict[str, Any]:
    return {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": full},
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    }


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        norm_eps=1e-2,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        decoder_bias=False,
        initializer_range=0.5,
        spec={"norm.eps": 1e-2, "norm.bias": True, "bias.qkv": True, "bias.ffn": True, "bias.lm_head": False},
    ),
    row(norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(norm_bias=True, spec={"norm.bias": True}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": False}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(decoder_bias=False, spec={"bias.lm_head": False}, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}),
    row(initializer_range=0.5, initializer_cutoff_factor=3.0, slow=True),  # initialisation only
    row(attention_dropout=0.3, embedding_dropout=0.2, mlp_dropout=0.1, slow=True),  # training only
    row(deterministic_flash_attn=True, slow=True),  # flash attention's backward only
    row(sparse_prediction=True, sparse_pred_ignore_index=-1, slow=True),  # the loss only
    row(pad_token_id=None, slow=True),
    row(cls_token_id=1, sep_token_id=1, bos_token_id=None, eos_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8, "window.size": 7}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(num_hidden_layers=1, spec={"window": None}, slow=True),  # one global layer
    row(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    # the activations: gated, the masked-LM head's classifier_activation the body's ungated
    row(hidden_activation="gelu_pytorch_tanh", classifier_activation="gelu_pytorch_tanh", slow=True),
    row(hidden_activation="silu", classifier_activation="silu", spec={"activation": "swiglu"}),
    row(outcome="classifier_activation", hidden_activation="silu", slow=True),
    row(outcome="hidden_activation", hidden_activation="relu", classifier_activation="relu", slow=True),
    # the layers: layer_types, or every global_attn_every_n_layers-th global (ModernBertConfig's 3)
    row(  # imported; not written: global_attn_every_n_layers keeps layer 0 global (4 reads no layer_types)
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        spec={"window.layers": [0, 2], "positional.local.layers": [0, 2]},
        exported=False,
    ),
    row(layer_types=["full_attention"] * 4, spec={"window": None, "positional.local": None}, slow=True),
    row(outcome="layer_types", json={"layer_types": ["full_attention", "chunked_attention"] * 2}, slow=True),
    row(outcome="layer_types", json={"layer_types": ["full_attention"] * 3}, slow=True),
    row(json={"layer_types": DELETE}, spec={"window.layers": [1, 2]}, slow=True),
    row(json={"global_attn_every_n_layers": 3}, spec={"window.layers": [1, 2]}, slow=True),  # alike
    row(  # transformers 5 reads layer_types, 4 the pattern
        outcome="layer_types",
        json={"global_attn_every_n_layers": 2},
    ),
    row(
        json={"layer_types": DELETE, "global_attn_every_n_layers": 2},
        spec={"window.layers": [1, 3]},
        slow=True,
    ),
    row(json={"layer_types": DELETE, "global_attn_every_n_layers": 1}, spec={"window": None}, slow=True),
    row(
        outcome="global_attn_every_n_layers",
        json={"layer_types": DELETE, "global_attn_every_n_layers": 0},
        slow=True,
    ),
    # the window: local_attention // 2 on either side; one that reaches every position is none
    row(local_attention=2, spec={"window.size": 3}),
    row(local_attention=5, spec={"window.size": 5}, slow=True),
    row(local_attention=0, spec={"window.size": 1}, slow=True),
    row(local_attention=64, spec={"window": None, "positional.local.theta": 10000.0}, slow=True),
    row(outcome="local_attention", json={"local_attention": -2}, slow=True),
    # transformers 5 reads a sliding_window as half of local_attention, 4 reads none
    row(json={"sliding_window": 3}, slow=True),
    row(outcome="sliding_window", json={"sliding_window": 1}),
    row(outcome="sliding_window", json={"sliding_window": None}, slow=True),
    row(json={"head_dim": 8}, slow=True),  # hidden_size / num_attention_heads: its RoPE reads it
    row(outcome="head_dim", json={"head_dim": 16}, slow=True),
    row(json={"attention_chunk_size": 4}, slow=True),  # an encoder: no generation cache to slide
    # RoPE: each kind's theta, in rope_parameters (transformers 5) or the older fields (4)
    row(**thetas(500.0, 50.0), spec={"positional.theta": 500.0, "positional.local.theta": 50.0}),
    row(
        json={"rope_parameters": DELETE, "global_rope_theta": 700.0, "local_rope_theta": 70.0},
        spec={"positional.theta": 700.0, "positional.local.theta": 70.0},
        slow=True,
    ),
    row(
        json={"rope_parameters": DELETE},
        spec={"positional.theta": 160000.0, "positional.local.theta": 10000.0},
        slow=True,
    ),
    row(outcome="local_rope_theta", json={"rope_parameters": DELETE, "local_rope_theta": None}, slow=True),
    row(outcome="global_rope_theta", json={"global_rope_theta": 1.0}, slow=True),  # 4 reads it, 5 not
    row(
        outcome="rope_parameters.full_attention.rope_type",
        json={
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5.0}}
        },
        slow=True,
    ),
    row(  # the older key of a RoPE's kind
        outcome="rope_parameters.full_attention.rope_type",
        json={"rope_parameters": {"full_attention": {"type": "linear", "factor": 4.0, "rope_theta": 5.0}}},
        slow=True,
    ),
    row(outcome="architectures", json={"architectures": ["ModernBertForQuestionAnswering"]}, slow=True),
    # the classifier: [CLS] or the mean, dense (with classifier_bias), activation, LayerNorm
    cls_row(classifier_pooling="mean", spec={"pooling": "mean", "pooler_norm": True}),
    cls_row(classifier_bias=True, classifier_dropout=0.3, slow=True),
    cls_row(classifier_activation="tanh", spec={"pooler_activation": "tanh"}, slow=True),
    cls_row(outcome="classifier_activation", classifier_activation="silu", slow=True),
    cls_row(outcome="classifier_pooling", json={"classifier_pooling": "max"}, slow=True),
    cls_row(outcome="problem_type", problem_type="multi_label_classification", slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to ModernBertConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("modernbert", CASES) == set()
