"""Corpora, tokenizers and the token cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA
from hypothesis import given
from hypothesis import strategies as st

from tfcompile.data import corpus as corpus_module
from tfcompile.data import encode, lm_batch, prepare_corpus, text_lines, train_tokenizer
from tfcompile.spec.schema import BpeTokenizer, CharTokenizer, DataSpec
from tfcompile.tasks.task import pad_rows

SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"


def test_char_corpus_follows_the_published_convention(tmp_path: Path) -> None:
    corpus = prepare_corpus(DataSpec(path=SHAKESPEARE), tmp_path)
    assert corpus.vocab_size == 65
    assert len(corpus.train) + len(corpus.val) == 1_115_394
    assert len(corpus.train) == int(1_115_394 * 0.9)
    text = SHAKESPEARE.read_text()
    assert (
        corpus.tokenizer.decode(corpus.val[:50].tolist()) == text[len(corpus.train) : len(corpus.train) + 50]
    )


def test_second_preparation_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = prepare_corpus(DataSpec(path=SHAKESPEARE), tmp_path)

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("re-tokenized despite the cache")

    monkeypatch.setattr(corpus_module, "encode", no_tokenizing)
    monkeypatch.setattr(corpus_module, "train_tokenizer", no_tokenizing)
    second = prepare_corpus(DataSpec(path=SHAKESPEARE), tmp_path)
    assert torch.equal(first.train, second.train) and torch.equal(first.val, second.val)


def test_bpe_tokenizer_is_trained_to_the_vocab_size_and_round_trips(tmp_path: Path) -> None:
    spec = DataSpec(path=SHAKESPEARE, tokenizer=BpeTokenizer(vocab_size=500))
    corpus = prepare_corpus(spec, tmp_path)
    assert corpus.vocab_size == 500
    assert len(corpus.train) < 0.7 * 1_115_394 * 0.9  # merges shorten the stream
    text = "ROMEO:\nWherefore art thou, Romeo?"
    assert corpus.tokenizer.decode(encode(corpus.tokenizer, text).tolist()) == text


def test_folder_corpus_reads_every_text_file_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "b.txt").write_text("second file\n")
    (folder / "a.txt").write_text("first file\n")
    (folder / "skip.md").write_text("not text\n")
    assert corpus_module.read_corpus(DataSpec(path=folder)) == "first file\n\nsecond file\n"


def test_a_folder_corpus_leaves_out_hidden_files_and_reads_any_case_of_txt(tmp_path: Path) -> None:
    """A notebook's checkpoint copy (.ipynb_checkpoints/a-checkpoint.txt) was read as a second copy
    of a.txt, and macOS's ._a.txt (binary) as a file that is not UTF-8; C.TXT was left out."""
    folder = tmp_path / "texts"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / "a.txt").write_text("first\n")
    (folder / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("first\n")
    (folder / "._a.txt").write_bytes(b"\x00\x05\x16\x07")
    (folder / "C.TXT").write_text("third\n")
    assert corpus_module.read_corpus(DataSpec(path=folder)) == "third\n\nfirst\n"


def test_unknown_characters_are_named() -> None:
    tok = train_tokenizer(CharTokenizer(), ["abc"])
    with pytest.raises(ValueError, match=r"\['z'\]"):
        encode(tok, "abz")


def test_lm_batch_targets_are_inputs_shifted_by_one() -> None:
    ids = torch.arange(100)
    x, y = lm_batch(ids, 4, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)


def test_pad_rows_left_aligns_each_row_and_fills_the_rest() -> None:
    padded = pad_rows([[5, 6, 7], [8], [], [9, 10]], -1)
    expected = [[5, 6, 7], [8, -1, -1], [-1, -1, -1], [9, 10, -1]]
    assert padded.dtype == torch.int64 and padded.tolist() == expected


@given(
    st.lists(st.text(st.characters(blacklist_characters="\r\n")), min_size=1),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.booleans(),
)
def test_text_lines_end_at_newlines_only(lines: list[str], newline: str, final: bool) -> None:
    """Lines hold any character but CR and LF (str.splitlines also breaks at form feeds, U+0085,
    U+2028...), whichever of the three line endings the file uses, with or without a last one."""
    text = newline.join(lines) + (newline if final else "")
    assert text_lines(text) == (lines if final or lines[-1] else lines[:-1])
