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
        "belongs under `model.norm:`",
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
        "expected at most 2 items, found [0.9, 0.9, 0.9]",
        None,
    ),
    Case(
        "a list too short",
        GOOD_MODEL + "task:\n  type: causal_lm\n  banned_sequences: [[a, b], [c]]\n",
        9,
        "task.banned_sequences.1",
        "expected at least 2 items, found ['c']",
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
    Case(
        "a negative length penalty for fairseq's beam search",
        "model: {family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2,\n"
        "  max_seq_len: 8}\n"
        "task: {type: seq2seq, length_penalty: -1}\n",
        3,
        "task.length_penalty",
        "must be at least 0 with beam_scoring fairseq, found -1.0",
        "set task.beam_scoring: transformers, whose length penalty may be negative",
    ),
    Case(
        "early stopping for fairseq's beam search",
        "model: {family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2,\n"
        "  max_seq_len: 8}\n"
        "task:\n"
        "  type: seq2seq\n"
        "  early_stopping: never\n",
        5,
        "task.early_stopping",
        "fairseq's ends once beam have finished, found 'never'",
        "set task.beam_scoring: transformers",
    ),
]


VIT = "model: {family: vit, image_size: 8, patch_size: 2, d_model: 16, n_layers: 1, n_heads: 2}\n"

