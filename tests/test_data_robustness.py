"""Hostile and malformed data files end in a DataError (or the runtime's InputError) that names the
file and, where it can, the line: never a library's exception, a hang, a silent wrong result or
memory the machine does not have. The loaders are the ones training calls."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tfcompile.data import DataError, corpus, encode, train_tokenizer
from tfcompile.data.corpus import read_documents, read_text
from tfcompile.data.images import read_image_folder
from tfcompile.data.table import read_table
from tfcompile.errors import DataWarning, InputError
from tfcompile.images import read_image
from tfcompile.sequences import SPECIAL_TOKENS
from tfcompile.spec.schema import BpeTokenizer, CharTokenizer, DataSpec, WordPieceTokenizer

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ROWS = b"sentence\tlabel\na fine film\t1\na dull one\t0\n"


def _rows(path: Path, pair: str | None = None) -> list[tuple[str, ...]]:
    table = read_table(path, "sentence", pair, "label")
    return list(zip(table.texts, *([table.pairs] if table.pairs else []), table.labels, strict=True))


def _error(path: Path) -> str:
    with pytest.raises(DataError) as info:
        read_table(path, "sentence", None, "label")
    return str(info.value)


# ----------------------------------------------------------------- encodings and bytes


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path, suffix: str) -> None:
    """Excel and Notepad write UTF-8 with a BOM: the header's first name was '\\ufeffsentence'."""
    rows = [("a fine film", "1"), ("a dull one", "0")]
    text = {
        ".tsv": "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows),
        ".csv": "sentence,label\r\n" + "".join(f"{s},{label}\r\n" for s, label in rows),
        ".jsonl": "".join(json.dumps({"sentence": s, "label": label}) + "\n" for s, label in rows),
    }[suffix]
    path = tmp_path / f"t{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert _rows(path) == rows


def test_a_corpus_drops_each_files_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfFirst.\n")
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfSecond.\n")
    assert read_documents(DataSpec(path=tmp_path)) == ["First.\n", "Second.\n"]


def test_nul_bytes_are_refused_naming_the_line(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_bytes(b"sentence\tlabel\nfine\t1\nba\x00d\t0\n")
    assert _error(table).startswith(f"{table}, line 3: a NUL byte (0x00), which text never holds")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_are_named_as_such(tmp_path: Path, encoding: str) -> None:
    """Without a BOM, UTF-16 of ASCII text is valid UTF-8 with a NUL after every character: it was
    read as such, and its header's names did not match."""
    table = tmp_path / "t.tsv"
    table.write_bytes(ROWS.decode().encode(encoding))
    message = _error(table)
    assert message.startswith(f"{table}, line 1: ")
    assert "UTF-16 or UTF-32" in message and "save the file as UTF-8" in message


@pytest.mark.parametrize("name", ["t.tsv", "t.tsv.GZ", "t.TSV.gz"])
def test_gzip_data_is_read_whatever_the_case_of_its_name_or_a_missing_gz(tmp_path: Path, name: str) -> None:
    """Gzip data is never UTF-8 text (0x8b cannot start a character): it is recognised by its bytes."""
    path = tmp_path / name
    path.write_bytes(gzip.compress(ROWS))
    assert _rows(path) == [("a fine film", "1"), ("a dull one", "0")]


def _gzip_bomb(size_mb: int) -> bytes:
    """``size_mb`` MB of zeros in as many gzip members (valid gzip: the members are concatenated)."""
    return gzip.compress(bytes(1 << 20)) * size_mb


def test_a_gzip_bomb_is_refused_before_it_fills_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "physical_memory", lambda: 256 << 20)
    bomb = tmp_path / "corpus.txt.gz"
    bomb.write_bytes(_gzip_bomb(400))  # 400 KB that unpack to 400 MB
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as info:
            read_text(bomb, "data.path")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value).startswith(f"data.path: {bomb}: more than ")
    assert "once gunzipped" in str(info.value) and "256 MB" in str(info.value)
    assert peak < 64 << 20


def test_a_text_file_larger_than_memory_allows_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "physical_memory", lambda: 64 << 20)
    big = tmp_path / "corpus.txt"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GB on no disk
    with pytest.raises(DataError, match=r"^data\.path: .*corpus\.txt: 1,024 MB: this machine's 64 MB of"):
        read_text(big, "data.path")


