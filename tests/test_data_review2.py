"""A second adversarial review of the data pipeline (corpora, tokenizers, tables, images, caches):
each test here failed before the fix it names."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED_DATA
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tfcompile.data import DataError, encode, prepare_corpus, train_tokenizer
from tfcompile.data import tokenizer as tokenizer_module
from tfcompile.data.table import read_table
from tfcompile.sequences import SPECIAL_TOKENS
from tfcompile.spec.schema import DataSpec, WordPieceTokenizer

SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"


# ----------------------------------------------------------------- tokenizers


def test_a_wordpiece_tokenizer_is_the_same_each_time_it_is_trained() -> None:
    """The library's trainer numbered the '##' pieces in a hash map's order and broke ties between
    merges by those numbers: each training gave other ids (tokenizers issue #1794)."""
    lines = SHAKESPEARE.read_text()[:20_000].splitlines(keepends=True)
    spec = WordPieceTokenizer(vocab_size=300)
    trained = {train_tokenizer(spec, lines, SPECIAL_TOKENS).to_str() for _ in range(6)}
    assert len(trained) == 1
    tokenizer = train_tokenizer(spec, lines, SPECIAL_TOKENS)
    assert [tokenizer.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tokenizer.get_vocab_size() == 300
    assert [t.content for t in tokenizer.get_added_tokens_decoder().values()] == list(SPECIAL_TOKENS)
    assert tokenizer.decode(tokenizer.encode("ROMEO: wherefore art thou").ids) == "romeo : wherefore art thou"


# ----------------------------------------------------------------- token caches


@pytest.mark.parametrize("name", ["tokenizer-*.json", "tokens-*.npy"])
@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: b"",
        lambda data: b"garbage",
    ],
    ids=["cut short", "empty", "not its format"],
)
def test_a_damaged_cache_file_is_made_again(tmp_path: Path, name: str, damage) -> None:
    """A cached tokenizer or token array that did not load was a library's ValueError, EOFError
    or bare Exception: each run failed until the user found and deleted runs/.cache."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("to be, or not to be\n" * 50)
    spec = DataSpec(path=corpus)
    first = prepare_corpus(spec, tmp_path / "cache")
    [cached] = (tmp_path / "cache").glob(name)
    cached.write_bytes(damage(cached.read_bytes()))
    again = prepare_corpus(spec, tmp_path / "cache")
    assert torch.equal(first.train, again.train) and torch.equal(first.val, again.val)
    assert prepare_corpus(spec, tmp_path / "cache").tokenizer.to_str() == first.tokenizer.to_str()


@pytest.mark.parametrize(
    "ids",
    [np.full(80, 99, dtype=np.int32), np.zeros(80), np.zeros((8, 10), dtype=np.int32)],
    ids=["past the vocabulary", "floats", "two dimensions"],
)
def test_cached_ids_that_are_no_token_ids_are_encoded_again(tmp_path: Path, ids: np.ndarray) -> None:
    """Ids past the vocabulary failed deep in the embedding, mid-training."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abc\n" * 20)
    spec = DataSpec(path=corpus)
    first = prepare_corpus(spec, tmp_path / "cache")
    [cached] = (tmp_path / "cache").glob("tokens-*.npy")
    np.save(cached, ids)
    assert torch.equal(prepare_corpus(spec, tmp_path / "cache").train, first.train)


# ----------------------------------------------------------------- text corpora


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["CR LF", "CR"])
def test_a_corpus_saved_with_other_line_endings_is_the_same_corpus(tmp_path: Path, newline: str) -> None:
    """A language model's corpus kept its CRs: Windows' copy of a text had one more character in
    its vocabulary and learned to write CR LF, which a prompt typed with LF never showed it."""
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20
    (tmp_path / "unix.txt").write_text(text, newline="\n")
    (tmp_path / "other.txt").write_text(text, newline=newline)
    unix = prepare_corpus(DataSpec(path=tmp_path / "unix.txt"), tmp_path / "cache")
    other = prepare_corpus(DataSpec(path=tmp_path / "other.txt"), tmp_path / "cache")
    assert other.tokenizer.to_str() == unix.tokenizer.to_str()
    assert torch.equal(other.train, unix.train) and torch.equal(other.val, unix.val)


# ----------------------------------------------------------------- tables


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_cell_longer_than_the_csv_modules_limit_is_read(tmp_path: Path, suffix: str) -> None:
    """A review of more than 131,072 characters was refused as 'field larger than field limit'."""
    review = "a long review " * 20_000
    separator = "," if suffix == ".csv" else "\t"
    path = tmp_path / f"reviews{suffix}"
    path.write_text(f"sentence{separator}label\n{review}{separator}1\nshort{separator}0\n")
    table = read_table(path, "sentence", None, "label")
    assert table.texts == [review.strip(), "short"] and table.labels == ["1", "0"]
    assert csv.field_size_limit() == 131_072  # the module's limit is as it was


