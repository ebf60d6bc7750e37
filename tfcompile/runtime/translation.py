"""Translation from an encoder-decoder bundle: the encoder graph runs once per source, the decoder
step graph once per target token, with greedy or beam search (tfcompile.search, shared with
training)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfcompile import search
from tfcompile.manifest import MAX_BEAM, MAX_LENGTH_PENALTY, TranslationInfo
from tfcompile.runtime import inputs
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.session import Bundle, SessionOptions
from tfcompile.sequences import pad_rows, source_row, tidy


class Translator(Bundle):
    """``translate(texts)`` -> translations; ``translate_ids(source_ids, source_mask)`` -> target
    token ids. Beam size, length penalty and maximum length default to the manifest's translation
    section. A batch of sources of different lengths (right-padded) translates as each alone, but
    with an int8 bundle, whose activations are quantized at one scale over the whole batch (the
    manifest's optimization says which)."""

    TASK = "seq2seq"
    PADDING_SIDE = "right"
    MAIN_GRAPH = "encoder"

    def __init__(
        self,
        bundle: str | Path | BundleFiles,
        providers: Sequence[str] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        super().__init__(bundle, providers, options)
        if self.manifest.translation is None:
            raise BundleError(f"{self.path}: the manifest of a translator needs a translation section")
        self.translation: TranslationInfo = self.manifest.translation
        encoder = self.expect("encoder", ["source_ids", "source_mask"], [])
        step = self.graph("step")
        if step.cache is None:
            raise BundleError(f"{self.path}: the manifest gives the step graph no cache section")
        # The step reads the target tokens, the source mask, the cache, then the encoder's outputs.
        inputs = ["input_ids", "source_mask", *step.cache.past, *(t.name for t in encoder.outputs)]
        self.expect("step", inputs, ["logits", *step.cache.present])
        self.expect_vocabulary_logits("step")
        self.step = self.open_graph("step")
        self.step_inputs = inputs
        stop = self.translation.stop_id
        if self.emitted is not None and stop >= self.emitted:
            raise BundleError(
                f"{self.path}: translation.stop_id {stop} is outside the tokenizer's {self.emitted} tokens, "
                f"the only ids decoding chooses: no translation could end"
            )
        if self.manifest.tokenizer is not None and "unk" not in self.manifest.tokenizer.special_tokens:
            raise BundleError(
                f"{self.path}: the manifest's tokenizer names no unk token, which translate reads an "
                f"empty source as"
            )

    def warm_up(self) -> None:
        given = len(self.translation.target_prefix_ids)
        self.translate_ids(np.zeros((1, 1), dtype=np.int64), beam=1, max_len=given + 1)  # both graphs

    def translate(
        self,
        texts: str | Sequence[str],
        beam: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
        source_language: str | None = None,
        target_language: str | None = None,
        early_stopping: bool | str | None = None,
    ) -> list[str]:
        """Sentences -> their translations (detokenized). ``source_language`` and
        ``target_language``: a multilingual translator's code (a special token of its tokenizer:
        NLLB's deu_Latn) that replaces the bundle's, the manifest's tokenizer.special_tokens
        source_language and target_language, wherever the source affixes and the target prefix
        hold it. Options left out are the manifest's (see ``scoring``)."""
        unk = self.special_id("unk")
        prefix, suffix, given = self.framing(source_language, target_language)
        encodings = self.encode(inputs.texts("texts", texts), add_special_tokens=False)
        rows = [source_row(e.ids, self.max_seq_len, prefix, suffix, unk) for e in encodings]
        ids = pad_rows(rows, self.manifest.padding.pad_id)
        mask = pad_rows([[1] * len(row) for row in rows], 0)
        tokens = self.translate_ids(ids, mask, beam, length_penalty, max_len, given, early_stopping)
        return [tidy(text) for text in self.decode_ids(tokens)]

    def framing(
        self, source_language: str | None = None, target_language: str | None = None
    ) -> tuple[list[int], list[int], list[int]]:
        """The ids put before and after every source and given to the decoder after its start
        (the manifest's translation section), with the codes asked for in place of the bundle's
        (see ``translate``); an InputError names a code that cannot take its place."""
        t = self.translation
        source = self._code("source_language", source_language, [*t.source_prefix_ids, *t.source_suffix_ids])
        target = self._code("target_language", target_language, t.target_prefix_ids)
        prefix, suffix = (
            [source.get(i, i) for i in ids] for ids in (t.source_prefix_ids, t.source_suffix_ids)
        )
        return prefix, suffix, [target.get(i, i) for i in t.target_prefix_ids]

    def _code(self, role: str, code: str | None, placed: list[int]) -> dict[int, int]:
        """{the bundle's code for ``role`` (tokenizer.special_tokens') -> ``code``'s id}, to replace it
        where ``placed`` holds it: ``code`` must be a special token of the tokenizer; {} for None."""
        if code is None:
            return {}
        if not isinstance(code, str):
            raise InputError(f"{role} must be a token string (NLLB's fra_Latn), found {type(code).__name__}")
        named = self.manifest.tokenizer.special_tokens if self.manifest.tokenizer is not None else {}
        if role not in named or named[role].id not in placed:
            raise InputError(f"{role}: the bundle places no {role} code to replace")
        assert self.tokenizer is not None  # the manifest names its special tokens
        special = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        if code not in special:
            raise InputError(
                f"{role}: {code[:64]!r} is no special token of the bundle's tokenizer (its code is "
                f"{named[role].token!r})"
            )
        if special[code] == self.translation.stop_id:
            raise InputError(f"{role}: {code!r} is the stop token, which ends every translation")
        return {named[role].id: special[code]}

    def translate_ids(
        self,
        source_ids: Any,
        source_mask: Any | None = None,
        beam: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
        target_prefix_ids: Sequence[int] | None = None,
        early_stopping: bool | str | None = None,
    ) -> list[list[int]]:
        """source_ids (batch, seq) [+ source_mask, 0 at padding] -> each source's target ids,
        without the start and stop tokens and the target prefix the decoder is given (the
        manifest's, or ``target_prefix_ids``); ``max_len`` counts the decoder's tokens after the
        start, the prefix's included."""
        t = self.translation
        given = list(t.target_prefix_ids) if target_prefix_ids is None else self._given(target_prefix_ids)
        ids = self._token_ids(source_ids, "source_ids")
        mask = np.ones_like(ids) if source_mask is None else self._mask(source_mask, ids.shape, "source_mask")
        if not mask.any(axis=1).all():
            raise InputError("every source sentence needs at least one real token in source_mask")
        width = inputs.count("beam", t.beam if beam is None else beam, 1, MAX_BEAM)
        scoring = self.scoring(length_penalty, early_stopping)
        limit = self.decode_limit(max_len)
        if limit <= len(given):
            raise InputError(
                f"max_len must exceed the {len(given)} tokens the decoder is given after the start (the "
                f"target prefix), found {limit}"
            )

        def decoder_for(row: int | None) -> _StepDecoder:
            if row is None:
                return _StepDecoder(self, ids, mask)
            real = mask[row].astype(bool)
            return _StepDecoder(self, ids[row : row + 1, real], mask[row : row + 1, real])

        start = [t.start_id, *given]
        sequences = tuple(map(tuple, t.banned_sequences))
        bans = search.Bans(tuple(t.suppressed_ids), t.min_decode_len, t.no_repeat_ngram_size, sequences)
        return search.translate(
            decoder_for, len(ids), start, t.stop_id, limit, width, scoring, t.forced_eos, bans
        )

    def decode_limit(self, max_len: Any | None) -> int:
        """A checked max_len, the manifest's max_decode_len when None, cut to the decoder's
        context (model.max_seq_len - 1 tokens after the start)."""
        default = self.translation.max_decode_len
        return min(inputs.count("max_len", default if max_len is None else max_len, 1), self.max_seq_len - 1)

    def scoring(
        self, length_penalty: float | None = None, early_stopping: bool | str | None = None
    ) -> search.BeamScoring:
        """The manifest's beam scoring with a caller's ``length_penalty`` (fairseq's alpha, at least
        0, or the power of the length transformers divides by) and ``early_stopping`` (True,
        False or "never", transformers' alone) where given; an InputError names a bad one."""
        t = self.translation
        fairseq = t.beam_scoring == "fairseq"
        alpha = inputs.number(
            "length_penalty",
            t.length_penalty if length_penalty is None else length_penalty,
            0.0 if fairseq else -MAX_LENGTH_PENALTY,
            MAX_LENGTH_PENALTY,
        )
        stopping = t.early_stopping if early_stopping is None else early_stopping
        if isinstance(stopping, np.bool_):
            stopping = bool(stopping)
        if not (isinstance(stopping, bool) or (isinstance(stopping, str) and stopping == "never")):
            raise InputError(f'early_stopping must be true, false or "never", got {str(stopping)[:64]!r}')
        if fairseq and stopping is not False:
            raise InputError(
                f"early_stopping {stopping!r} is transformers' beam search's; this bundle's beam_scoring is "
                f"fairseq's, which ends once beam hypotheses have finished"
            )
        return search.beam_scoring(t.beam_scoring, alpha, stopping if isinstance(stopping, bool) else "never")

    def _given(self, value: Sequence[int]) -> list[int]:
        """A target prefix: token ids of the vocabulary, no more than the decoder can hold."""
        if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
            raise InputError(f"target_prefix_ids must be a list of token ids, found {type(value).__name__}")
        if len(value) == 0:
            return []
        if any(isinstance(i, bool | np.bool_) or np.ndim(i) != 0 for i in value):
            raise InputError("target_prefix_ids must be a flat list of token ids (whole numbers)")
        given = inputs.token_ids([list(value)], self.vocab_size, None, "target_prefix_ids")[0].tolist()
        if self.translation.stop_id in given:
            raise InputError("target_prefix_ids holds the stop token, which ends every translation")
        return given


class _StepDecoder:
    """The encoder graph once, then the decoder step graph, as a search.Decoder: the cache is the
    decoder's self-attention keys and values; the source's keys and values and mask follow its rows."""

    def __init__(self, translator: Translator, source_ids: np.ndarray, source_mask: np.ndarray) -> None:
        self.translator = translator
        self.memory = translator.run_graph("encoder", {"source_ids": source_ids, "source_mask": source_mask})
        self.source_mask = source_mask
        self.past: list[np.ndarray] = translator.empty_cache("step", len(source_mask))

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """``mask`` is None: target tokens are never padded (every row starts with the start id)."""
        feed = dict(
            zip(
                self.translator.step_inputs, [tokens, self.source_mask, *self.past, *self.memory], strict=True
            )
        )
        logits, *self.past = self.translator.run_graph("step", feed)
        return logits[:, -1, : self.translator.emitted]

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [p[rows] for p in self.past]
        self.memory = [m[rows] for m in self.memory]
        self.source_mask = self.source_mask[rows]

    def reset(self) -> None:
        self.past = self.translator.empty_cache("step", len(self.source_mask))
