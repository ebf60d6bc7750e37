"""Translation from an encoder-decoder bundle: the encoder graph runs once per source, the decoder
step graph once per target token, with greedy or beam search as in tfcompile.tasks.seq2seq."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfcompile.runtime.errors import InputError
from tfcompile.runtime.ort import ort, run
from tfcompile.runtime.session import Bundle
from tfcompile.sequences import length_normalised, pad_rows

PAD, UNK = "[PAD]", "[UNK]"


class Translator(Bundle):
    """``translate(texts)`` -> translations; ``translate_ids(source_ids, source_mask)`` -> target
    token ids. Beam size, length penalty and maximum length default to the bundle's task."""

    MAIN_GRAPH = "encoder"

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        super().__init__(bundle, providers)
        step = self.manifest["graphs"]["step"]
        self.step = ort.InferenceSession(str(self.path / step["file"]), providers=self._providers)
        self._step_inputs = [i["name"] for i in step["inputs"]]
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
        unk = self.tokenizer.token_to_id(UNK)
        encoded = [
            e.ids[: self.max_seq_len] or [unk]
            for e in self.tokenizer.encode_batch(items, add_special_tokens=False)
        ]
        pad = self.tokenizer.token_to_id(PAD)
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
            return self._greedy(ids, mask, bos, eos, max_len)
        results = []
        for row in range(len(ids)):
            real = mask[row].astype(bool)
            source, source_mask = ids[row : row + 1, real], mask[row : row + 1, real]
            memory = run(self.session, {"source_ids": source, "source_mask": source_mask})
            results.append(self._beam_one(memory, source_mask, bos, eos, max_len, beam, alpha))
        return results

    def _decode(
        self, tokens: np.ndarray, mask: np.ndarray, past: list, memory: list
    ) -> tuple[np.ndarray, list]:
        feed = dict(zip(self._step_inputs, [tokens, mask, *past, *memory], strict=True))
        logits, *present = run(self.step, feed)
        return logits[:, -1], present

    def _greedy(self, ids: np.ndarray, mask: np.ndarray, bos: int, eos: int, max_len: int) -> list[list[int]]:
        memory = run(self.session, {"source_ids": ids, "source_mask": mask})
        past = self._empty_cache("step", len(ids))
        tokens = np.full((len(ids), 1), bos, dtype=np.int64)
        out: list[list[int]] = [[] for _ in ids]
        done = np.zeros(len(ids), dtype=bool)
        for _ in range(max_len + 1):
            logits, past = self._decode(tokens, mask, past, memory)
            next_ids = logits.argmax(-1)
            for row in np.flatnonzero(~done):
                if next_ids[row] != eos and len(out[row]) < max_len:
                    out[row].append(int(next_ids[row]))
            done |= (next_ids == eos) | np.array([len(o) >= max_len for o in out])
            if done.all():
                break
            tokens = next_ids[:, None].astype(np.int64)
        return out

    def _beam_one(
        self, memory: list, mask: np.ndarray, bos: int, eos: int, max_len: int, beam: int, alpha: float
    ) -> list[int]:
        past = self._empty_cache("step", 1)
        hypotheses: list[tuple[float, list[int]]] = [(0.0, [])]
        finished: list[tuple[float, list[int]]] = []
        tokens = np.array([[bos]], dtype=np.int64)
        for step in range(max_len + 1):
            n = len(hypotheses)
            expanded = [np.ascontiguousarray(np.broadcast_to(m, (n, *m.shape[1:]))) for m in memory]
            logits, past = self._decode(tokens, np.repeat(mask, n, axis=0), past, expanded)
            logits = logits.astype(np.float64)
            log_probs = logits - logits.max(-1, keepdims=True)
            log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
            scores = np.array([s for s, _ in hypotheses])[:, None] + log_probs
            order = np.argsort(-scores, axis=None, kind="stable")[: min(2 * beam, scores.size)]
            survivors: list[tuple[float, list[int], int]] = []
            for rank, index in enumerate(order):
                parent, token = divmod(int(index), log_probs.shape[1])
                score, words = float(scores[parent, token]), hypotheses[parent][1]
                if token == eos:
                    if rank < beam:
                        finished.append((length_normalised(score, len(words), alpha), words))
                elif len(survivors) < beam:
                    survivors.append((score, [*words, token], parent))
            if len(finished) >= beam:
                break
            if step == max_len:
                finished += [(length_normalised(s, len(w), alpha), w) for s, w in hypotheses]
                break
            parents = np.array([p for _, _, p in survivors])
            past = [p[parents] for p in past]
            hypotheses = [(s, w) for s, w, _ in survivors]
            tokens = np.array([[w[-1]] for _, w in hypotheses], dtype=np.int64)
        return max(finished, key=lambda f: f[0])[1]
