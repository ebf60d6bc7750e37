"""A second review of bad specs: each test holds a class of mistakes to a located, bounded message."""

from __future__ import annotations

import pytest
from helpers import MODEL_YAML

from tfcompile.spec import SpecError, parse_spec


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.yaml")
    return caught.value


@pytest.mark.parametrize(
    "value",
    [
        "9" * 5000,  # past Python's digits for an int
        "x" * 5000,  # a value that is no choice
    ],
)
def test_a_long_value_gives_a_short_message_and_source_line(value: str) -> None:
    error = error_of(MODEL_YAML + f"  activation: {value}\n")
    rendered = str(error)
    assert max(len(line) for line in rendered.splitlines()) < 400
    assert error.issues[0].line == 7
    assert error.issues[0].path == "model.activation"


def test_the_caret_stays_under_a_value_far_along_a_long_line() -> None:
    padding = ", ".join(f"k{i}: 1" for i in range(100))
    error = error_of(MODEL_YAML + f"  dropout: {{{padding}, residual: 1.5}}\n")
    issue = next(i for i in error.issues if i.path == "model.dropout.residual")
    block = str(error).split("error: model.dropout.residual")[1].splitlines()
    source, caret = block[1], block[2]
    assert len(source) < 200
    assert source[caret.index("^") : caret.index("^") + 3] == "1.5"
    assert issue.column is not None and issue.column > 200  # the issue keeps the file's own column


@pytest.mark.parametrize("text", ["null", "~", ""])
def test_an_empty_or_null_value_is_called_nothing_not_python_none(text: str) -> None:
    error = error_of(MODEL_YAML.replace("d_model: 64", f"d_model: {text}"))
    assert error.issues[0].message == "expected a valid integer, found nothing"


def test_a_date_is_shown_as_written() -> None:
    error = error_of(MODEL_YAML + "  activation: 2024-01-02\n")
    assert "unknown value 2024-01-02:" in error.issues[0].message


@pytest.mark.parametrize("tag", ["!!python/object:os.system", "!!binary", "!custom"])
def test_a_tag_on_a_scalar_is_refused_at_its_field_with_the_fix(tag: str) -> None:
    error = error_of(MODEL_YAML + f"  activation: {tag} cmVsdQ==\n")
    issue = error.issues[0]
    assert (issue.line, issue.column, issue.path) == (7, 15, "model.activation")
    assert issue.message.startswith("unknown YAML tag")
    assert issue.hint == "remove the tag: a spec needs none"


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_quote_never_closed_is_reported_where_it_opens(quote: str) -> None:
    error = error_of(MODEL_YAML.replace("d_model: 64", f"d_model: {quote}64") + "data: {path: x.txt}\n")
    issue = error.issues[0]
    assert (issue.line, issue.column) == (3, 12)
    assert issue.message == "invalid YAML: this quote is never closed"
    assert issue.hint == f"end the value with the {quote} that starts it on line 3"


def test_a_path_of_another_type_is_named_in_a_spec_s_words_not_python_s() -> None:
    message = error_of(MODEL_YAML + "data: {path: [a, b]}\n").issues[0].message
    assert message == "expected a path (text), found ['a', 'b']"  # not "<class 'pathlib.Path'>"


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("  family: null\n", "model.family", "no family given: expected one of 'decoder', 'encoder'"),
        (
            "  positional: {type: null}\n",
            "model.positional.type",
            "no type given: expected one of 'sinusoidal'",
        ),
        ("  activation: null\n", "model.activation", "no value given: expected one of 'relu'"),
        ("  family: 3\n", "model.family", "unknown family 3: expected"),
    ],
)
def test_a_null_or_number_choice_is_reported_at_it_as_written(line: str, path: str, message: str) -> None:
    issue = error_of(MODEL_YAML + line).issues[0]
    assert (issue.line, issue.path) == (7, path)
    assert issue.message.startswith(message)


@pytest.mark.parametrize("digits", [101, 5000])
def test_a_number_of_many_digits_is_refused_in_a_spec_s_words(digits: int) -> None:
    error = error_of(MODEL_YAML.replace("d_model: 64", f"d_model: {'9' * digits}"))
    assert error.issues[0].path == "model.d_model"
    assert error.issues[0].message == f"a number of {digits:,} digits is past any value a spec takes"


def test_a_number_of_a_hundred_digits_meets_its_field_s_bound() -> None:
    error = error_of(MODEL_YAML.replace("d_model: 64", f"d_model: {'9' * 100}"))
    assert "at most 65,536" in str(error)


def test_a_list_too_long_says_how_many_items_it_may_hold() -> None:
    error = error_of(MODEL_YAML + "train:\n  optimizer: {betas: [0.9, 0.9, 0.9]}\n")
    assert error.issues[0].message == "expected at most 2 items, found [0.9, 0.9, 0.9]"


def test_a_byte_level_bpe_smaller_than_its_bytes_is_refused_at_its_vocab_size() -> None:
    """The trainer begins with the 256 bytes: a smaller vocab_size silently gave 256 and more."""
    text = MODEL_YAML + "data:\n  path: x.txt\n  tokenizer: {type: bpe, vocab_size: 100}\n"
    issue = error_of(text).issues[0]
    assert issue.path == "data.tokenizer.vocab_size"
    assert "must be at least 256, found 100" in issue.message
    parse_spec(text.replace("vocab_size: 100", "vocab_size: 256"), "s.yaml")


@pytest.mark.parametrize(
    ("family", "task", "reserved"),
    [
        ("decoder", "{type: causal_lm}", 3),
        ("encoder", "{type: masked_lm}", 5),
        ("encoder", "{type: classification, labels: [a, b]}", 5),
        ("encoder_decoder", "{type: seq2seq}", 4),
    ],
)
def test_a_vocabulary_of_only_the_task_s_special_tokens_is_refused(
    family: str, task: str, reserved: int
) -> None:
    """An encoder-decoder of vocab_size 3 validated, and its export failed with pydantic's own
    ValidationError ('translation.stop_id is 3, outside the vocabulary of 3')."""
    model = MODEL_YAML.replace("model:\n", f"model:\n  family: {family}\n")
    spec = model.replace("vocab_size: 65", "vocab_size: VOCAB") + f"task: {task}\n"
    issue = error_of(spec.replace("VOCAB", str(reserved))).issues[0]
    assert issue.path == "model.vocab_size"
    assert f"begins with {reserved} special tokens" in issue.message
    parse_spec(spec.replace("VOCAB", str(reserved + 1)), "s.yaml")


@pytest.mark.parametrize(("text", "what"), [("=", "'value' key"), ("<<", "merge key")])
def test_an_unquoted_yaml_key_symbol_as_a_value_gets_the_quote(text: str, what: str) -> None:
    """`path: =` said 'unknown YAML tag' and 'remove the tag', though no tag was written."""
    issue = error_of(MODEL_YAML + f"data:\n  path: {text}\n").issues[0]
    assert issue.path == "data.path"
    assert issue.message == f"an unquoted {text} is YAML 1.1's {what}, not a value"
    assert issue.hint == f"quote it: '{text}'"
