"""Translation: parallel sentences, a joint tokenizer, teacher forcing with label smoothing, and
greedy or beam decoding with the decoder's cache through the shared search (tfcompile.search).

Data paths hold ``{lang}``, filled with the task's source and target names (Multi30k:
``train.{lang}.gz`` -> ``train.de.gz`` and ``train.en.gz``), one sentence a line, lines aligned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tfcompile import search
from tfcompile.data import DataError, train_tokenizer
from tfcompile.data.corpus import read_text, text_lines
from tfcompile.errors import DataWarning, ExportError
from tfcompile.graphs.export import Graph, export_seq2seq_encoder, export_seq2seq_step
from tfcompile.graphs.parity import check_seq2seq_encoder_parity, check_seq2seq_step_parity
from tfcompile.manifest import DEFAULT_LENGTH_PENALTY, TokenizerInfo, TranslationInfo
from tfcompile.models import Seq2Seq
from tfcompile.sequences import BOS, CLS, EOS, SEQ2SEQ_TOKENS, SPECIAL_ROLES, source_row, tidy
from tfcompile.spec.schema import EncoderDecoderSpec, Seq2SeqTask, Spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.tasks.task import (
    Batch,
    GateRule,
    ModelFn,
    Task,
    listed_sequences,
    listed_token_ids,
    pad_rows,
    register_task,
    special_ids,
    token_strings,
)

if TYPE_CHECKING:
    from tfcompile.runtime import Bundle


def read_parallel(path: Path, source: str, target: str) -> tuple[list[str], list[str]]:
    """The aligned lines of ``path`` with {lang} = source and = target (a spec's paths hold it:
    Seq2SeqTask.path_placeholder)."""
    mark = Seq2SeqTask.path_placeholder or ""
    if mark not in str(path):
        raise DataError(f"{path}: a translation data path holds {mark}, e.g. train.{mark}.gz")
    sides = []
    for lang in (source, target):
        file = Seq2SeqTask.side_file(path, lang)
        if not file.exists():
            raise DataError(f"no file at {file} ({mark} = {lang!r})")
        text = read_text(file)  # a FIFO, a damaged .gz or a byte that is not UTF-8: a DataError
        sides.append([line.strip() for line in text_lines(text)])
    if len(sides[0]) != len(sides[1]):
        raise DataError(f"{path}: {len(sides[0])} {source} lines but {len(sides[1])} {target} lines")
    one_sided = [n for n, (s, t) in enumerate(zip(*sides, strict=True), 1) if bool(s) != bool(t)]
    if one_sided:
        shown = ", ".join(map(str, one_sided[:5])) + (", ..." if len(one_sided) > 5 else "")
        warnings.warn(
            f"{path}: {len(one_sided)} line{'s are' if len(one_sided) > 1 else ' is'} blank on one side "
            f"only (line {shown}): a pair whose source is blank is left out, one whose target is blank "
            f"teaches an empty translation; are the two files in step?",
            DataWarning,
            stacklevel=2,
        )
    return sides[0], sides[1]


@register_task
class Translation(Task):
    section = Seq2SeqTask
    # The encoder runs once per source; the decoder step once per target token.
    graphs: ClassVar[dict[str, Graph]] = {
        "encoder": Graph("encoder", export_seq2seq_encoder, check_seq2seq_encoder_parity),
        "step": Graph("decoder_step", export_seq2seq_step, check_seq2seq_step_parity),
    }

    gate = GateRule("bleu", higher_is_better=True, tolerance={"int8": 0.5})

    @staticmethod
    def build_model(spec: Spec) -> Seq2Seq:
        assert isinstance(spec.model, EncoderDecoderSpec)
        return Seq2Seq(spec.model)

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        """Decoding settings; the start and stop ids are the translation tokenizer's [BOS] and [EOS]."""
        task = spec.task
        assert isinstance(task, Seq2SeqTask) and task.max_decode_len is not None
        specials = tokenizer.special_tokens if tokenizer is not None else {}
        start = specials["bos"].id if "bos" in specials else SEQ2SEQ_TOKENS.index(BOS)
        stop = specials["eos"].id if "eos" in specials else SEQ2SEQ_TOKENS.index(EOS)
        named = {role: specials[role].id for role in task.roles() if role in specials}
        roles = {"bos": start, "eos": stop} | named
        if "cls" in task.roles() and "cls" not in specials:  # tfcompile's reserved [CLS]
            roles["cls"] = task.reserved_tokens().index(CLS)
        missing = [f"task.{field}'s {role}" for role, field in task.roles().items() if role not in roles]
        if missing:
            raise ExportError(
                f"the run's tokenizer holds no token for {' and '.join(missing)}: export a run whose "
                f"tokenizer has the token the spec's tokens: section names"
            )
        ending = [role for role in task.target_prefix if roles[role] == stop]
        if ending:
            raise ExportError(
                f"task.target_prefix's {ending[0]} is the eos token, which would end every translation: "
                f"give the decoder another token"
            )
        banned = bans(task, run, stop, ExportError)
        translation = TranslationInfo(
            start_id=start,
            stop_id=stop,
            beam=task.beam,
            length_penalty=task.length_penalty,
            beam_scoring=task.beam_scoring,
            early_stopping=task.early_stopping,
            max_decode_len=task.max_decode_len,
            forced_eos=task.forced_eos,
            min_decode_len=banned.min_len,
            no_repeat_ngram_size=banned.no_repeat_ngram,
            suppressed_ids=list(banned.suppressed),
            banned_sequences=[list(sequence) for sequence in banned.sequences],
            source_prefix_ids=[roles[role] for role in task.source_prefix],
            source_suffix_ids=[roles[role] for role in task.source_suffix],
            target_prefix_ids=[roles[role] for role in task.target_prefix],
        )
        return {"translation": translation}

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        assert isinstance(spec.task, Seq2SeqTask) and spec.data is not None
        task, data = spec.task, spec.data
        self.task = task
        self.context = spec.context_length
        assert data.path is not None  # the schema's rule: a path, as builtin data is images
        source, target = read_parallel(data.path, task.source, task.target)
        if data.val_path is not None:
            val = read_parallel(data.val_path, task.source, task.target)
            train = (source, target)
        else:  # the last lines, as for language modelling
            n_val = max(1, int(len(source) * data.val_fraction))
            train, val = (source[:-n_val], target[:-n_val]), (source[-n_val:], target[-n_val:])
        # One vocabulary for both languages, so that the embeddings can be shared; a new one reserves
        # the language codes the spec's tokens: names (tfcompile has no strings of its own for them).
        strings = token_strings(spec)
        codes = [strings[role] for role in task.roles() if role not in SPECIAL_ROLES.values()]
        self.tokenizer: Tokenizer = tokenizer or train_tokenizer(
            data.tokenizer, train[0] + train[1], list(dict.fromkeys([*task.reserved_tokens(), *codes]))
        )
        roles = dict.fromkeys(["pad", "unk", "bos", "eos", *task.roles()])
        self.ids = special_ids(spec, self.tokenizer, list(roles))
        self.prefix = [self.ids[role] for role in task.source_prefix]
        self.suffix = [self.ids[role] for role in task.source_suffix]
        self.target_prefix = [self.ids[role] for role in task.target_prefix]
        self.bans = bans(task, self.tokenizer, self.ids["eos"], DataError)
        self.pairs = {"train": self._encode(*train), "val": self._encode(*val)}
        self.test = read_parallel(data.test_path, task.source, task.target) if data.test_path else None
        self.val = val
        held_out = f"data.val_path {data.val_path}" if data.val_path else f"data.val_fraction of {data.path}"
        sizes = {
            f"training split (data.path {data.path})": len(self.pairs["train"]),
            f"validation split ({held_out})": len(self.pairs["val"]),
            f"test split (data.test_path {data.test_path})": len(self.test[0]) if self.test else 1,
        }
        for split, size in sizes.items():
            if not size:  # caught before training, not at the first evaluation or after the last step
                raise DataError(
                    f"the {split} holds no sentence pair (training and validation leave out a pair "
                    f"whose source line is blank): give it aligned lines"
                )

    def _encode(self, source: list[str], target: list[str]) -> list[tuple[list[int], list[int]]]:
        """-> (source ids and the task's source affixes up to the context, [BOS] and the task's
        target prefix, the target, [EOS], up to the context + 1)."""
        start, eos = [self.ids["bos"], *self.target_prefix], self.ids["eos"]
        src = self.tokenizer.encode_batch(source, add_special_tokens=False)
        tgt = self.tokenizer.encode_batch(target, add_special_tokens=False)
        return [
            (self._source(s.ids), [*start, *t.ids[: self.context - len(start)], eos])
            for s, t in zip(src, tgt, strict=True)
            if s.ids
        ]

    def _source(self, ids: list[int]) -> list[int]:
        return source_row(ids, self.context, self.prefix, self.suffix, self.ids["unk"])

    def _collate(self, pairs: list[tuple[list[int], list[int]]]) -> Batch:
        return {
            "source_ids": pad_rows([s for s, _ in pairs], self.ids["pad"]),
            "source_mask": pad_rows([[1] * len(s) for s, _ in pairs], 0),
            "input_ids": pad_rows([t[:-1] for _, t in pairs], self.ids["pad"]),  # the target, shifted right
            "targets": pad_rows([t[1:] for _, t in pairs], IGNORE_INDEX),
        }

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        pairs = self.pairs[split]
        return self._collate(
            [pairs[i] for i in torch.randint(len(pairs), (size,), generator=generator).tolist()]
        )

    def eval_batches(
        self, count: int, size: int, generator_for: Callable[[int], torch.Generator]
    ) -> Iterator[Batch]:
        """The validation split in order, its first ``count`` batches (all of it when it holds
        fewer pairs): the loss and token accuracy count every target token of those pairs once,
        and a split of no more than count x size pairs reads the same whatever the batch size."""
        pairs = self.pairs["val"][: count * size]
        for start in range(0, len(pairs), size):
            yield self._collate(pairs[start : start + size])

    def _logits(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        target_mask = (batch["targets"] != IGNORE_INDEX).long()
        return model(batch["source_ids"], batch["source_mask"], batch["input_ids"], target_mask)

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        logits = self._logits(model, batch)
        return F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch["targets"].flatten(),
            ignore_index=IGNORE_INDEX,
            label_smoothing=self.task.label_smoothing,
        )

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        for batch in batches:
            logits, targets = self._logits(model, batch), batch["targets"]
            real = targets != IGNORE_INDEX
            loss_sum += F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            ).item()
            correct += (logits.argmax(-1) == targets)[real].sum().item()
            count += real.sum().item()
        return {"val_loss": loss_sum / count, "val_token_accuracy": correct / count}

    def translate(self, model: Seq2Seq, sentences: list[str], device: torch.device) -> list[str]:
        """Source sentences -> detokenized translations, with the task's beam search."""
        task, eos = self.task, self.ids["eos"]
        assert task.length_penalty is not None  # resolved by the schema
        scoring = search.beam_scoring(task.beam_scoring, task.length_penalty, task.early_stopping)
        start = [self.ids["bos"], *self.target_prefix]
        emitted = self.tokenizer.get_vocab_size()  # never a padded embedding row past the tokenizer
        assert task.max_decode_len is not None  # resolved by the schema
        out: list[str] = []
        for first in range(0, len(sentences), 64):
            encoded = self.tokenizer.encode_batch(sentences[first : first + 64], add_special_tokens=False)
            ids = [self._source(e.ids) for e in encoded]
            source = pad_rows(ids, self.ids["pad"]).to(device)
            mask = pad_rows([[1] * len(row) for row in ids], 0).to(device)
            tokens = translate_tokens(
                model,
                source,
                mask,
                start,
                eos,
                task.max_decode_len,
                task.beam,
                scoring,
                emitted,
                task.forced_eos,
                self.bans,
            )
            out += self.tokenizer.decode_batch(tokens)
        return [tidy(t) for t in out]

    def held_out(self, bundle: Bundle, limit: int | None) -> tuple[float, str]:
        """Corpus BLEU of the bundle's translations (its manifest's beam) of the test split (the
        validation split when there is none), its first ``limit`` (default 500) sentences."""
        from tfcompile.runtime import Translator

        assert isinstance(bundle, Translator)
        split, (sources, references) = (
            ("test", self.test) if self.test is not None else ("validation", self.val)
        )
        n = min(len(sources), limit or 500)
        hypotheses = bundle.translate(sources[:n])
        return bleu(hypotheses, references[:n]), f"{n} sentences of the {split} split"

    def test_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """BLEU of the test split: sacrebleu's corpus BLEU on detokenized, case-sensitive text."""
        if self.test is None:
            return {}
        assert isinstance(model, Seq2Seq)
        sources, references = self.test
        hypotheses = self.translate(model, sources, device)
        return {"test_bleu": bleu(hypotheses, references)}