# ----------------------------------------------------------------- tables


def test_a_row_with_more_fields_than_the_header_is_refused(tmp_path: Path) -> None:
    """A tab inside a TSV sentence split it, and the label became the sentence's second half."""
    table = tmp_path / "t.tsv"
    table.write_bytes(b"sentence\tlabel\nfine\t1\na sentence\twith a tab\t0\n")
    assert _error(table) == (
        f"{table}, line 3: 3 fields, but the header names 2: a tab inside a value splits it (a .tsv "
        f"file is not quoted): remove the tab"
    )
    quoted = tmp_path / "q.tsv"
    quoted.write_bytes(b'sentence\tlabel\n"quoted\ttab"\t1\n')
    assert "line 2: 3 fields" in _error(quoted)


def test_a_row_with_fewer_fields_than_the_header_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_bytes(b"id,sentence,label\n1,fine,1\n2,0\n")
    assert _error(table) == (
        f"{table}, line 3: 2 fields, but the header names 3: a value is missing, or a line break "
        f"inside one splits the row"
    )


def test_a_csv_line_number_counts_the_newlines_inside_quoted_values(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_bytes(b'sentence,label\n"two\nlines",1\nshort\n')
    assert _error(table).startswith(f"{table}, line 4: 1 fields")


def test_a_header_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_bytes(b"sentence\tlabel\tlabel\nfine\t1\t0\n")
    assert _error(table) == f"{table}: the header names the column 'label' twice: rename one"


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (b'{"sentence": "a", "label": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"sentence": "a", "label": 1' + b"0" * 5000 + b"}", "a number of more than 4,300 digits"),
    ],
)
def test_json_lines_python_cannot_hold_are_named(tmp_path: Path, line: bytes, found: str) -> None:
    table = tmp_path / "t.jsonl"
    table.write_bytes(b'{"sentence": "fine", "label": 1}\n' + line + b"\n")
    message = _error(table)
    assert message.startswith(f"{table}, line 2: not JSON") and found in message


# What csv.writer and json.dumps write and read back: any text a cell can hold.
cells = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20).filter(
    lambda s: s.strip() != ""
)
tsv_cells = cells.filter(lambda s: not set(s) & {"\t", "\n", "\r", "\x00"})


def _reference(rows: list[tuple[str, str, str]]) -> list[tuple[str, ...]]:
    return [tuple(cell.strip() for cell in row) for row in rows]


@PROPERTY
@given(st.lists(st.tuples(cells, cells, cells), min_size=1, max_size=8), st.booleans())
def test_a_csv_file_reads_the_rows_csv_writer_wrote(tmp_path: Path, rows: list, gzipped: bool) -> None:
    rows = [tuple(cell.replace("\x00", "") or "x" for cell in row) for row in rows]
    out = io.StringIO(newline="")
    csv.writer(out).writerows([("sentence", "pair", "label"), *rows])
    path = tmp_path / ("t.csv.gz" if gzipped else "t.csv")
    data = out.getvalue().encode()
    path.write_bytes(gzip.compress(data) if gzipped else data)
    assert _rows(path, "pair") == _reference(rows)


@PROPERTY
@given(st.lists(st.tuples(tsv_cells, tsv_cells, tsv_cells), min_size=1, max_size=8))
def test_a_tsv_file_reads_the_rows_split_on_tabs(tmp_path: Path, rows: list) -> None:
    """The reference: lines split on '\\n', cells on '\\t' (SST-2's own format: no quoting)."""
    path = tmp_path / "t.tsv"
    path.write_bytes(
        "".join("\t".join(row) + "\n" for row in [("sentence", "pair", "label"), *rows]).encode()
    )
    lines = path.read_bytes().decode().split("\n")[1:-1]
    assert _rows(path, "pair") == _reference([tuple(line.split("\t")) for line in lines])


@PROPERTY
@given(st.lists(st.tuples(cells, cells, cells), min_size=1, max_size=8))
def test_a_jsonl_file_reads_the_objects_json_dumps_wrote(tmp_path: Path, rows: list) -> None:
    path = tmp_path / "t.jsonl"
    names = ("sentence", "pair", "label")
    path.write_text("".join(json.dumps(dict(zip(names, row, strict=True))) + "\n" for row in rows))
    assert _rows(path, "pair") == _reference(rows)


