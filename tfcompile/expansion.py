"""How much longer a tokenizer can make a text, read from its tokenizer.json before it runs.

A normalizer, a pre-tokenizer or a decoder may write more characters than it reads: NFKC makes up
to 18 characters of one, a Replace writes its content for each match. Chained, they multiply:
twenty Replaces of "a" by "aa" make a million characters of each "a", which the tokenizers
library builds in memory whole. ``expansion`` bounds the characters out per character in, from
each step's settings; a tokenizer that may expand a text more than ``MAX_EXPANSION`` times is
refused where tfcompile takes one in (a bundle's at load, a Hugging Face folder's at import).
The bound of a step that adds text once (a prefix) counts it against a one-character input,
which also bounds it for any longer one.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

MAX_EXPANSION = 1024  # characters out per character in; BERT's normalizer is at most 36, GPT-2's 5

# Unicode normalization forms: at most 3 (NFC), 4 (NFD) and 18 (NFKC, NFKD: U+FDFA) characters
# of one (Unicode Standard Annex #15, "Stability of Normalized Forms"); lowercasing at most 3.
_UNICODE = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3}
# Steps that drop, map or split characters without adding any.
_SAME = {
    "Strip",
    "StripAccents",
    "Nmt",
    "BertPreTokenizer",
    "CharDelimiterSplit",
    "Digits",
    "FixedLength",
    "Punctuation",
    "Split",
    "UnicodeScripts",
    "Whitespace",
    "WhitespaceSplit",
    "ByteFallback",
    "Fuse",
}
_SEQUENCES = ("normalizers", "pretokenizers", "decoders")


def excess(tokenizer: dict) -> str | None:
    """What of a tokenizer.json (its JSON) may make more than MAX_EXPANSION characters of one,
    encoding (normalizer then pre-tokenizer) or decoding (decoder); None when nothing does."""
    for what, steps, decoding in (
        ("encoding", (tokenizer.get("normalizer"), tokenizer.get("pre_tokenizer")), False),
        ("decoding", (tokenizer.get("decoder"),), True),
    ):
        try:
            factor = math.prod(expansion(step, decoding) for step in steps)
        except Unbounded as e:
            return f"the tokenizer's {what} cannot be bounded: {e}"
        if factor > MAX_EXPANSION:
            return (
                f"the tokenizer's {what} may make up to {factor:,.0f} characters of one; a "
                f"tokenizer may make at most {MAX_EXPANSION:,} (look for a chain of Replace steps "
                f"in its normalizer, pre-tokenizer or decoder)"
            )
    return None


class Unbounded(ValueError):
    """A step whose expansion cannot be bounded from its settings."""


def expansion(step: Any, decoder: bool = False) -> float:
    """Characters a normalizer, pre-tokenizer or decoder (``decoder``: the token strings to text)
    writes per character it reads, at most; None (no step) writes what it reads."""
    if step is None:
        return 1.0
    if not isinstance(step, dict):
        raise Unbounded(f"a step that is not an object: {str(step)[:60]!r}")
    kind = step.get("type")
    if kind == "Sequence":
        factor = 1.0
        for key in _SEQUENCES:
            steps = step.get(key) or []
            if not isinstance(steps, list):  # the library ignores the keys of another kind's sequence
                raise Unbounded(f"a Sequence's {key} that is not a list: {str(steps)[:60]!r}")
            for inner in steps:
                factor *= expansion(inner, decoder)
        return factor
    if kind in _SAME:
        return 1.0
    if kind in _UNICODE:
        return _UNICODE[kind]
    if kind == "BertNormalizer":  # spaces around CJK characters, NFD, lowercasing
        return 3 * _UNICODE["NFD"] * _UNICODE["Lowercase"]
    if kind == "ByteLevel":  # pre-tokenizing: a character's UTF-8 bytes, one character each
        return 1.0 if decoder else 4 + bool(step.get("add_prefix_space"))
    if kind == "Metaspace":  # spaces to one replacement character, one more in front
        return 1.0 if decoder else 2.0
    if kind == "WordPiece":  # a space before each token (of one character at least) not a suffix
        return 2.0
    if kind in ("BPEDecoder", "CTC"):  # a suffix, or a word delimiter, becomes a space: an empty one
        empty = _text(step, "suffix" if kind == "BPEDecoder" else "word_delimiter_token") == ""
        return 3.0 if empty else 1.0  # is found around every character
    if kind == "Prepend":
        return 1.0 + len(_text(step, "prepend"))
    if kind == "Replace":
        return _replace(step)
    if kind == "Precompiled":
        return float(max(1, _longest_mapping(_text(step, "precompiled_charsmap"))))
    raise Unbounded(f"the step {kind!r}")


def _replace(step: dict) -> float:
    """A Replace writes its content for each match: a string of n characters -> content/n per
    character; a regex, which may match the empty string between characters, -> twice the
    content and the character itself."""
    content = len(_text(step, "content"))
    pattern = step.get("pattern")
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and pattern["String"]:
        return max(1.0, content / len(pattern["String"]))
    return 2.0 * content + 1


def _longest_mapping(charsmap: str) -> int:
    """The longest text a SentencePiece precompiled character map maps anything to: the map is
    a 4-byte little-endian trie size, the trie, then the texts it maps to, each ended by NUL."""
    try:
        blob = base64.b64decode(charsmap, validate=True)
        (trie,) = struct.unpack_from("<I", blob)
    except (binascii.Error, struct.error) as e:
        raise Unbounded(f"a precompiled character map that does not read: {e}") from None
    texts = blob[4 + trie :] if 4 + trie <= len(blob) else blob
    return max((len(t.decode("utf-8", "replace")) for t in texts.split(b"\0")), default=0)


def _text(step: dict, key: str) -> str:
    value = step.get(key, "")
    if not isinstance(value, str):
        raise Unbounded(f"the {step.get('type')!r} step's {key} {str(value)[:60]!r}")
    return value