# One mistake, one message, and a hint that names the fix: a field misspelt or put in the wrong
# section, a choice in another case or another tool's name, a number written another way, a
# section written as a scalar, the YAML slips of a spec written by hand.
HINTED = [
    # a misspelt required field is not also reported missing
    Case(
        "misspelt required field",
        GOOD_MODEL.replace("d_model: 64", "d_modle: 64"),
        3,
        "model.d_modle",
        "unknown field 'd_modle'",
        "did you mean 'd_model'?",
    ),
    Case(
        "misspelt section",
        GOOD_MODEL.replace("model:", "modle:"),
        1,
        "modle",
        "unknown field 'modle'",
        "did you mean 'model'?",
    ),
    Case(
        "required field at the top level",
        GOOD_MODEL.replace("  d_model: 64\n", "") + "d_model: 64\n",
        6,
        "d_model",
        "unknown field 'd_model'",
        "'d_model' belongs under `model:`",
    ),
    Case(
        "preset inside the model",
        "model:\n  preset: llama\n  d_model: 512\n",
        2,
        "model.preset",
        "unknown field 'preset'",
        "'preset' belongs at the top level",
    ),
    # a field of another section says which
    Case(
        "lr at the top level",
        GOOD_MODEL + "lr: 1.0e-3\n",
        7,
        "lr",
        "unknown field 'lr'",
        "'lr' belongs under `train.optimizer:`",
    ),
    Case(
        "lr under train",
        GOOD_MODEL + "train:\n  lr: 1.0e-3\n",
        8,
        "train.lr",
        "unknown field 'lr'",
        "'lr' belongs under `train.optimizer:`",
    ),
    Case(
        "eps under train",
        GOOD_MODEL + "train:\n  eps: 1.0e-8\n",
        8,
        "train.eps",
        "unknown field 'eps'",
        "'eps' belongs under `train.optimizer:`",
    ),
    Case(
        "a model field under train",
        GOOD_MODEL + "train:\n  d_model: 64\n",
        8,
        "train.d_model",
        "unknown field",
        "'d_model' belongs under `model:`",
    ),
    Case(
        "tokenizer at the top level",
        GOOD_MODEL + "tokenizer: char\n",
        7,
        "tokenizer",
        "unknown field",
        "'tokenizer' belongs under `data:`",
    ),
    Case(
        "labels at the top level",
        ENCODER + "task: {type: classification}\nlabels: [a, b]\n",
        9,
        "labels",
        "unknown field",
        "belongs under `task:`",  # (the types holding it: tests/test_task_seam.py registers another)
    ),
    Case(
        "vocab_size under data",
        GOOD_MODEL + "data:\n  path: x.txt\n  vocab_size: 8000\n",
        9,
        "data.vocab_size",
        "unknown field",
        "belongs under `data.tokenizer:` (type 'bpe' or 'wordpiece')",
    ),
    Case(
        "a field of another variant",
        GOOD_MODEL + "  positional: {type: learned, theta: 10}\n",
        7,
        "model.positional.theta",
        "unknown field 'theta'",
        "'theta' is a field of type 'rope'",
    ),
    Case(
        "another tool's field name",
        GOOD_MODEL + "train:\n  optimizer: {learning_rate: 1.0e-3}\n",
        8,
        "train.optimizer.learning_rate",
        "unknown field",
        "did you mean 'lr'?",
    ),
    Case(
        "another tool's field name, elsewhere",
        GOOD_MODEL + "train:\n  warmup: 10\n",
        8,
        "train.warmup",
        "unknown field",
        "did you mean 'warmup_steps'? it belongs under `train.schedule:`",
    ),
    # a choice in another case, or under another name
    Case(
        "choice in another case",
        GOOD_MODEL + "  activation: SwiGLU\n",
        7,
        "model.activation",
        "unknown value 'SwiGLU'",
        "did you mean 'swiglu'?",
    ),
    Case(
        "norm in another case",
        GOOD_MODEL + "  norm: {type: RMSNorm}\n",
        7,
        "model.norm.type",
        "unknown value 'RMSNorm'",
        "did you mean 'rmsnorm'?",
    ),
    Case(
        "variant in another case",
        GOOD_MODEL + "  positional: RoPE\n",
        7,
        "model.positional",
        "unknown type 'RoPE'",
        "did you mean 'rope'?",
    ),
    Case(
        "AdamW",
        GOOD_MODEL + "train:\n  optimizer: {type: AdamW}\n",
        8,
        "train.optimizer.type",
        "unknown value 'AdamW'",
        "did you mean 'adamw'?",
    ),
    Case(
        "family in another case",
        GOOD_MODEL + "  family: Decoder\n",
        7,
        "model.family",
        "unknown family 'Decoder'",
        "did you mean 'decoder'?",
    ),
    Case(
        "preset in another case",
        "preset: GPT2\n",
        1,
        "preset",
        "unknown preset 'GPT2'",
        "did you mean 'gpt2'?",
    ),
    Case(
        "gpu for cuda",
        GOOD_MODEL + "train: {device: gpu}\n",
        7,
        "train.device",
        "unknown value 'gpu'",
        "did you mean 'cuda'?",
    ),
    Case(
        "swish for silu",
        GOOD_MODEL + "  activation: swish\n",
        7,
        "model.activation",
        "'swish'",
        "did you mean 'silu'?",
    ),
    Case(
        "the choices as the README lists them",
        GOOD_MODEL + "  activation: relu | gelu\n",
        7,
        "model.activation",
        "unknown value 'relu | gelu'",
        "choose one: 'relu' or 'gelu'",
    ),
    Case("a preset as a list", "preset: [llama]\n", 1, "preset", "unknown preset", "`preset: llama`"),
    # a number written another way
    Case(
        "steps in YAML 1.1's text form",
        GOOD_MODEL + "train: {steps: 1e4}\n",
        7,
        "train.steps",
        "expected a valid integer, found '1e4'",
        "write 10000: YAML 1.1 reads 1e4 as text",
    ),
    Case(
        "a whole number with a point",
        GOOD_MODEL + "train: {batch_size: 32.0}\n",
        7,
        "train.batch_size",
        "found 32.0",
        "write 32",
    ),
    Case(
        "a quoted number",
        GOOD_MODEL.replace("d_model: 64", 'd_model: "64"'),
        3,
        "model.d_model",
        "found '64'",
        "write 64 without quotes",
    ),
    Case(
        "thousands separators",
        GOOD_MODEL + "train:\n  steps: 10,000\n",
        8,
        "train.steps",
        "found '10,000'",
        "write 10000",
    ),
    Case(
        "a percentage",
        GOOD_MODEL + "  dropout: {residual: 10%}\n",
        7,
        "model.dropout.residual",
        "found '10%'",
        "write 0.1",
    ),
    Case(
        "None for null",
        GOOD_MODEL + "train:\n  grad_clip: None\n",
        8,
        "train.grad_clip",
        "found 'None'",
        "write null",
    ),
    Case(
        "a list written as text",
        GOOD_MODEL + "train:\n  optimizer: {betas: '0.9, 0.95'}\n",
        8,
        "train.optimizer.betas",
        "expected a valid tuple",
        "write a list: [0.9, 0.95]",
    ),
    Case(
        "a boolean written as a word",
        GOOD_MODEL + "train:\n  compile: auto\n",
        8,
        "train.compile",
        "valid boolean",
        "write true or false, or null for the default",
    ),
    # a section written as a scalar, a list or nothing
    Case(
        "a norm written as its type",
        GOOD_MODEL + "  norm: rmsnorm\n",
        7,
        "model.norm",
        "expected a mapping of fields, found 'rmsnorm'",
        "write `norm: {type: rmsnorm}`",
    ),
    Case(
        "a dropout written as one rate",
        GOOD_MODEL + "  dropout: 0.1\n",
        7,
        "model.dropout",
        "expected a mapping of fields",
        "`dropout: {embedding: 0.1, attention: 0.1, residual: 0.1",
    ),
    Case(
        "a section written as a list",
        GOOD_MODEL + "  norm:\n    - type: rmsnorm\n    - eps: 1.0e-6\n",
        8,
        "model.norm",
        "expected a mapping of fields",
        "without `- `",
    ),
    Case(
        "an empty section",
        GOOD_MODEL + "train:\n",
        7,
        "train",
        "expected a mapping of fields, found nothing",
        "indent the section's fields under `train:`",
    ),
    # YAML slips: at the line to fix, with the fix
    Case(
        "no space after a colon",
        GOOD_MODEL.replace("d_model: 64", "d_model:64"),
        3,
        "",
        "invalid YAML",
        "put a space after the colon",
    ),
    Case(
        "key = value",
        GOOD_MODEL.replace("d_model: 64", "d_model = 64"),
        3,
        "",
        "invalid YAML",
        "write `key: value`",
    ),
    Case(
        "an unquoted colon in a value",
        GOOD_MODEL + "train:\n  name: run: first\n",
        8,
        "",
        "invalid YAML",
        'quote the value: `name: "run: first"`',
    ),
    Case(
        "fields under a value",
        GOOD_MODEL + "data:\n  path: x.txt\n  tokenizer: bpe\n    vocab_size: 80\n",
        10,
        "",
        "invalid YAML",
        "write `tokenizer:` alone with its fields indented below",
    ),
    Case(
        "a field indented less",
        GOOD_MODEL.replace("  d_model: 64", " d_model: 64"),
        3,
        "",
        "invalid YAML",
        "line 2 has 2 spaces, this line 1",
    ),
    Case(
        "an unclosed brace",
        GOOD_MODEL + "  norm: {type: rmsnorm\ntrain: {}\n",
        8,
        "",
        "invalid YAML",
        "close the `{` opened on line 7",
    ),
    # a task for another family is one mistake, not one per rule it breaks
    Case(
        "a ViT without a task",
        VIT + "data: {builtin: digits, test_fraction: 0.2}\n",
        None,
        "task.type",
        "task 'causal_lm' needs a model of family 'decoder', found 'vit'",
        "'image_classification'",
    ),
    Case(
        "a preset of another family",
        "preset: bert\nmodel: {family: decoder, d_model: 64}\n",
        2,
        "model.family",
        "preset 'bert' is a model of family 'encoder'",
        "leave model.family out",
    ),
]