# ----------------------------------------------------------------- text corpora


def test_a_corpus_folder_names_a_txt_entry_it_cannot_read(tmp_path: Path) -> None:
    """A broken link or a FIFO named .txt was skipped without a word: a document went missing."""
    (tmp_path / "a.txt").write_text("kept\n")
    (tmp_path / "b.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(DataError, match=r"^data\.path: no file at .*b\.txt$"):
        read_documents(DataSpec(path=tmp_path))
    (tmp_path / "b.txt").unlink()
    os.mkfifo(tmp_path / "c.txt")
    with pytest.raises(DataError, match=r"c\.txt is a named pipe \(FIFO\), not a regular file"):
        read_documents(DataSpec(path=tmp_path))


# ----------------------------------------------------------------- images


def _png(mode: str = "RGB", size: tuple[int, int] = (12, 10)) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail, rather than hang, a test whose read blocks."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the read blocked"))
    signal.alarm(10)
    yield
    signal.alarm(0)


def test_an_image_path_that_is_no_regular_file_is_refused_without_opening_it(
    tmp_path: Path, no_hang: None
) -> None:
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    with pytest.raises(
        InputError, match=r"^cannot read the image .*x\.png: it is a named pipe \(FIFO\), not a"
    ):
        read_image(fifo, 3)
    with pytest.raises(InputError, match=r"^cannot read the image .*: it is a folder, not a regular file$"):
        read_image(tmp_path, 3)
    with pytest.raises(InputError, match=r"^cannot read the image .*missing\.png: there is no such file$"):
        read_image(tmp_path / "missing.png", 3)


def test_a_damaged_png_chunk_is_an_input_error() -> None:
    """Pillow raises SyntaxError for a PNG chunk whose length is wrong."""
    out = io.BytesIO()
    Image.fromarray(np.arange(32 * 24 * 3, dtype=np.uint8).reshape(32, 24, 3)).save(out, "PNG")
    data = bytearray(out.getvalue())
    data[data.index(b"IDAT") - 1] ^= 0xFF  # the IDAT chunk's length
    with pytest.raises(InputError, match=r"^cannot read the uploaded image: "):
        read_image(bytes(data), 3)


def test_an_images_own_error_is_not_wrapped_twice() -> None:
    image = Image.new("F", (4, 4))
    out = io.BytesIO()
    image.save(out, "TIFF")
    with pytest.raises(InputError) as info:
        read_image(out.getvalue(), 1)
    assert str(info.value) == (
        "the uploaded image has 32-bit float samples; give it 8 (or 16) bits per sample"
    )


@PROPERTY
@given(st.sampled_from(["PNG", "GIF", "BMP", "TIFF", "WEBP", "JPEG"]), st.data())
def test_damaged_image_bytes_are_input_errors(fmt: str, data: st.DataObject) -> None:
    out = io.BytesIO()
    Image.fromarray(np.arange(16 * 12 * 3, dtype=np.uint8).reshape(16, 12, 3)).save(out, fmt)
    damaged = bytearray(out.getvalue())
    for _ in range(data.draw(st.integers(1, 6))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(damaged)))
    with contextlib.suppress(InputError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns of a truncated TIFF, then reads or refuses it
        read_image(bytes(damaged[:cut]), 3)


@pytest.mark.parametrize("mode", ["CMYK", "P", "PA", "RGBA", "LA", "1", "I;16", "YCbCr"])
def test_unusual_modes_read_as_grey_or_rgb(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "x.tiff"
    Image.new(mode, (6, 5)).save(path)
    assert read_image(path, 1).shape == (5, 6, 1)
    assert read_image(path, 3).shape == (5, 6, 3)


def test_a_class_folder_named_in_bytes_that_are_not_utf8_is_named(tmp_path: Path) -> None:
    """Its name became a label that training saved but export could not write (a traceback)."""
    root = tmp_path / "train"
    for name in (os.fsdecode(b"caf\xe9"), "plain"):
        (root / name).mkdir(parents=True)
        (root / name / "1.png").write_bytes(_png())
    with pytest.raises(DataError, match=r"^data\.path: the class folder 'caf\\udce9' in .* is not UTF-8"):
        read_image_folder(root, 3, 8)


def test_a_class_folder_without_images_is_refused(tmp_path: Path) -> None:
    """A class nested one level deeper, or given the wrong suffixes, silently disappeared."""
    root = tmp_path / "train"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "1.png").write_bytes(_png())
    (root / "dog" / "2024").mkdir(parents=True)
    (root / "dog" / "2024" / "1.png").write_bytes(_png())
    with pytest.raises(
        DataError, match=r"^data\.path: .*train holds no images in class sub-folders for 'dog'"
    ):
        read_image_folder(root, 3, 8)


def test_images_beside_the_class_folders_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "train"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "1.png").write_bytes(_png())
    (root / "stray.png").write_bytes(_png())
    with pytest.raises(DataError, match=r"^data\.path: .*train holds images beside its class folders"):
        read_image_folder(root, 3, 8)


