"""Bad input, from the reviewer's list: damaged data files, paths that are not regular files,
unbounded numbers, YAML 1.1 readings and malformed sections. Each gives a located spec error
(exit 2) or one line `tfcompile CMD: error: ...`, naming the file, the line or field and the fix."""

from __future__ import annotations

import csv
import functools
import gzip
import os
import threading
from pathlib import Path

import pytest
from helpers import MODEL_YAML

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.data.corpus import read_documents
from tfcompile.data.images import read_image_folder
from tfcompile.data.table import read_table
from tfcompile.paths import Kind, kind_of
from tfcompile.spec import SpecError, load_spec, parse_spec
from tfcompile.spec.schema import DataSpec
from tfcompile.summary import summarize

MODEL = MODEL_YAML
ENCODER = "preset: bert\n" + MODEL


def _spec_error(text: str, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "s.yaml", overrides=overrides)
    return str(info.value)


def _validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    code = main(["validate", str(spec), *args])
    return code, capsys.readouterr().err


def _table_error(path: Path) -> str:
    with pytest.raises(DataError) as info:
        read_table(path, "sentence", None, "label")
    return str(info.value)


# ----------------------------------------------------------------- 1. damaged data files


def test_a_table_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_bytes(b"sentence\tlabel\nfine\t1\nbad \xff\t0\n")
    assert _table_error(table) == f"{table}, line 3: byte 0xff is not UTF-8 text: save the file as UTF-8"


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda data: b"plain text, not gzip", "not a gzip file, though its name ends in .gz"),
        (lambda data: data[:30], "the gzip data ends too early (a copy cut short?): copy it again"),
        (lambda data: data[:-8] + b"\0" * 8, "the gzip data is damaged (CRC check failed): copy it again"),
    ],
)
def test_a_damaged_gzip_table_says_what_is_wrong(tmp_path: Path, damage, expected: str) -> None:
    table = tmp_path / "t.tsv.gz"
    table.write_bytes(damage(gzip.compress(b"sentence\tlabel\n" + b"a fine film\t1\n" * 50)))
    assert _table_error(table).startswith(f"{table}: {expected}")


def test_a_broken_jsonl_line_names_its_line_and_the_form_expected(tmp_path: Path) -> None:
    table = tmp_path / "t.jsonl"
    table.write_text('{"sentence": "a", "label": "1"}\n\n{"sentence": "b", label: 0}\n')
    message = _table_error(table)
    assert message.startswith(f"{table}, line 3: not JSON (Expecting property name")
    assert 'each line of a .jsonl file is one object, such as {"sentence"' in message
    table.write_text('{"sentence": "a", "label": "1"}\n[1, 2]\n')
    assert _table_error(table).startswith(f"{table}, line 2: expected a JSON object of columns")
    table.write_text('{"sentence": {"nested": 1}, "label": "1"}\n')
    assert (
        _table_error(table)
        == f"{table}, row 1: the 'sentence' cell holds a JSON object, expected text or a number"
    )