def bans(
    task: Seq2SeqTask, tokenizer: Path | Tokenizer | None, eos: int | None, error: type[Exception]
) -> search.Bans:
    """What the task bans its translations (training's, the manifest's and export-hf's): its
    suppressed tokens and banned sequences (ids of the run's ``tokenizer``), min_decode_len and
    no_repeat_ngram_size;
    ``error`` names a suppressed token the tokenizer lacks, or the eos among them."""
    suppressed = listed_token_ids(task, "suppressed_tokens", tokenizer, error)
    if eos is not None and eos in suppressed:
        raise error(
            "task.suppressed_tokens holds the eos token, which ends every translation: leave it out "
            "(task.max_decode_len limits a translation's length)"
        )
    sequences = tuple(map(tuple, listed_sequences(task, "banned_sequences", tokenizer, error)))
    return search.Bans(tuple(suppressed), task.min_decode_len, task.no_repeat_ngram_size, sequences)


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacrebleu's corpus BLEU of detokenized, case-sensitive text, with its 13a tokenizer (its
    default, named so that a new default cannot change what runs report)."""
    return float(sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score)


class TorchTranslator:
    """A Seq2Seq model and its source sentences as a search.Decoder: the encoder runs once, each
    step feeds target tokens through the decoder's self-attention cache. ``emitted``: the logits
    of the ids below it only (a tokenizer smaller than the model's padded vocabulary)."""

    @torch.no_grad()
    def __init__(
        self,
        model: Seq2Seq,
        source_ids: torch.Tensor,
        source_mask: torch.Tensor | None,
        emitted: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.emitted = emitted
        self.memory = model.project_memory(model.encode(source_ids, source_mask))
        self.source_mask = source_mask
        self.batch = len(source_ids)
        self.reset()

    @torch.no_grad()
    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """``mask`` is None: target tokens are never padded (every row starts with [BOS])."""
        device = self.memory[0].key.device
        ids = torch.from_numpy(tokens).to(device)
        return (
            self.model.decode(ids, self.memory, self.source_mask, cache=self.cache)[:, -1, : self.emitted]
            .float()
            .cpu()
            .numpy()
        )

    def reorder(self, rows: np.ndarray) -> None:
        index = torch.from_numpy(rows).to(self.memory[0].key.device)
        for kv in (*self.cache, *self.memory):
            kv.key, kv.value = kv.key[index], kv.value[index]
        if self.source_mask is not None:
            self.source_mask = self.source_mask[index]
        self.batch = len(rows)

    def reset(self) -> None:
        self.cache = self.model.empty_cache(self.batch, self.memory[0].key.device)


# Beam search as Vaswani et al.'s: fairseq's, alpha 0.6.
FAIRSEQ = search.FairseqBeam(DEFAULT_LENGTH_PENALTY["fairseq"])


def translate_tokens(
    model: Seq2Seq,
    source_ids: torch.Tensor,
    source_mask: torch.Tensor,
    start: Sequence[int],
    eos: int,
    max_len: int,
    beam: int = 1,
    scoring: search.BeamScoring = FAIRSEQ,
    emitted: int | None = None,
    forced_eos: bool = False,
    bans: search.Bans = search.NO_BANS,
) -> list[list[int]]:
    """source (B, S) -> each sentence's target ids (below ``emitted``), without ``start`` ([BOS],
    then any tokens the decoder is given: task.target_prefix) and [EOS], the decoder holding at
    most ``max_len`` tokens after [BOS] (at most the model's max_seq_len - 1), the last of them
    [EOS] with ``forced_eos``, none that ``bans`` bans: greedy for ``beam`` 1, else beam search as
    ``scoring`` says, one sentence at a time, without its padding (search.translate)."""

    def decoder_for(row: int | None) -> TorchTranslator:
        if row is None:
            return TorchTranslator(model, source_ids, source_mask, emitted)
        return TorchTranslator(model, source_ids[row : row + 1, source_mask[row].bool()], None, emitted)

    limit = min(max_len, model.spec.max_seq_len - 1)
    return search.translate(decoder_for, len(source_ids), start, eos, limit, beam, scoring, forced_eos, bans)
