"""Translation from an encoder-decoder bundle: the encoder graph runs once per source, the decoder
step graph once per target token, with greedy or beam search (tfcompile.search, shared with
training)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfcompile import search
from tfcompile.runtime.errors import InputError
from tfcompile.runtime.ort import ort, run
from tfcompile.runtime.session import Bundle
from tfcompile.sequences import PAD, UNK, pad_rows


class Translator(Bundle):
    """``translate(texts)`` -> translations; ``translate_ids(source_ids, source_mask)`` -> target
    token ids. Beam size, length penalty and maximum length default to the bundle's task."""

    MAIN_GRAPH = "encoder"

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        super().__init__(bundle, providers)
        step = self.manifest["graphs"]["step"]
        self.step = ort.InferenceSession(str(self.path / step["file"]), providers=self._providers)
        self.step_inputs = [i["name"] for i in step["inputs"]]
        self.sizes = self.manifest["model"]

    def translate(
        self,
        texts: str | Sequence[str],
        beam: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
    ) -> list[str]:
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer.json: pass token ids to translate_ids() instead")
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items or not all(isinstance(t, str) for t in items):
            raise InputError("translate takes a string or a non-empty list of strings")
        special = self.special_ids(PAD, UNK)
        pad = special[PAD]
        encoded = [
            e.ids[: self.max_seq_len] or [special[UNK]]
            for e in self.tokenizer.encode_batch(items, add_special_tokens=False)
        ]
        ids = pad_rows(encoded, pad)
        tokens = self.translate_ids(ids, (ids != pad).astype(np.int64), beam, length_penalty, max_len)
        return [t.strip() for t in self.tokenizer.decode_batch(tokens)]

    def translate_ids(
        self,
        source_ids: np.ndarray,
        source_mask: np.ndarray | None = None,
        beam: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
    ) -> list[list[int]]:
        ids = self._token_ids(source_ids)
        mask = np.ones_like(ids) if source_mask is None else self._mask(source_mask, ids.shape)
        if not mask.any(axis=1).all():
            raise InputError("every source sentence needs at least one real token in source_mask")
        beam = self.sizes["beam"] if beam is None else beam
        alpha = self.sizes["length_penalty"] if length_penalty is None else length_penalty
        max_len = min(self.sizes["max_decode_len"] if max_len is None else max_len, self.max_seq_len - 1)
        if beam < 1 or max_len < 1 or alpha < 0:
            raise InputError(
                f"beam and max_len must be >= 1 and length_penalty >= 0, got {beam}, {max_len}, {alpha}"
            )
        bos, eos = self.sizes["bos_id"], self.sizes["eos_id"]
        if beam == 1:
            start = np.full((len(ids), 1), bos, dtype=np.int64)
            return search.generate(_StepDecoder(self, ids, mask), start, max_len, temperature=0, eos=eos)
        results = []
        for row in range(len(ids)):
            real = mask[row].astype(bool)
            decoder = _StepDecoder(self, ids[row : row + 1, real], mask[row : row + 1, real])
            results.append(search.beam_search(decoder, bos, eos, max_len, beam, alpha))
        return results


class _StepDecoder:
    """The encoder graph once, then the decoder step graph, as a search.Decoder: the cache is the
    decoder's self-attention keys and values; the source's keys and values and mask follow its rows."""

    def __init__(self, translator: Translator, source_ids: np.ndarray, source_mask: np.ndarray) -> None:
        self.translator = translator
        self.memory = run(translator.session, {"source_ids": source_ids, "source_mask": source_mask})
        self.source_mask = source_mask
        self.past: list[np.ndarray] = translator.empty_cache("step", len(source_mask))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        feed = dict(
            zip(
                self.translator.step_inputs, [tokens, self.source_mask, *self.past, *self.memory], strict=True
            )
        )
        logits, *self.past = run(self.translator.step, feed)
        return logits[:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [p[rows] for p in self.past]
        self.memory = [m[rows] for m in self.memory]
        self.source_mask = self.source_mask[rows]

    def reset(self) -> None:
        self.past = self.translator.empty_cache("step", len(self.source_mask))