def test_a_csv_row_that_cannot_be_read_names_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the csv module refuses (its strict dialect here: a cell of any length is read)."""
    monkeypatch.setattr(csv, "reader", functools.partial(csv.reader, strict=True))
    table = tmp_path / "t.csv"
    table.write_text('sentence,label\nfine,1\n"quoted"not,0\n')
    assert _table_error(table).startswith(f"{table}, line 3: cannot read it as csv: ',' expected after")


def test_a_damaged_corpus_names_the_field_the_file_and_the_line(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"first line\nsecond \xfe line\n")
    with pytest.raises(DataError, match=rf"^data\.path: {corpus}, line 2: byte 0xfe is not UTF-8 text"):
        read_documents(DataSpec(path=corpus))
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(b"some text\n" * 100)[:25])
    with pytest.raises(DataError, match=rf"^data\.path: {packed}: the gzip data ends too early"):
        read_documents(DataSpec(path=packed))
    packed.write_bytes(gzip.compress(b"some text\n"))
    assert read_documents(DataSpec(path=packed)) == ["some text\n"]


def test_training_on_a_damaged_table_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.tsv.gz").write_bytes(b"not gzip")
    spec = tmp_path / "cls.yaml"
    spec.write_text(
        "model: {family: encoder, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16}\n"
        "data: {path: t.tsv.gz}\ntask: {type: classification}\ntrain: {steps: 1, device: cpu}\n"
    )
    assert main(["train", str(spec)]) == 1
    err = capsys.readouterr().err
    assert (
        err == f"tfcompile train: error: {tmp_path / 't.tsv.gz'}: not a gzip file, though its name ends in "
        ".gz: compress it with gzip, or remove .gz from its name if it is plain text\n"
    )


# ------------------------------------------------- 2. labels, and paths that are not files


def test_a_label_number_written_two_ways_is_named_with_its_row(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\ngood\t1\nbad\t0\nfine\t1.0\n")
    assert _table_error(table) == (
        f"{table}, row 3: the 'label' cell is '1.0', but row 1 writes the same number as '1': write every "
        f"label of a class the same way"
    )
    table.write_text("sentence\tlabel\ngood\t1.0\nbad\t0.0\n")  # one spelling each: fine
    assert read_table(table, "sentence", None, "label").labels == ["1.0", "0.0"]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_data_paths_that_are_not_regular_files_say_what_they_are(tmp_path: Path, fifo: Path) -> None:
    assert _table_error(Path("/dev/null")) == "/dev/null is a character device, not a regular file"
    assert _table_error(tmp_path) == f"{tmp_path} is a folder, not a regular file"
    table = fifo.rename(tmp_path / "pipe.tsv")
    assert _table_error(table) == f"{table} is a named pipe (FIFO), not a regular file"
    with pytest.raises(DataError, match=r"^data\.path: /dev/null is a character device, not a regular file$"):
        read_documents(DataSpec(path=Path("/dev/null")))
    with pytest.raises(DataError, match=r"^data\.path: a character device, not a folder, at /dev/null"):
        read_image_folder(Path("/dev/null"), 1, 8)
    (tmp_path / "images" / "cat").mkdir(parents=True)
    os.mkfifo(tmp_path / "images" / "cat" / "x.png")
    with pytest.raises(DataError, match=r"x\.png is a named pipe \(FIFO\), not a regular file"):
        read_image_folder(tmp_path / "images", 1, 8)


def test_a_spec_that_is_a_device_says_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/dev/null"]) == 1
    assert (
        "tfcompile validate: error: /dev/null is a character device, not a regular file, but `validate` "
        "takes a spec" in capsys.readouterr().err
    )
    with pytest.raises(SpecError, match="cannot read the spec: it is a character device, not a regular file"):
        load_spec("/dev/null")


# --------------------------------------------------------------------- 3. a FIFO as the spec


def test_a_fifo_given_as_the_spec_is_refused_without_opening_it(
    fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(["validate", str(fifo)])), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # blocked opening the FIFO: a writer lets it go before the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert codes == [1], "validate blocked on the FIFO"
    assert f"{fifo} is a named pipe (FIFO), not a regular file" in capsys.readouterr().err
    assert kind_of(fifo) is Kind.FILE


# ------------------------------------------------------------------- 4. unbounded numbers


def test_seeds_are_bounded_to_what_torch_and_numpy_take() -> None:
    message = _spec_error(MODEL, "train.seed=9223372036854775808")
    assert "train.seed: must be at most 9,223,372,036,854,775,807, found 9,223,372,036,854,775,808" in message
    assert "hint: a seed is a signed 64-bit integer: below 2^63" in message
    assert "train.eval_seed: expected greater than or equal to 0, found -1" in _spec_error(
        MODEL, "train.eval_seed=-1"
    )
    assert parse_spec(MODEL, overrides=["train.seed=9223372036854775807"]).train.eval_seed == 2**63 - 1


def test_steps_are_bounded_where_a_run_would_never_end() -> None:
    """10^20 steps trained, estimating "about 2680294449483615 h 0 min"."""
    message = _spec_error(MODEL, "train.steps=100000000000000000000")
    assert "train.steps: must be at most 1,000,000,000, found 100,000,000,000,000,000,000" in message
    assert parse_spec(MODEL, overrides=["train.steps=1000000000"]).train.steps == 10**9


def test_a_duration_of_many_hours_has_its_thousands_separated() -> None:
    from tfcompile.console import duration

    assert duration(3600 * 12_345 + 60) == "about 12,345 h 1 min"


def test_threads_are_bounded_whatever_the_machine() -> None:
    message = _spec_error(MODEL + "train:\n  threads: 100000\n")
    assert "s.yaml:8:12: error: train.threads: must be at most 1,024, found 100,000" in message
    assert "a spec is valid on every one" in message


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["serve", "b", "--port", "99999"],
            "argument --port: expected a TCP port from 0 to 65535, found 99999",
        ),
        (["sample", "r", "--temperature", "nan"], "argument --temperature: expected a finite number >= 0"),
        (["generate", "b", "--temperature", "inf"], "argument --temperature: expected a finite number >= 0"),
        (["generate", "b", "--min-p", "1.5"], "argument --min-p: expected a number in [0, 1], found 1.5"),
        (["sample", "r", "--min-p", "nan"], "argument --min-p: expected a number in [0, 1], found nan"),
        (["serve", "b", "--max-wait-ms", "inf"], "argument --max-wait-ms: expected milliseconds"),
        (["sample", "r", "--seed", "-5"], "argument --seed: expected a seed from 0 to 2^63 - 1, found -5"),
        (["export", "r", "--seed", str(2**64)], "argument --seed: expected a seed from 0 to 2^63 - 1"),
        (["serve", "b", "--threads", "100000"], "argument --threads: expected threads from 1 to 1,024"),
        (  # refused late, with exit 1, by the runtime
            ["translate", "b", "x", "--length-penalty", "nan"],
            "argument --length-penalty: expected a length penalty from -10 to 10, found nan",
        ),
    ],
)
def test_command_line_numbers_have_the_runtime_bounds(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "found"),
    [("", "expected a key, found an empty one"), ("cl\u00e9 1", "expected visible ASCII without spaces")],
)
def test_an_api_key_no_client_could_send_is_refused(
    given: str, found: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty key served without one; a non-ASCII key could never match a header."""
    for argv, env in ((["serve", "b", "--api-key", given], None), (["serve", "b"], given)):
        if env is None:
            monkeypatch.delenv("TFCOMPILE_API_KEY", raising=False)
        else:
            monkeypatch.setenv("TFCOMPILE_API_KEY", env)
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --api-key: {found}" in err and "TFCOMPILE_API_KEY" in err  # whence the key came


