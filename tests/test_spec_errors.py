"""Bad specs, table-driven: each case asserts the reported line, field path and message."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import MODEL_YAML

from tfcompile.spec import SpecError, parse_spec

GOOD_MODEL = MODEL_YAML
ENCODER = MODEL_YAML.replace("model:\n", "model:\n  family: encoder\n")  # line 8 follows it


@dataclass(frozen=True)
class Case:
    name: str
    yaml: str
    line: int | None
    path: str
    message: str  # a substring of the message
    hint: str | None = None  # a substring of the hint


CASES = [
    Case(
        "misspelt key", GOOD_MODEL + "  n_head: 4\n", 7, "model.n_head", "unknown field 'n_head'", "'n_heads'"
    ),
    Case(
        "misplaced key",
        GOOD_MODEL + "  eps: 1.0e-6\n",
        7,
        "model.eps",
        "unknown field",
        "belongs under `norm:`",
    ),
    Case(
        "misspelt enum",
        GOOD_MODEL + "  norm: {type: rmsnrom}\n",
        7,
        "model.norm.type",
        "expected one of 'layernorm', 'rmsnorm'",
        "did you mean 'rmsnorm'",
    ),
    Case(
        "misspelt variant",
        GOOD_MODEL + "  positional: rpoe\n",
        7,
        "model.positional",
        "unknown type 'rpoe'",
        "'rope'",
    ),
    Case(
        "misspelt variant, mapping form",
        GOOD_MODEL + "  positional:\n    type: rotary\n",
        8,
        "model.positional.type",
        "unknown type 'rotary'",
        None,
    ),
    Case(
        "variant field of another variant",
        GOOD_MODEL + "  positional: {type: learned, theta: 10}\n",
        7,
        "model.positional.theta",
        "unknown field 'theta'",
        None,
    ),
    Case(
        "wrong type",
        GOOD_MODEL.replace("d_model: 64", "d_model: big"),
        3,
        "model.d_model",
        "valid integer",
        None,
    ),
    Case(
        "boolean for an integer",
        GOOD_MODEL.replace("n_layers: 2", "n_layers: true"),
        4,
        "model.n_layers",
        "valid integer",
        None,
    ),
    Case(
        "out of range",
        GOOD_MODEL + "  dropout: {residual: 1.5}\n",
        7,
        "model.dropout.residual",
        "less than 1",
        None,
    ),
    Case(
        "missing required field",
        GOOD_MODEL.replace("  n_layers: 2\n", ""),
        1,
        "model.n_layers",
        "missing required field 'n_layers'",
        "under `model`",
    ),
    Case(
        "heads do not divide d_model",
        GOOD_MODEL.replace("n_heads: 4", "n_heads: 6"),
        5,
        "model.n_heads",
        "d_model (64) must be divisible by n_heads (6)",
        "e.g. 8",
    ),
    Case(
        "kv heads do not divide heads",
        GOOD_MODEL + "  n_kv_heads: 3\n",
        7,
        "model.n_kv_heads",
        "must be a multiple of n_kv_heads (3)",
        "1 for MQA",
    ),
    Case(
        "odd head size for rope",
        GOOD_MODEL.replace("d_model: 64", "d_model: 36") + "  positional: rope\n",
        7,
        "model.positional",
        "head size must be even",
        None,
    ),
    Case(
        "relative buckets",
        GOOD_MODEL + "  positional: {type: relative, num_buckets: 32, max_distance: 10}\n",
        7,
        "model.positional.max_distance",
        "must exceed num_buckets / 2 = 16",
        None,
    ),
    Case(
        "context longer than the model",
        GOOD_MODEL + "train: {context_length: 64}\n",
        7,
        "train.context_length",
        "exceeds model.max_seq_len (32)",
        "at most 32",
    ),
    Case(
        "misspelt schedule field",
        GOOD_MODEL + "train:\n  schedule: {type: vaswani, warmup: 10}\n",
        8,
        "train.schedule.warmup",
        "unknown field 'warmup'",
        "'warmup_steps'",
    ),
    Case(
        "variant without a type",
        GOOD_MODEL + "  positional: {theta: 3}\n",
        7,
        "model.positional",
        "missing `type`",
        "'rope'",
    ),
    Case(
        "too few items",
        GOOD_MODEL + "train:\n  optimizer: {betas: [0.9]}\n",
        8,
        "train.optimizer.betas",
        "too few items: nothing at position 1",
        None,
    ),
    Case(
        "too many items",
        GOOD_MODEL + "train:\n  optimizer: {betas: [0.9, 0.9, 0.9]}\n",
        8,
        "train.optimizer.betas",
        "tuple should have at most 2 items",
        None,
    ),
    Case("empty file", "", None, "model", "missing required field 'model'", "at the top level"),
    Case("section not a mapping", GOOD_MODEL + "train: 5\n", 7, "train", "expected a mapping", None),
    Case(
        "unknown top-level section",
        GOOD_MODEL + "trian: {}\n",
        7,
        "trian",
        "unknown field 'trian'",
        "'train'",
    ),
    Case("unknown preset", "preset: lama\n" + GOOD_MODEL, 1, "preset", "unknown preset 'lama'", "'llama'"),
    Case("duplicate key", GOOD_MODEL + "  d_model: 32\n", 7, "", "duplicate key 'd_model'", None),
    Case("broken YAML", "model: [1, 2\n", None, "", "invalid YAML", None),
    Case("not a mapping", "- 1\n- 2\n", 1, "", "a spec is a mapping", "`model:`"),
    Case(
        "chunked loss of a task that has none",
        "model: {family: vit, image_size: 8, patch_size: 2, d_model: 16, n_layers: 1, n_heads: 2}\n"
        "task: {type: image_classification, labels: [a, b]}\n"
        "train:\n  loss_chunk_tokens: 64\n",
        4,
        "train.loss_chunk_tokens",
        "computes its loss in one piece",
        "causal_lm",
    ),
    Case(
        "a context of one token",
        GOOD_MODEL.replace("max_seq_len: 32", "max_seq_len: 1"),
        6,
        "model.max_seq_len",
        "greater than or equal to 2",
    ),
    Case(
        "one segment embedding for a classifier of pairs",
        ENCODER + "  type_vocab_size: 1\ntask: {type: classification, labels: [a, b]}\n",
        8,
        "model.type_vocab_size",
        "type_vocab_size 1 embeds segment 0 alone",
        "type_vocab_size: 2",
    ),
    Case(
        "one segment embedding for next-sentence prediction",
        ENCODER + "  type_vocab_size: 1\ntask: {type: masked_lm, next_sentence: true}\n",
        8,
        "model.type_vocab_size",
        "next-sentence prediction reads sentence pairs, the second as segment 1",
        "0 for no segment embeddings",
    ),
    Case(
        "a context too short for a masked-LM example",
        ENCODER.replace("max_seq_len: 32", "max_seq_len: 4")
        + "task: {type: masked_lm, next_sentence: true}\n",
        7,
        "model.max_seq_len",
        "[CLS] A [SEP] B [SEP], a token to mask in each sentence: 5 tokens, more than a context of 4",
        "raise it to 5",
    ),
    Case(
        "a training context too short for a classifier's example",
        ENCODER + "task: {type: classification, labels: [a, b]}\ntrain: {context_length: 2}\n",
        9,
        "train.context_length",
        "[CLS] A [SEP], a token of the sentence: 3 tokens, more than a context of 2",
        "raise it to 3",
    ),
    Case(
        "no labels",
        ENCODER + "task: {type: classification, labels: []}\n",
        8,
        "task.labels",
        "names no class, but a classifier tells two classes at least",
        "leave task.labels out",
    ),
    Case(
        "one label",
        "model: {family: vit, image_size: 8, patch_size: 2, d_model: 16, n_layers: 1, n_heads: 2}\n"
        "task: {type: image_classification, labels: [cat]}\n",
        2,
        "task.labels",
        "names 'cat', but a classifier tells two classes at least",
    ),
    Case(
        "a label named twice",
        "model: {family: vit, image_size: 8, patch_size: 2, d_model: 16, n_layers: 1, n_heads: 2}\n"
        "task:\n  type: image_classification\n  labels: [cat, dog, cat]\n",
        4,
        "task.labels",
        "names 'cat' more than once",
        "give each class one name",
    ),
    Case(
        "YaRN's betas the wrong way round",
        GOOD_MODEL + "  positional:\n    type: rope\n    scaling: {type: yarn, factor: 2.0, "
        "original_max_position_embeddings: 16,\n      beta_fast: 1, beta_slow: 32}\n",
        10,
        "model.positional.scaling.beta_fast",
        "must be at least beta_slow (32.0), found 1.0",
        "beta_fast 32 and beta_slow 1",
    ),
    Case(
        "an opset past what torch exports",
        GOOD_MODEL + "export: {opset: 24}\n",
        7,
        "export.opset",
        "must be at most 23, found 24",
        "torch.onnx exports opsets 17 to 23",
    ),
    Case(
        "a length penalty past what a bundle serves",
        "model: {family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2,\n"
        "  max_seq_len: 8}\n"
        "task: {type: seq2seq, length_penalty: 11}\n",
        3,
        "task.length_penalty",
        "less than or equal to 10",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_spec_is_reported_at_its_line_and_field(case: Case) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(case.yaml, source="bad.yaml")
    issues = info.value.issues
    assert len(issues) == 1, info.value
    issue = issues[0]
    assert issue.path == case.path, info.value
    if case.line is not None:
        assert issue.line == case.line, info.value
    assert case.message in issue.message, info.value
    if case.hint is not None:
        assert issue.hint is not None and case.hint in issue.hint, info.value


def test_several_errors_are_reported_at_once_in_line_order() -> None:
    text = GOOD_MODEL + "  n_head: 4\n  activation: swiglo\ntrain:\n  precision: bf17\n  steps: -1\n"
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="bad.yaml")
    assert [i.path for i in info.value.issues] == [
        "model.n_head",
        "model.activation",
        "train.precision",
        "train.steps",
    ]
    assert [i.line for i in info.value.issues] == [7, 8, 10, 11]
    assert str(info.value).endswith("4 errors in bad.yaml")


def test_rendered_error_shows_file_line_column_source_and_caret() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(GOOD_MODEL + "  activation: swiglo\n", source="specs/x.yaml")
    choices = "'relu', 'gelu', 'gelu_tanh', 'silu', 'swiglu', 'geglu', 'geglu_tanh'"
    assert str(info.value).splitlines() == [
        f"specs/x.yaml:7:15: error: model.activation: unknown value 'swiglo': expected one of {choices}",
        "  7 |   activation: swiglo",
        "    |               ^^^^^^",
        "  = hint: did you mean 'swiglu'?",
        "1 error in specs/x.yaml",
    ]


def test_error_in_a_preset_value_points_at_the_section_and_names_the_preset() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("preset: gpt2\nmodel:\n  d_model: 100\n", source="bad.yaml")
    (issue,) = info.value.issues
    assert issue.path == "model.n_heads" and issue.line == 2
    assert issue.note is not None and "preset 'gpt2'" in issue.note


def test_bad_override_is_reported() -> None:
    with pytest.raises(SpecError, match=r"section\.field=value"):
        parse_spec(GOOD_MODEL, overrides=["train.steps"])
    with pytest.raises(SpecError) as info:
        parse_spec(GOOD_MODEL, overrides=["train.steps=-5"])
    assert info.value.issues[0].path == "train.steps"
