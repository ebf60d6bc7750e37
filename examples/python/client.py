"""Serve a tfcompile bundle (format 2) with onnxruntime, tokenizers, numpy and Pillow alone.

Everything comes from the bundle's manifest.json: the graphs by role and their input and output
names, the tokenizer and its special tokens, padding, the context, the cache, stop tokens,
translation settings, labels and image preprocessing. This file does not import tfcompile.

    python client.py BUNDLE generate --prompt "ROMEO:" --prompt "JULIET:" [--max-new-tokens 20]
    python client.py BUNDLE generate --ids 5,6,7 --ids 8       (token ids, for bundles without a tokenizer)
    python client.py BUNDLE logits --prompt "ROMEO:"           (the full graph: the next token's logits)
    python client.py BUNDLE classify "a gorgeous movie" --pair "a premise" "a hypothesis"
    python client.py BUNDLE translate "Ein Hund rennt." [--beam 4]
    python client.py BUNDLE classify-image three.png digits.npy

Each command prints JSON (see README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image
from tokenizers import Tokenizer


class Bundle:
    """A bundle folder: its manifest, its files checked against their sha256, its graphs by role."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / "manifest.json").read_text())
        if self.manifest["format_version"] != 2:
            raise SystemExit(
                f"{folder}: bundle format {self.manifest['format_version']}, this client reads 2"
            )
        self.context = self.manifest["model"]["max_seq_len"]
        self.sessions: dict[str, Any] = {}
        info = self.manifest.get("tokenizer")
        self.tokenizer = Tokenizer.from_str(self.read(info["file"]).decode()) if info else None
        if self.tokenizer is not None:  # a row is padded as the manifest says, not as tokenizer.json may
            self.tokenizer.no_padding()
        # The ids generation and translation may pick: the tokenizer's (added tokens included); an
        # embedding table can hold more rows (a Hugging Face T5: 32,128 logits, 32,100 tokens).
        self.emitted = self.tokenizer.get_vocab_size() if self.tokenizer else None
        refuse_what_the_runtime_refuses(self)

    def read(self, name: str) -> bytes:
        """A listed file's bytes, refused unless their sha256 is the manifest's."""
        data = (self.folder / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != self.manifest["files"][name]:
            raise SystemExit(f"{self.folder / name} changed after export: its sha256 is not the manifest's")
        return data

    def graph(self, role: str) -> tuple[dict, Any]:
        """The manifest's entry for the graph with this role, and an onnxruntime session on it."""
        found = [(n, g) for n, g in self.manifest["graphs"].items() if g["role"] == role]
        if not found:
            raise SystemExit(f"{self.folder} has no {role} graph: a {self.manifest['task']} bundle")
        name, graph = found[0]
        if name not in self.sessions:
            self.sessions[name] = ort.InferenceSession(
                self.read(graph["file"]), providers=["CPUExecutionProvider"]
            )
        return graph, self.sessions[name]

    def special_id(self, role: str) -> int:
        return self.manifest["tokenizer"]["special_tokens"][role]["id"]

    def encode(self, texts: list, add_special_tokens: bool = True) -> list:
        """Texts (or pairs) -> encodings. The post-processor adds the roles in
        tokenizer.added_by_tokenizer itself ([CLS], [SEP]): the client adds none. Where a
        truncation of one sentence of a pair (only_first, only_second) cannot make the room, the
        library fails; tfcompile's runtime cuts that text or pair longest-first, and so does this."""
        encodings, longest_first = [], None
        for text in texts:
            try:
                encodings += self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
            except Exception as e:
                if not str(e).startswith("Truncation error"):  # unknown == "refuse": a character
                    raise SystemExit(f"a text holds characters outside the vocabulary: {text}") from None
                if longest_first is None:  # built once, for the first text the truncation fails on
                    cut = self.tokenizer.truncation
                    longest_first = Tokenizer.from_str(self.tokenizer.to_str())
                    longest_first.enable_truncation(
                        cut["max_length"], strategy="longest_first", direction=cut["direction"]
                    )
                encodings += longest_first.encode_batch([text], add_special_tokens=add_special_tokens)
        return encodings

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# The side each task's rows are padded on: a decoder's new tokens follow each row's last real token;
# a classifier's and a translator's rows start at position 0. What the graphs were checked with.
PADDING_SIDES = {"causal_lm": "left", "classification": "right", "seq2seq": "right"}


def refuse_what_the_runtime_refuses(bundle: Bundle) -> None:
    """A manifest the runtime refuses at load, which this client would serve otherwise than it was
    checked (no error, other results): refused here too, at load, in one line."""
    m, where = bundle.manifest, bundle.folder
    side = PADDING_SIDES.get(m["task"])
    if side and m["padding"]["side"] != side:
        raise SystemExit(
            f"{where}: the manifest's padding.side is {m['padding']['side']!r}, where a {m['task']} "
            f"bundle's rows are padded on the {side}"
        )
    if m["task"] == "causal_lm" and m["generation"]["context_length"] != m["model"]["max_seq_len"]:
        raise SystemExit(
            f"{where}: the manifest's generation.context_length ({m['generation']['context_length']}) "
            f"is not model.max_seq_len ({m['model']['max_seq_len']}), the context its graphs were checked at"
        )
    if m["task"] == "seq2seq" and bundle.tokenizer is not None:
        if not m["translation"]["stop_id"] < bundle.emitted:
            raise SystemExit(
                f"{where}: translation.stop_id {m['translation']['stop_id']} is outside the "
                f"tokenizer's {bundle.emitted} tokens: no translation could end"
            )
        if "unk" not in m["tokenizer"]["special_tokens"]:
            raise SystemExit(
                f"{where}: the manifest's tokenizer names no unk token, which an empty source is read as"
            )
    if bundle.tokenizer is not None:
        refuse_truncation(bundle)


def refuse_truncation(bundle: Bundle) -> None:
    """tokenizer.json's truncation must be the manifest's tokenizer.truncation, where it gives one
    (a decoder's prompt and a translator's source are cut as tokenizer.json says, a classifier's
    text as the manifest does), and keep at least one token of a text besides the special tokens it
    adds: below that (max_length 2 for [CLS] and [SEP]) the tokenizers library fails on every text
    it cuts."""
    cut, said = bundle.tokenizer.truncation, bundle.manifest["tokenizer"].get("truncation")
    held = {k: cut[k] for k in ("max_length", "strategy", "direction")} if cut else None
    where = bundle.folder / bundle.manifest["tokenizer"]["file"]
    if said is not None and held != {k: said.get(k) for k in ("max_length", "strategy", "direction")}:
        raise SystemExit(f"{where} truncates as {held}, but the manifest's tokenizer.truncation says {said}")
    processor = bundle.tokenizer.post_processor
    added = processor.num_special_tokens_to_add(False) if processor else 0
    if cut is not None and cut["stride"] >= cut["max_length"] - added:
        raise SystemExit(
            f"{where}: its truncation's stride {cut['stride']} is not below the {cut['max_length']} "
            f"tokens it keeps less the {added} special tokens it adds to a text"
        )


def pad(rows: list[list[int]], value: int, side: str) -> np.ndarray:
    """Rows of ids -> (rows, longest) int64, filled out with ``value`` on ``side``."""
    width = max(len(row) for row in rows)
    filled = [
        [value] * (width - len(r)) + r if side == "left" else r + [value] * (width - len(r)) for r in rows
    ]
    return np.array(filled, dtype=np.int64)


def padding(bundle: Bundle) -> tuple[int, str]:
    """padding.pad_id and padding.side: the attention mask hides padding, whatever its id."""
    info = bundle.manifest["padding"]
    return info["pad_id"], info["side"]


def empty_cache(graph: dict, batch: int) -> dict[str, np.ndarray]:
    """Every ``past`` input with its cache axis at 0 (shape, dtype and names from the manifest)."""
    cache, inputs = graph["cache"], {t["name"]: t for t in graph["inputs"]}
    sizes = {"batch": batch, cache["axis"]: 0}
    return {
        name: np.zeros([sizes.get(d, d) for d in inputs[name]["shape"]], dtype=inputs[name]["dtype"])
        for name in cache["past"]
    }


def run(session: Any, graph: dict, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run: float inputs take the graph's float type (fp16 bundles), outputs come back by name."""
    types = {t["name"]: t["dtype"] for t in graph["inputs"]}
    feed = {k: v.astype(types[k]) if v.dtype.kind == "f" else v for k, v in feed.items()}
    names = [t["name"] for t in graph["outputs"]]
    return dict(zip(names, session.run(names, feed), strict=True))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def probabilities(logits: np.ndarray, labels: list[str]) -> list[dict]:
    """(batch, labels) logits -> each row's likeliest label and every label's probability."""
    if logits.shape[-1] != len(labels):  # a manifest of other labels would name the wrong classes
        raise SystemExit(
            f"the manifest names {len(labels)} labels, but the graph gives {logits.shape[-1]} logits a row"
        )
    probs = np.exp(logits - logits.max(-1, keepdims=True).astype(np.float64))
    probs /= probs.sum(-1, keepdims=True)
    return [
        {"label": labels[int(p.argmax())], "probabilities": dict(zip(labels, map(float, p), strict=True))}
        for p in probs
    ]


# ------------------------------------------------------------------------ decoders (causal_lm)


def prompt_ids(bundle: Bundle, prompts: list[str], ids: list[str]) -> list[list[int]]:
    """--prompt texts, encoded, or --ids rows of token ids."""
    if prompts and ids:
        raise SystemExit("give --prompt or --ids, not both")
    vocab = bundle.manifest["model"]["vocab_size"]
    rows = (
        [e.ids for e in bundle.encode(prompts)]
        if prompts
        else [token_ids(r, i, vocab) for i, r in enumerate(ids)]
    )
    if not rows or not all(rows):
        raise SystemExit("give at least one prompt, each of at least one token")
    return rows


def token_ids(row: str, i: int, vocab: int) -> list[int]:
    """An --ids row: comma-separated integers in [0, model.vocab_size), as the runtime takes them
    (an empty item, "-1" or "1.5" is refused, not read as a token)."""
    items = [item.strip() for item in row.split(",")]
    for j, item in enumerate(items):
        if not (item.isascii() and item.isdigit() and int(item) < vocab):
            raise SystemExit(f"--ids row {i}, item {j}: {item!r} is not a token id in [0, {vocab})")
    return [int(item) for item in items]


def generate(bundle: Bundle, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy generation with the KV cache for a batch of prompts of different lengths, left-padded
    (tokenizer.padding_side): attention_mask, 0 at padding, covers the cached and the new tokens at
    every step, and positions come from it, so each row generates what it would alone. A row ends
    at its first stop token (returned as its last). Past the context, each step re-reads the last
    context_length tokens from an empty cache. The logits of the tokens a row holds (real ones)
    are penalised first, as the manifest's repetition_penalty says (1 by default: not), then its
    bans set to -inf: the stop tokens while the row has fewer than min_new_tokens new ones or
    min_length in all, and what ``ban_tokens`` bans over the row's real tokens. A row whose every
    token is banned ends there."""
    graph, session = bundle.graph("decode_step")
    g = bundle.manifest["generation"]
    penalty = g.get("repetition_penalty", 1.0)
    cache, context = graph["cache"], g["context_length"]
    stops = set(g["stop_token_ids"])
    pad_id, side = padding(bundle)
    ids, mask = pad(prompts, pad_id, side), pad([[1] * len(p) for p in prompts], 0, side)
    new: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    past = empty_cache(graph, len(prompts))
    tokens, cached = ids[:, -context:], 0  # the window the next run reads, and the tokens in the cache
    for _ in range(max_new_tokens):
        cached += tokens.shape[1]
        out = run(session, graph, {"input_ids": tokens, "attention_mask": mask[:, -cached:], **past})
        logits = out["logits"][:, -1, : bundle.emitted].copy()
        for row in range(len(prompts)) if penalty != 1 else ():  # each token the row holds, once
            seen = np.unique(ids[row][mask[row] == 1])
            seen = seen[seen < logits.shape[1]]
            logits[row, seen] = np.where(
                logits[row, seen] < 0, logits[row, seen] * penalty, logits[row, seen] / penalty
            )
        for row in range(len(prompts)):
            real = ids[row][mask[row] == 1].tolist()
            if len(new[row]) < g.get("min_new_tokens", 0) or len(real) < g.get("min_length", 0):
                logits[row, [s for s in stops if s < logits.shape[1]]] = -np.inf
            ban_tokens(logits[row], real, g)
            done[row] = done[row] or bool(np.isneginf(logits[row]).all())
        next_ids = logits.argmax(-1)
        for row, token in enumerate(next_ids.tolist()):
            if not done[row]:
                new[row].append(token)
                done[row] = token in stops
        if all(done):
            break
        ids = np.concatenate([ids, next_ids[:, None]], axis=1)
        mask = np.concatenate([mask, np.ones_like(next_ids[:, None])], axis=1)
        past = dict(zip(cache["past"], (out[name] for name in cache["present"]), strict=True))
        tokens = next_ids[:, None]
        if cached == context:  # the window is full: slide it, from an empty cache
            past, tokens, cached = empty_cache(graph, len(prompts)), ids[:, -context:], 0
    return new


def last_logits(bundle: Bundle, prompts: list[list[int]]) -> np.ndarray:
    """The full graph over left-padded prompts: the logits that follow each prompt's last token."""
    graph, session = bundle.graph("forward")
    pad_id, side = padding(bundle)
    ids, mask = pad(prompts, pad_id, side), pad([[1] * len(p) for p in prompts], 0, side)
    return run(session, graph, {"input_ids": ids, "attention_mask": mask})["logits"][:, -1]


# ------------------------------------------------------------------------ text classifiers


def classify(bundle: Bundle, items: list) -> list[dict]:
    """Sentences or (first, second) pairs -> probabilities per label. Right-padded; the graph
    takes the inputs the manifest lists (input_ids, attention_mask, token_type_ids)."""
    graph, session = bundle.graph("forward")
    pad_id, side = padding(bundle)
    # A text or pair past the context is cut as the manifest's truncation says, at no more than
    # the context; without one, longest-first from the right at the context.
    cut = bundle.manifest["tokenizer"].get("truncation") or {}
    bundle.tokenizer.enable_truncation(
        min(cut.get("max_length", bundle.context), bundle.context),
        strategy=cut.get("strategy", "longest_first"),
        direction=cut.get("direction", "right"),
    )
    encodings = bundle.encode(items)
    feed = {
        "input_ids": pad([e.ids for e in encodings], pad_id, side),
        "attention_mask": pad([[1] * len(e.ids) for e in encodings], 0, side),
        "token_type_ids": pad([e.type_ids for e in encodings], 0, side),
    }
    logits = run(session, graph, {t["name"]: feed[t["name"]] for t in graph["inputs"]})["logits"]
    return probabilities(logits, bundle.manifest["labels"])


# ------------------------------------------------------------------------ translators (seq2seq)


class TranslationDecoder:
    """The encoder graph once over the sources, then the decoder step graph one target token at a
    time, with the self-attention cache and the encoder's memory_* outputs fed back by name."""

    def __init__(self, bundle: Bundle, source_ids: np.ndarray, source_mask: np.ndarray) -> None:
        encoder, session = bundle.graph("encoder")
        self.memory = run(session, encoder, {"source_ids": source_ids, "source_mask": source_mask})
        self.graph, self.session = bundle.graph("decoder_step")
        self.source_mask = source_mask
        self.past = empty_cache(self.graph, len(source_ids))
        self.emitted = bundle.emitted

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (rows, n) -> logits (rows, vocab) of the token after them, the tokenizer's ids only."""
        feed = {"input_ids": tokens, "source_mask": self.source_mask, **self.past, **self.memory}
        out = run(self.session, self.graph, feed)
        cache = self.graph["cache"]
        self.past = dict(zip(cache["past"], (out[name] for name in cache["present"]), strict=True))
        return out["logits"][:, -1, : self.emitted]

    def keep(self, rows: list[int]) -> None:
        """Row i of the cache, the memory and the source mask becomes the old row ``rows[i]``."""
        self.past = {k: v[rows] for k, v in self.past.items()}
        self.memory = {k: v[rows] for k, v in self.memory.items()}
        self.source_mask = self.source_mask[rows]


def translate(bundle: Bundle, texts: list[str], beam: int | None = None) -> list[list[int]]:
    """Sentences -> target ids, without the start and stop tokens. Greedy (beam 1) decodes the
    batch at once (right-padded sources); beam search decodes one sentence at a time."""
    t = bundle.manifest["translation"]
    beam = t["beam"] if beam is None else beam
    # The decoder reads the start token, then the tokens it is given (NLLB's target language code),
    # before it chooses any; max_decode_len counts them all after the start, which takes a position too.
    # With forced_eos the last of those places is the stop token's: a translation cut there is a token
    # shorter.
    start = [t["start_id"], *t.get("target_prefix_ids", [])]
    limit = min(t["max_decode_len"], bundle.context - 1) - (len(start) - 1)
    # Sources are cut to leave room for the prefix (BART's <s>) and the suffix (T5's </s>); an empty
    # one reads as [UNK].
    prefix, suffix = t.get("source_prefix_ids", []), t.get("source_suffix_ids", [])
    sources = [
        prefix + (e.ids[: bundle.context - len(prefix) - len(suffix)] or [bundle.special_id("unk")]) + suffix
        for e in bundle.encode(texts, False)
    ]
    if beam > 1:  # one sentence at a time, unpadded
        alone = [(np.array([s], dtype=np.int64), np.ones((1, len(s)), dtype=np.int64)) for s in sources]
        search = transformers_beam_search if t.get("beam_scoring") == "transformers" else beam_search
        return [search(TranslationDecoder(bundle, *source), start, t, limit, beam) for source in alone]
    pad_id, side = padding(bundle)
    ids, mask = pad(sources, pad_id, side), pad([[1] * len(s) for s in sources], 0, side)
    decoder = TranslationDecoder(bundle, ids, mask)
    new: list[list[int]] = [[] for _ in sources]
    done = [False] * len(sources)
    tokens = np.tile(np.array(start, dtype=np.int64), (len(sources), 1))
    for _ in range(limit - 1 if t.get("forced_eos") else limit):
        logits = decoder.step(tokens).copy()
        ban(t, logits, [start + row for row in new])
        tokens = logits.argmax(-1)[:, None]
        for row, token in enumerate(tokens[:, 0].tolist()):  # every token banned: the row ends
            done[row] = done[row] or token == t["stop_id"] or bool(np.isneginf(logits[row]).all())
            if not done[row]:
                new[row].append(token)
        if all(done):
            break
    return new


def ban(t: dict, scores: np.ndarray, sequences: list[list[int]]) -> None:
    """scores (rows, vocab), in place: -inf at each token row i's next may not be, after its
    tokens ``sequences[i]`` (the start on): the stop token while fewer than min_decode_len tokens
    follow the start, and what ``ban_tokens`` bans."""
    for row, sequence in enumerate(sequences):
        if len(sequence) - 1 < t.get("min_decode_len", 0):
            scores[row, t["stop_id"]] = -np.inf
        ban_tokens(scores[row], sequence, t)


def ban_tokens(scores: np.ndarray, sequence: list[int], bans: dict) -> None:
    """scores (vocab,) of the token after ``sequence``, in place, as the manifest's section
    ``bans`` (generation or translation) says: -inf at each of its suppressed_ids, at each token
    that would end an n-gram of no_repeat_ngram_size tokens found earlier in the sequence (0:
    none), and at the last token of each of its banned_sequences whose others end the sequence."""
    width, n = len(scores), bans.get("no_repeat_ngram_size", 0)
    scores[[i for i in bans.get("suppressed_ids", []) if i < width]] = -np.inf
    for *head, word_end in bans.get("banned_sequences", []):
        if word_end < width and len(head) <= len(sequence) and sequence[len(sequence) - len(head) :] == head:
            scores[word_end] = -np.inf
    last = sequence[len(sequence) - n + 1 :]  # the n - 1 tokens a next one follows
    for i in range(len(sequence) - n + 1 if n else 0):
        if sequence[i : i + n - 1] == last and sequence[i + n - 1] < width:
            scores[sequence[i + n - 1]] = -np.inf


def beam_search(decoder: TranslationDecoder, start: list[int], t: dict, limit: int, beam: int) -> list[int]:
    """One sentence, after the tokens ``start`` (not scored): keep the ``beam`` best hypotheses by
    summed log-probability; the stop token
    ends a hypothesis only from within the top ``beam`` candidates; a finished hypothesis scores
    log p / ((5 + length) / 6) ** length_penalty. Ends when ``beam`` have finished or at the limit
    (with forced_eos, a step before it: every hypothesis then ends with the stop token, scored).
    What ``ban`` bans scores -inf (the other tokens keep their log-probabilities) and is never
    taken: a hypothesis whose every token is banned finishes as it is."""

    def score(log_p: float, length: int) -> float:
        return log_p / ((5 + length) / 6) ** t["length_penalty"]

    hypotheses: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    log_probs = log_softmax(decoder.step(np.array([start], dtype=np.int64)))
    for step in range(limit + 1):
        if t.get("forced_eos") and step == limit - 1:  # the last place is the stop token's
            finished += [
                (score(s + log_probs[row, t["stop_id"]], len(w)), w) for row, (s, w) in enumerate(hypotheses)
            ]
            break
        ban(t, log_probs, [start + w for _, w in hypotheses])
        ended = np.isneginf(log_probs).all(axis=1).tolist()
        finished += [(score(s, len(w)), w) for (s, w), e in zip(hypotheses, ended, strict=True) if e]
        scores = np.array([s for s, _ in hypotheses])[:, None] + log_probs  # (hypotheses, vocab)
        order = np.argsort(-scores, axis=None, kind="stable")[: 2 * beam]  # ties: the lower index first
        survivors: list[tuple[float, list[int], int]] = []
        for rank, index in enumerate(order.tolist()):
            parent, token = divmod(index, scores.shape[1])
            total, words = float(scores[parent, token]), hypotheses[parent][1]
            if total == -np.inf:  # banned, as every candidate after it
                break
            if token == t["stop_id"]:
                if rank < beam:
                    finished.append((score(total, len(words)), words))
            elif len(survivors) < beam:
                survivors.append((total, [*words, token], parent))
        if len(finished) >= beam:
            break
        if step == limit:  # out of length: the current hypotheses end here, unfinished
            finished += [(score(s, len(w)), w) for (s, w), e in zip(hypotheses, ended, strict=True) if not e]
            break
        if not survivors:
            break
        decoder.keep([parent for _, _, parent in survivors])
        hypotheses = [(total, words) for total, words, _ in survivors]
        log_probs = log_softmax(decoder.step(np.array([[w[-1]] for _, w in hypotheses], dtype=np.int64)))
    return max(finished, key=lambda f: f[0])[1]


def transformers_beam_search(
    decoder: TranslationDecoder, start: list[int], t: dict, limit: int, beam: int
) -> list[int]:
    """transformers' generate() beam search (beam_scoring "transformers"): ``beam`` hypotheses,
    the first scoring 0 and the others -1e9; each step the 2 x ``beam`` best candidates, of which
    those among the first ``beam`` that end (the stop token, or the last place) finish, scored
    log p / length ** length_penalty (length: the tokens after the start token, the prefix's and
    the stop token included), the best ``beam`` kept; the next hypotheses are the ``beam`` best
    candidates, an ending one lowered by 1e9. With forced_eos the last place is the stop token's,
    at log-probability 0. It ends at the last place, or as early_stopping says."""
    stop, penalty, early = t["stop_id"], t["length_penalty"], t.get("early_stopping", False)
    given = len(start) - 1
    scores = np.array([0.0] + [-1e9] * (beam - 1))
    hypotheses: list[list[int]] = [[] for _ in range(beam)]
    rows = [0] * beam  # each hypothesis's row of the decoder's cache
    finished: list[tuple[float, list[int]]] = []  # best first
    logits = decoder.step(np.array([start], dtype=np.int64))
    for step in range(limit):
        log_probs = log_softmax(logits)[rows]
        ban(t, log_probs, [start + h for h in hypotheses])
        last = step == limit - 1
        if t.get("forced_eos") and last:  # the last place is the stop token's, unscored
            log_probs[:] = -np.inf
            log_probs[:, stop] = 0.0
        totals = (scores[:, None] + log_probs).reshape(-1)
        order = np.argsort(-totals, kind="stable")[: 2 * beam]  # ties: the lower index first
        vocab = log_probs.shape[1]
        candidates = [(float(totals[i]), i // vocab, i % vocab) for i in order.tolist()]
        length = given + step + 1
        for total, parent, token in candidates[:beam]:
            if (token == stop or last) and total > -np.inf:
                words = hypotheses[parent] + ([] if token == stop else [token])
                finished.append((total / length**penalty, words))
        finished = sorted(finished, key=lambda f: -f[0])[:beam]
        if last:
            break
        live = sorted(candidates, key=lambda c: -(c[0] - 1e9 if c[2] == stop else c[0]))[:beam]
        scores = np.array([total - 1e9 if token == stop else total for total, _, token in live])
        hypotheses = [hypotheses[parent] + [token] for _, parent, token in live]
        full = len(finished) == beam
        if early is True and full:
            break
        longest = given + limit if early == "never" and penalty > 0 else length
        if not scores[0] / longest**penalty > (finished[-1][0] if full else -1e9):
            break  # no live hypothesis can beat the finished ones
        decoder.keep([rows[parent] for _, parent, _ in live])
        rows = list(range(len(live)))
        logits = decoder.step(np.array([[token] for _, _, token in live], dtype=np.int64))
    return finished[0][1] if finished else []


# ------------------------------------------------------------------------ image classifiers


def preprocess(image_info: dict, source: str | np.ndarray) -> np.ndarray:
    """An image file or array -> (channels, size, size) float32, as the manifest's image section
    says: decode to channel_order; uint8 / divide_by (floats are taken as already in [0, 1]); resize
    (Pillow's bilinear filter, per channel, in float32) the shorter side to size (the longer side
    rounded half to even), or with resize "stretch" both sides, unless the image is already
    size x size; crop the centre; normalise."""
    size, channels = image_info["size"], image_info["channels"]
    if isinstance(source, np.ndarray):
        array = checked_array(source, channels)
    else:
        with Image.open(source) as image:
            if image.mode.startswith("I;16"):  # 16-bit grey: the high byte, as in 16-bit colour
                image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
            if image.mode in ("I", "F"):
                raise SystemExit(f"{source}: 32-bit samples; give 8 or 16 bits per sample")
            array = np.asarray(image.convert(image_info["channel_order"]))
    array = array.reshape(*array.shape[:2], channels)
    if array.dtype == np.uint8:
        array = array.astype(np.float32) / np.float32(image_info["divide_by"])
    array = array.astype(np.float32)
    H, W = array.shape[:2]
    if (H, W) != (size, size):
        scale = size / min(H, W)
        h, w = max(size, round(H * scale)), max(size, round(W * scale))
        if image_info.get("resize") == "stretch":  # as transformers' ViTImageProcessor
            h, w = size, size
        planes = [Image.fromarray(np.ascontiguousarray(array[:, :, c])) for c in range(channels)]  # mode F
        resized = [np.asarray(p.resize((w, h), Image.Resampling.BILINEAR)) for p in planes]
        top, left = (h - size) // 2, (w - size) // 2
        array = np.stack(resized, axis=-1)[top : top + size, left : left + size]
    mean, std = np.float32(image_info["mean"]), np.float32(image_info["std"])
    return ((array - mean) / std).transpose(2, 0, 1).astype(np.float32)  # layout NCHW


def checked_array(array: np.ndarray, channels: int) -> np.ndarray:
    """An image array as the runtime takes it: (height, width, channels), or (height, width) for one
    channel; uint8 (0-255) or floats in [0, 1]. Anything else is refused, not read as something else
    (an int64 array of 0-255 as floats, say)."""
    if array.ndim == 2 and channels == 1:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] != channels or 0 in array.shape:
        raise SystemExit(f"an image array must have shape (height, width, {channels}), got {array.shape}")
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise SystemExit(f"image arrays must be uint8 (0-255) or float (0-1), got {array.dtype}")
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
        raise SystemExit(
            f"a float image array must hold values in [0, 1], found [{array.min():g}, {array.max():g}]"
        )
    return array


def classify_images(bundle: Bundle, sources: list) -> list[dict]:
    graph, session = bundle.graph("forward")
    pixels = np.stack([preprocess(bundle.manifest["image"], s) for s in sources])
    logits = run(session, graph, {"pixel_values": pixels})["logits"]
    return probabilities(logits, bundle.manifest["labels"])


def image_source(path: str) -> str | np.ndarray:
    """An image file, or a .npy array: (H, W) or (H, W, C), uint8 0-255 or float 0-1."""
    return np.load(path) if path.endswith(".npy") else path


# ------------------------------------------------------------------------ command line


# What each command serves: the manifest's task.
TASKS = {
    "generate": "causal_lm",
    "logits": "causal_lm",
    "classify": "classification",
    "translate": "seq2seq",
    "classify-image": "image_classification",
}


def whole(minimum: int) -> Any:
    """An argparse type: a whole number >= minimum, as the runtime takes them (beam >= 1,
    max_new_tokens >= 0)."""

    def parse(text: str) -> int:
        number = text.strip().removeprefix("-")
        if not (number.isascii() and number.isdigit() and int(text) >= minimum):
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}")
        return int(text)

    return parse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "logits"):
        command = commands.add_parser(name)
        command.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable)")
        command.add_argument("--ids", action="append", default=[], help="a prompt as comma-separated ids")
        command.add_argument("--max-new-tokens", type=whole(0), default=None)
    command = commands.add_parser("classify")
    command.add_argument("texts", nargs="*")
    command.add_argument("--pair", nargs=2, action="append", default=[], metavar=("FIRST", "SECOND"))
    command = commands.add_parser("translate")
    command.add_argument("texts", nargs="+")
    command.add_argument(
        "--beam", type=whole(1), default=None, help="default: the manifest's translation.beam"
    )
    commands.add_parser("classify-image").add_argument("images", nargs="+")
    args = parser.parse_args(argv)

    bundle = Bundle(args.bundle)
    task, needed = bundle.manifest["task"], TASKS[args.command]
    if task != needed:
        raise SystemExit(f"{args.bundle} holds a {task} model: {args.command} needs a {needed} one")
    if args.command == "generate":
        prompts = prompt_ids(bundle, args.prompt, args.ids)
        default = bundle.manifest["generation"]["max_new_tokens"]
        count = default if args.max_new_tokens is None else args.max_new_tokens
        stops = bundle.manifest["generation"]["stop_token_ids"]
        out: Any = []
        for prompt, new in zip(prompts, generate(bundle, prompts, count), strict=True):
            text = bundle.decode(prompt + [t for t in new if t not in stops]) if bundle.tokenizer else None
            out.append({"prompt_ids": prompt, "new_ids": new, "text": text})
    elif args.command == "logits":  # the full graph reads no more than the context (generation slides)
        prompts = prompt_ids(bundle, args.prompt, args.ids)
        long = next((p for p in prompts if len(p) > bundle.context), None)
        if long:
            raise SystemExit(f"a prompt of {len(long)} tokens is longer than the context ({bundle.context})")
        out = last_logits(bundle, prompts).tolist()
    elif args.command == "classify":
        items = args.texts + [tuple(p) for p in args.pair]
        if not items:
            raise SystemExit("give at least one text or --pair to classify")
        out = classify(bundle, items)
    elif args.command == "translate":
        targets = translate(bundle, args.texts, args.beam)
        out = [{"ids": ids, "text": bundle.decode(ids).strip(" \t\n\r\f\v")} for ids in targets]
    else:
        out = classify_images(bundle, [image_source(p) for p in args.images])
    json.dump(out, sys.stdout, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