# ------------------------------------------------------------------------ 5. model sizes


def test_a_huge_context_is_a_located_spec_error_not_an_overflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(MODEL.replace("max_seq_len: 32", "max_seq_len: 4000000000"))
    assert main(["summary", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:6:16: error: model.max_seq_len: must be at most 1,073,741,824, found 4,000,000,000" in err
    assert "hint: the T x T attention scores of a longer sequence overflow 64-bit sizes" in err
    spec.write_text(MODEL.replace("max_seq_len: 32", "max_seq_len: 1000000000"))  # within it, for 4 heads
    assert main(["summary", str(spec)]) == 2
    err = capsys.readouterr().err
    assert (
        f"{spec}:6:16: error: model.max_seq_len: one sequence's attention (4 heads x 1,000,000,000 x "
        "1,000,000,000 positions) takes more bytes than a 64-bit size counts" in err
    )
    assert "hint: use a sequence of at most 759,250,124, or fewer heads" in err


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [("n_layers", 1_000_000, "1,024"), ("d_model", 1 << 20, "65,536"), ("n_heads", 4096, "1,024")],
)
def test_model_sizes_are_bounded(field: str, value: int, bound: str) -> None:
    message = _spec_error(MODEL, f"model.{field}={value}")
    assert f"model.{field}: must be at most {bound}, found {value:,}" in message
    assert "far past any model trained today" in message


def test_the_summary_shows_every_block_through_the_first() -> None:
    spec = parse_spec(MODEL, overrides=["model.n_layers=6", "model.dropout.path=0.1"])
    rows = {row.name: row.output_shape for row in summarize(spec).rows}
    assert rows["blocks.5.drop"] == rows["blocks.1.drop"] == (1, 32, 64)
    assert rows["blocks.5.ffn"] == rows["blocks.0.ffn"] == (1, 32, 64)
    assert all(shape is not None for name, shape in rows.items() if name.startswith("blocks."))


# ---------------------------------------------------------------------------- 6. YAML 1.1


@pytest.mark.parametrize(
    ("value", "message", "hint"),
    [
        (
            "010",
            "YAML 1.1 reads 010 as the octal number 8",
            "write 10 if you mean 10, 8 if you mean octal 010",
        ),
        ("1:30", "YAML 1.1 reads 1:30 as the base-60 number 90", "write 90 if you mean that number"),
    ],
)
def test_yaml_11_numbers_that_would_pass_silently_are_refused(value: str, message: str, hint: str) -> None:
    error = _spec_error(MODEL + f"train:\n  steps: {value}\n")
    assert f"s.yaml:8:10: error: train.steps: {message}" in error
    assert f"hint: {hint}" in error and f"or quote it ('{value}') for text" in error
    assert f"--set train.steps={value}: error: train.steps: {message}" in _spec_error(
        MODEL, f"train.steps={value}"
    )
    assert parse_spec(MODEL + "train:\n  steps: 007\n").train.steps == 7  # the same number either way


@pytest.mark.parametrize(
    ("text", "where", "hint"),
    [
        (
            ENCODER + "task:\n  type: classification\n  labels: [yes, no]\n",
            "10:12: error: task.labels.0",
            "quote it: 'yes' (unquoted, YAML 1.1 reads it as the boolean true)",
        ),
        (
            "model: {family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2,\n"
            "  max_seq_len: 8}\ntask:\n  type: seq2seq\n  source: no\n",
            "5:11: error: task.source",
            "quote it: 'no' (unquoted, YAML 1.1 reads it as the boolean false)",
        ),
        (
            MODEL + "train:\n  name: 2024-01-02\n",
            "8:9: error: train.name",
            "quote it: '2024-01-02' (unquoted, YAML 1.1 reads it as a date)",
        ),
        (
            MODEL + "yes: 1\n",
            "7:1: error: a key must be a field name, found true",
            "quote it: 'yes' (unquoted, YAML 1.1 reads it as the boolean true)",
        ),
    ],
)
def test_a_value_yaml_11_reads_as_no_text_gets_a_hint_to_quote_it(text: str, where: str, hint: str) -> None:
    error = _spec_error(text)
    assert f"s.yaml:{where}" in error
    assert f"hint: {hint}" in error


def test_an_override_yaml_11_reads_as_no_text_gets_the_hint_too() -> None:
    error = _spec_error(MODEL, "train.name=no")
    assert "--set train.name=no: error: train.name: expected a valid string, found false" in error
    assert "hint: quote it: 'no'" in error


def test_merge_keys_and_tabs_get_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _validate(tmp_path, "sizes: &sizes\n  d_model: 64\nmodel:\n  <<: *sizes\n", capsys)
    assert code == 2
    assert "s.yaml:4:3: error: merge keys (`<<:`) are not read in a spec" in err
    assert "hint: write the fields out, or reuse a whole section with an alias (`model: *name`)" in err
    code, err = _validate(tmp_path, MODEL + "train:\n\tsteps: 10\n", capsys)
    assert code == 2 and "s.yaml:8:1: error: invalid YAML" in err
    assert "hint: indent with spaces: YAML does not allow tabs in indentation" in err


def test_a_second_yaml_document_says_a_spec_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PyYAML's "but found another document" was the whole message."""
    code, err = _validate(tmp_path, MODEL + "---\ntrain:\n  steps: 10\n", capsys)
    assert code == 2 and "s.yaml:7:1: error: invalid YAML: a second YAML document starts here" in err
    assert "hint: a spec is one YAML document, one mapping of its sections: remove the `---` on line 7" in err
    code, err = _validate(tmp_path, MODEL + "...\ntrain:\n  steps: 10\n", capsys)
    assert code == 2 and "remove the `...` on line 7, which ends the first" in err


# --------------------------------------------------------------- 7. a model that is no mapping


@pytest.mark.parametrize(
    ("value", "found"), [("3", "3"), ("", "nothing"), ("[1, 2]", "[1, 2]"), ("null", "nothing")]
)
def test_a_model_that_is_not_a_mapping_says_what_it_should_be(value: str, found: str) -> None:
    error = _spec_error(f"model: {value}\n")
    assert (
        "error: model: expected a mapping with `family:` ('decoder', 'encoder', 'encoder_decoder', 'vit') "
        f"and the section's fields, found {found}" in error
    )
    assert "hint: write the fields indented under `model:`, one a line, e.g. `family: decoder`" in error


# ------------------------------------------------------------------------------ 8. minor


def test_an_empty_override_value_shows_the_syntax() -> None:
    error = _spec_error(MODEL, "model.d_model=")
    assert "--set model.d_model=: error: model.d_model: the value after '=' is empty" in error
    assert "hint: write FIELD=VALUE, e.g. --set model.d_model=VALUE" in error


def test_a_spec_named_txt_is_told_to_be_renamed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.txt"
    spec.write_text(MODEL)
    assert main(["validate", str(spec)]) == 1
    assert (
        f"a spec or study is recognised by its name, which ends in .yaml or .yml, not '.txt': rename it "
        f"{tmp_path / 's.yaml'}" in capsys.readouterr().err
    )


def test_a_vocab_multiple_too_large_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _validate(tmp_path, MODEL + "  vocab_multiple_of: 100000000000\n", capsys)
    assert code == 2
    assert "s.yaml:7:22: error: model.vocab_multiple_of: must be at most 4,096, found 100,000,000,000" in err


# ------------------------------------------------- the readers the tasks own, and study seeds


def test_a_label_outside_task_labels_names_its_row_and_value(tmp_path: Path) -> None:
    from tfcompile.tasks.classification import check_label_values

    table = tmp_path / "t.tsv"
    check_label_values(["negative", "positive"], ["0", "1", "1"], table)  # indices into the names
    check_label_values(["negative", "positive"], ["negative", "positive"], table)
    with pytest.raises(DataError, match=r"t.tsv, row 3: the label '-1' is not a class index from 0 to 1"):
        check_label_values(["negative", "positive"], ["0", "1", "-1"], table)
    with pytest.raises(DataError, match=r"row 2: the label 'neutral' is not one of task.labels"):
        check_label_values(["negative", "positive"], ["negative", "neutral"], table)


@pytest.mark.parametrize(
    ("german", "expected"),
    [
        (gzip.compress(b"\xff\xfe not text\n", mtime=0), "not UTF-8 text"),
        (b"plain text, not gzip\n", "not a gzip file"),
        (gzip.compress(b"Ein Satz.\n" * 100, mtime=0)[:-10], "ends too early"),
    ],
    ids=["not UTF-8", "not gzip", "truncated"],  # the same on every xdist worker: no time stamp
)
def test_damaged_translation_data_is_a_data_error(tmp_path: Path, german: bytes, expected: str) -> None:
    from tfcompile.tasks.seq2seq import read_parallel

    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"A sentence.\n" * 100))
    (tmp_path / "train.de.gz").write_bytes(german)
    with pytest.raises(DataError, match=expected):
        read_parallel(tmp_path / "train.{lang}.gz", "de", "en")