@pytest.mark.parametrize(
    ("value", "found"), [("NaN", "NaN \\(how pandas writes a missing value\\)"), ("-Infinity", "infinite")]
)
def test_a_json_cell_that_is_no_finite_number_is_refused(tmp_path: Path, value: str, found: str) -> None:
    """pandas writes a missing label as NaN, which became a class named 'nan'."""
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"sentence": "good", "label": 1}}\n{{"sentence": "bad", "label": {value}}}\n')
    with pytest.raises(DataError, match=rf"rows\.jsonl, row 2: the 'label' cell is {found}, expected text"):
        read_table(path, "sentence", None, "label")


# Verse and code: indented lines and runs of blank lines, where a tokenizer learned from whole
# documents has tokens that span a line break and what follows it.
TEXT = "".join(
    f"def f{i}(x):\n    return x + {i}\n\n\n\nSonnet {i}:\n  Shall I compare thee to a summer's day?\n"
    for i in range(300)
)


def _gpt2_like() -> Tokenizer:
    """A byte-level BPE learned from whole documents, as GPT-2's was (its 628 is "\n\n")."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    assert "ĊĊ" in tokenizer.get_vocab() and "ĊĠĠĠ" in tokenizer.get_vocab()
    return tokenizer


def _metaspace() -> Tokenizer:
    """A Metaspace tokenizer (SentencePiece's, as recent LLaMA conversions write it)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"], show_progress=False)
    tokenizer.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    return tokenizer


@pytest.mark.parametrize("make", [_gpt2_like, _metaspace], ids=["byte-level BPE", "Metaspace"])
def test_an_imported_tokenizer_encodes_a_corpus_as_it_encodes_the_whole_text(
    make: Callable[[], Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The corpus was encoded line by line: a blank line became two line-break tokens where GPT-2's
    tokenizer (and the runtime, which encodes a prompt whole) has one, and a Metaspace tokenizer
    began every line with a word-start mark: a model fine-tuned on its corpus (train.init_from)
    learned ids it is never given."""
    tokenizer = make()
    text = TEXT + SHAKESPEARE.read_text()[:20_000]
    monkeypatch.setattr(tokenizer_module, "ENCODE_CHARS", 3_200)  # pieces of 200 characters
    assert encode(tokenizer, text).tolist() == tokenizer.encode(text).ids
    assert len(list(tokenizer_module._pieces(text))) > 50


def test_tables_read_from_many_threads_at_once_each_read_whole(tmp_path: Path) -> None:
    """Each read raised the process's csv field limit and put back what it found: threads put back
    each other's, and a read of long cells failed as 'field larger than field limit'."""
    import csv
    from concurrent.futures import ThreadPoolExecutor

    long = tmp_path / "long.csv"
    long.write_text("sentence,label\n" + "".join(f"{'x' * 200_000},{i % 2}\n" for i in range(4)))
    short = tmp_path / "short.csv"
    short.write_text("sentence,label\na,0\nb,1\n")
    before = csv.field_size_limit()
    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(lambda p: len(read_table(p, "sentence", None, "label")), [long, short] * 200))
    assert counts == [4, 2] * 200
    assert csv.field_size_limit() == before


def test_a_corpus_is_encoded_without_the_post_processor_s_tokens() -> None:
    """A LLaMA tokenizer's post-processor adds <s>: every piece of a corpus got one, mid-sentence
    (22 in 90,000 characters); the runtime adds one to a prompt, as encode does when asked."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from tfcompile.data.tokenizer import ENCODE_CHARS, encode

    words = ["the", "cat", "sat", "<s>", "<unk>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    text = " ".join(["the cat sat"] * (ENCODE_CHARS // 4))
    ids = encode(tokenizer, text)
    assert 3 not in ids and len(ids) == 3 * (ENCODE_CHARS // 4)
    assert encode(tokenizer, "the cat", special_tokens=True).tolist() == [3, 0, 1]


def test_a_json_row_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    """json.loads keeps a repeated key's last value: {"label": 0, "label": 1} trained as 1."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"sentence": "good", "label": 1}\n{"sentence": "bad", "label": 0, "label": 1}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl, line 2: the key 'label' is given twice"):
        read_table(path, "sentence", None, "label")


def test_a_wordpiece_vocabulary_past_its_vocab_size_is_warned_of() -> None:
    """WordPiece keeps every character and its '##' continuation whatever vocab_size says: 300
    distinct characters and vocab_size 32 made 601 tokens without a word (byte-level BPE below its
    256 bytes is refused)."""
    from tfcompile.errors import DataWarning
    from tfcompile.spec.schema import WordPieceTokenizer

    wide = [" ".join(chr(0x4E00 + i) for i in range(300))]
    warned = r"vocab_size 32 is below what WordPiece keeps .*, \d{3} tokens here"
    with pytest.warns(DataWarning, match=warned):
        tokenizer = train_tokenizer(WordPieceTokenizer(vocab_size=32), wide, ["[UNK]"])
    assert tokenizer.get_vocab_size() > 300