def test_hidden_folders_and_files_are_not_classes_or_images(tmp_path: Path) -> None:
    """Jupyter's .ipynb_checkpoints and macOS's ._NAME.png (AppleDouble, not an image)."""
    root = tmp_path / "train"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "1.png").write_bytes(_png())
        (root / name / "._1.png").write_bytes(b"\x00\x05\x16\x07 macOS metadata")
    (root / ".ipynb_checkpoints").mkdir()
    data = read_image_folder(root, 3, 8)
    assert data.labels == ["cat", "dog"]


def test_what_a_class_folder_holds_besides_images_is_warned_of(tmp_path: Path) -> None:
    """A class folder's notes, its WebM clips (a suffix no reader takes) and its nested folders
    were left out without a word; its hidden files still are."""
    root = tmp_path / "train"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "1.png").write_bytes(_png())
        (root / name / ".DS_Store").write_bytes(b"finder")
    (root / "cat" / "notes.txt").write_text("tabby")
    (root / "dog" / "2024").mkdir()
    with pytest.warns(DataWarning, match=r"^data\.path: 2 entries of .*train's class folders are not read"):
        data = read_image_folder(root, 3, 8)
    assert data.labels == ["cat", "dog"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (root / "cat" / "notes.txt").unlink()
        (root / "dog" / "2024").rmdir()
        read_image_folder(root, 3, 8)


# ----------------------------------------------------------------- tokenizing a corpus


@pytest.mark.parametrize(
    "kind", [CharTokenizer(), BpeTokenizer(vocab_size=300), WordPieceTokenizer(vocab_size=200)], ids=str
)
def test_a_corpus_is_encoded_in_chunks_to_the_same_ids(kind: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines, and a line longer than a chunk (text8 is 100 MB on one line) cut between words, encode
    to the ids of each line whole."""
    from tfcompile.data import tokenizer as tokenizer_module

    lines = [f"line {i}: to be, or not  to be\n" for i in range(50)]
    lines += [" ".join(f"w{i % 37}rd," for i in range(400)) + "  tail\n", "no newline at the end"]
    text = "".join(lines)
    tokenizer = train_tokenizer(kind, lines, SPECIAL_TOKENS if isinstance(kind, WordPieceTokenizer) else ())
    whole = [i for line in lines for i in tokenizer.encode(line).ids]
    monkeypatch.setattr(tokenizer_module, "ENCODE_CHARS", 64)
    assert encode(tokenizer, text).tolist() == whole
    assert max(map(len, tokenizer_module._pieces(text))) < 100


@pytest.mark.parametrize("end", ["\\n", " "], ids=["lines", "one line"])
def test_encoding_a_corpus_takes_a_small_multiple_of_its_size(end: str) -> None:
    """Encoded at once, 4 MB of text held 500 MB of the library's encodings (tokenizers allocates
    in Rust, out of tracemalloc's sight: the process's peak is measured), on one line as in lines."""
    script = f"""
import resource
from tfcompile.data import encode, train_tokenizer
from tfcompile.spec.schema import CharTokenizer
text = "".join(f"{{i:08d}} the quick brown fox jumps over the lazy dog{end}" for i in range(80_000))
tokenizer = train_tokenizer(CharTokenizer(), [text])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = encode(tokenizer, text)
assert len(ids) == len(text)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    grown = float(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert grown < 120  # MB, for 4.4 MB of text: the ids list and a chunk's encodings