def test_study_seeds_are_bounded_where_they_are_written(tmp_path: Path) -> None:
    from tfcompile.study.schema import load_study

    study = tmp_path / "s.yaml"
    study.write_text(
        "base: ../specs/quickstart.yaml\nseeds: [1, 18446744073709551616]\nbudget: {steps: 10}\n"
    )
    with pytest.raises(SpecError, match=r"s.yaml:2:.*seeds.1: must be at most 9,223,372,036,854,775,807"):
        load_study(study)


@pytest.mark.parametrize(
    ("task", "data"),
    [
        ("", "  val_path: v.txt\n"),  # causal_lm validates on the end of data.path
        ("", "  test_path: t.txt\n"),
        ("task: {type: masked_lm}\n", "  test_fraction: 0.1\n"),
        ("task: {type: classification}\n", "  test_path: t.tsv\n"),
    ],
)
def test_a_data_field_the_task_would_ignore_is_refused(task: str, data: str) -> None:
    family = "preset: bert\n" if task else ""
    field = data.split(":")[0].strip()
    message = _spec_error(family + MODEL + task + "data:\n  path: x.txt\n" + data)
    assert (
        f"data.{field}: task '" in message and f"does not read data.{field}: it would be ignored" in message
    )
    assert f"hint: leave data.{field} out; the tasks that read it:" in message
