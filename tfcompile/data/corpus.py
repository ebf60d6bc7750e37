"""Text corpora for language modelling: read, tokenize once (cached on disk), split, batch."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from tokenizers import Tokenizer

from tfcompile.data.tokenizer import encode, train_tokenizer
from tfcompile.errors import UserError
from tfcompile.files import atomic_write_bytes, atomic_write_text
from tfcompile.memory import physical_memory, too_large
from tfcompile.paths import FOLDER, REGULAR_FILE, file_type
from tfcompile.spec.schema import DataSpec


class DataError(UserError, ValueError):
    """A data problem a user can fix; the message names the spec field and what was found."""


def read_documents(spec: DataSpec) -> list[str]:
    """The documents of a corpus: one text file (plain or gzipped), or every .txt file under a
    folder (sorted), each line ended by LF (see ``unix_newlines``). A .txt entry that is no regular
    file (a broken link, a FIFO) is a DataError, not a document left out."""
    path = spec.path
    if path is None:
        raise DataError("data.path is not set: a text corpus is a file or a folder of .txt files")
    found = file_type(path)
    if found == "nothing":
        raise DataError(f"data.path: no file or folder at {path}")
    if found != FOLDER:
        return [unix_newlines(read_text(path, "data.path"))]  # a FIFO or a device is refused there
    files = corpus_files(path)
    if not files:
        raise DataError(f"data.path: the folder {path} holds no .txt files")
    return [unix_newlines(read_text(file, "data.path")) for file in files]


def corpus_files(folder: Path) -> list[Path]:
    """The .txt files (.TXT too) a corpus folder's text is read from, in its subfolders too,
    sorted; hidden ones left out, and those in hidden folders (a notebook's checkpoints, macOS's
    ._NAME.txt), as an image folder leaves them out."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() == ".txt"
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and file_type(p) != FOLDER
    )


def require_file(path: Path, field: str | None = None) -> None:
    """A DataError unless ``path`` is a regular file: it says what is there instead (nothing, a
    folder, a FIFO, a device such as /dev/null), after ``field``, the spec field that gave it."""
    found = file_type(path)
    prefix = f"{field}: " if field else ""
    if found == "nothing":
        raise DataError(f"{prefix}no file at {path}")
    if found != REGULAR_FILE:
        raise DataError(f"{prefix}{path} is {found}, not a regular file")


GZIP_MAGIC = b"\x1f\x8b"  # never UTF-8 text: 0x8b cannot start a character
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")  # UTF-32's little-endian starts as UTF-16's
# A text file is held in memory with what is made of it (its decoded text, lines, token ids): a
# file whose bytes, times this, do not fit in memory is refused before it is read or gunzipped.
TEXT_MEMORY_FACTOR = 16
GUNZIP_CHUNK = 1 << 20


