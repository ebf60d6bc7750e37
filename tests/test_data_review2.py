"""A second adversarial review of the data pipeline (corpora, tokenizers, tables, images, caches):
each test here failed before the fix it names."""

from __future__ import annotations

from helpers import SHARED_DATA

from tfcompile.data import train_tokenizer
from tfcompile.sequences import SPECIAL_TOKENS
from tfcompile.spec.schema import WordPieceTokenizer

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