@pytest.mark.parametrize("case", CASES + HINTED, ids=lambda c: c.name)
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


def test_a_default_the_file_does_not_set_is_named_by_its_whole_path() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(VIT + "data: {builtin: digits}\n", source="bad.yaml")
    (issue,) = info.value.issues
    assert issue.note is not None and "set `task.type` in the spec" in issue.note


def test_an_override_of_a_section_the_file_lacks_is_reported_at_the_argument() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(GOOD_MODEL, overrides=["trian.steps=10"])
    (issue,) = info.value.issues
    assert issue.path == "trian" and issue.origin == "--set trian.steps=10" and issue.note is None
    assert issue.hint == "did you mean 'train'?"


def test_a_number_in_a_set_value_gets_the_hint_too() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(GOOD_MODEL, overrides=["train.steps=1e3"])
    (issue,) = info.value.issues
    assert issue.origin == "--set train.steps=1e3" and issue.hint is not None and "write 1000" in issue.hint


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
    choices = (
        "'relu', 'relu2', 'gelu', 'gelu_tanh', 'silu', 'swiglu', 'swiglu_clamped', 'geglu', 'geglu_tanh'"
    )
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


def test_the_schema_is_walked_once_however_many_keys_are_unknown() -> None:
    """Each unknown key walked the whole schema twice for its hint (11 ms a walk): 2,000 unknown
    keys took 13 s to report, 9,000 minutes."""
    from tfcompile.spec import loader

    loader._homes.cache_clear()
    text = MODEL_YAML + "".join(f"  unknown_{i}: {i}\n" for i in range(50))
    with pytest.raises(SpecError) as e:
        parse_spec(text, "many.yaml")
    assert len(e.value.issues) == 50 and loader._homes.cache_info().misses == 1