def read_text(path: Path, field: str | None = None) -> str:
    """A data file's text: gunzipped when it is gzip data (whatever its name), decoded as UTF-8, a
    leading byte order mark dropped. Anything but a regular file, a damaged gzip file, a file too
    large for memory, a byte that is not UTF-8 or a NUL byte (UTF-16 or binary data) is a DataError
    naming the file (after ``field``, the spec field that gave it) and, for a byte, its line."""
    require_file(path, field)
    where = f"{field}: {path}" if field else str(path)
    try:
        size = path.stat().st_size
        _check_size(size, where, f"{size >> 20:,} MB")
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{where}: cannot read it: {e.strerror}") from None
    if data.startswith(GZIP_MAGIC):
        data = _gunzip(data, where)
    elif path.suffix.lower() == ".gz":
        raise DataError(
            f"{where}: not a gzip file, though its name ends in .gz: compress it with gzip, or remove "
            f".gz from its name if it is plain text"
        )
    if data.startswith(UTF16_BOMS):
        _not_utf8(where, 1, "UTF-16 or UTF-32 text (its first bytes say so), not UTF-8 text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + len(UTF8_BOM) * data.startswith(UTF8_BOM)  # utf-8-sig counts from after it
        _not_utf8(where, data.count(b"\n", 0, start) + 1, f"byte 0x{data[start]:02x} is not UTF-8 text")
    nul = data.find(b"\0")
    if nul >= 0:
        _not_utf8(
            where,
            data.count(b"\n", 0, nul) + 1,
            "a NUL byte (0x00), which text never holds (UTF-16 or UTF-32 text does, and binary data)",
        )
    return text


def _not_utf8(where: str, line: int, found: str) -> NoReturn:
    raise DataError(f"{where}, line {line}: {found}: save the file as UTF-8")


def _check_size(size: int, where: str, what: str) -> None:
    """A DataError when ``size`` bytes of text (``what`` says how many) are more than memory holds
    with what is made of them."""
    if too_large(size * TEXT_MEMORY_FACTOR, physical_memory()):
        raise DataError(
            f"{where}: {what}: this machine's {physical_memory() >> 20:,} MB of memory cannot hold it "
            f"with the text, lines and token ids made of it (up to {TEXT_MEMORY_FACTOR} times its "
            f"size): split it, or train where there is more memory"
        )


def _gunzip(data: bytes, where: str) -> bytes:
    """Gzip data, unpacked a chunk at a time so that a gzip bomb is refused (by ``_check_size``)
    before it fills memory."""
    parts, size = [], 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while chunk := f.read(GUNZIP_CHUNK):
                parts.append(chunk)
                size += len(chunk)
                _check_size(size, where, f"more than {size >> 20:,} MB once gunzipped")
    except EOFError:
        raise DataError(f"{where}: the gzip data ends too early (a copy cut short?): copy it again") from None
    except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        found = str(e).partition(" 0x")[0]  # a CRC failure's two checksums say nothing to a user
        raise DataError(f"{where}: the gzip data is damaged ({found}): copy it again") from None
    return b"".join(parts)


def text_lines(text: str) -> list[str]:
    """The lines of ``text``, ended by LF, CR LF or CR (Python's universal newlines) and by
    nothing else: a form feed, U+0085 or U+2028, where str.splitlines also breaks, is a character
    of its line (split there, a translation's two sides fell out of step). A final line ending
    ends the last line; it starts no empty one."""
    lines = unix_newlines(text).split("\n")
    return lines[:-1] if lines and not lines[-1] else lines


def unix_newlines(text: str) -> str:
    """``text`` with each line ending, CR LF or a lone CR (Windows', old Macs'), made an LF: the
    same corpus saved on any system is the same text, and a model learns one line break."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_corpus(spec: DataSpec) -> str:
    """The corpus as one text, its documents joined by newlines."""
    return "\n".join(read_documents(spec))


@dataclass
class TokenizedCorpus:
    tokenizer: Tokenizer
    train: torch.Tensor  # (N_train,) int64 token ids, the first 1 - val_fraction of the corpus
    val: torch.Tensor  # (N_val,) the rest

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def prepare_corpus(
    spec: DataSpec,
    cache_dir: Path,
    tokenizer: Tokenizer | None = None,
    specials: Sequence[str] = (),
    end: str | None = None,
) -> TokenizedCorpus:
    """Tokenize the corpus (or reuse the cached ids) and split it into train and validation.

    ``tokenizer`` is reused when given (a resumed or imported run); otherwise one is trained, or
    loaded from the cache when the same corpus and tokenizer spec were seen before. ``specials``
    take the first ids of a new tokenizer. ``end``, a token of the tokenizer ([EOS], an imported
    GPT-2's <|endoftext|>), ends every document (a folder's files), so the model learns where a
    text ends; a tokenizer without it is a DataError.
    """
    documents = read_documents(spec)
    text = "\n".join(documents)
    corpus_key = hashlib.sha256(text.encode()).hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer is None:
        tok_key = _key(corpus_key, spec.tokenizer.model_dump_json(), str(spec.val_fraction), *specials)
        tok_path = cache_dir / f"tokenizer-{tok_key}.json"
        tokenizer = _cached_tokenizer(tok_path)
        if tokenizer is None:
            # A char vocabulary covers the whole file (the published convention for tiny
            # shakespeare); BPE merges are learned from the training part only.
            fit_text = text if spec.tokenizer.type == "char" else text[: _split_at(len(text), spec)]
            tokenizer = train_tokenizer(spec.tokenizer, fit_text.splitlines(keepends=True), specials)
            atomic_write_text(tok_path, tokenizer.to_str())
    eos = tokenizer.token_to_id(end) if end is not None else None
    if end is not None and eos is None:
        raise DataError(f"the tokenizer has no {end} token to end each document with")
    ids_path = cache_dir / f"tokens-{_key(corpus_key, tokenizer.to_str(), str(eos), IDS_VERSION)}.npy"
    ids = _cached_ids(ids_path, tokenizer.get_vocab_size())
    if ids is None:
        try:
            if eos is None:  # one stream, the documents joined by newlines
                ids = encode(tokenizer, text).astype(np.int32)
            else:  # each document ends with the end token
                ends = [np.append(encode(tokenizer, d), eos) for d in documents]
                ids = np.concatenate([np.zeros(0, dtype=np.int64), *ends]).astype(np.int32)
        except ValueError as e:
            raise DataError(f"data.path {spec.path}: {e}") from None
        buffer = io.BytesIO()
        np.save(buffer, ids)
        atomic_write_bytes(ids_path, buffer.getvalue())  # concurrent ranks each write their own temporary
    ids_t = torch.from_numpy(ids.astype(np.int64))
    n_train = _split_at(len(ids_t), spec)
    return TokenizedCorpus(tokenizer, ids_t[:n_train], ids_t[n_train:])


# Changed when ``encode`` gives another tokenizer's text other ids, so cached ids are not reused:
# 2, cut between words rather than at every line (an imported GPT-2 or Metaspace tokenizer); 3,
# without the post-processor's special tokens (an imported LLaMA tokenizer's <s>).
IDS_VERSION = "3"


def _cached_tokenizer(path: Path) -> Tokenizer | None:
    """The tokenizer cached at ``path``, or None when there is none or it does not load (a damaged
    file is then trained and written again)."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # the library raises a bare Exception for a file it cannot parse
        return None


def _cached_ids(path: Path, vocab_size: int) -> np.ndarray | None:
    """The token ids cached at ``path``, or None when there are none or the file is not what this
    module writes (cut short, damaged, ids outside the vocabulary): they are then encoded again."""
    try:
        ids = np.load(path)
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype != np.int32:
        return None
    return ids if not len(ids) or (ids.min() >= 0 and ids.max() < vocab_size) else None


def _split_at(n: int, spec: DataSpec) -> int:
    return int(n * (1 - spec.val_fraction))


def _key(*parts: str) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def check_fits_context(corpus: TokenizedCorpus, context: int, spec: DataSpec) -> None:
    for split, ids in (("training", corpus.train), ("validation", corpus.val)):
        if len(ids) <= context:
            raise DataError(
                f"data.path {spec.path}: the {split} split has {len(ids)} tokens, fewer than one "
                f"context of {context} + 1; use a longer corpus or a shorter train.context_length"
            )


def lm_batch(
    ids: torch.Tensor, batch_size: int, context: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the token stream: inputs (B, T) and next-token targets (B, T)."""
    starts = torch.randint(len(ids) - context, (batch_size,), generator=generator)
    offsets = torch.arange(context + 1)
    windows = ids[starts[:, None] + offsets]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]
