"""Translation: parallel sentences, a joint tokenizer, teacher forcing with label smoothing, and
greedy decoding with the decoder's cache.

Data paths hold ``{lang}``, filled with the task's source and target names (Multi30k:
``train.{lang}.gz`` -> ``train.de.gz`` and ``train.en.gz``), one sentence a line, lines aligned.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tfcompile.data import DataError, train_tokenizer
from tfcompile.data.tokenizer import BOS, EOS, PAD, SEQ2SEQ_TOKENS, UNK
from tfcompile.models import Seq2Seq
from tfcompile.nn.attention import KVCache
from tfcompile.sequences import length_normalised
from tfcompile.spec.schema import DataSpec, Seq2SeqTask
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.tasks.objective import Batch, ModelFn, Objective, pad_rows


def read_parallel(path: Path, source: str, target: str) -> tuple[list[str], list[str]]:
    """The aligned lines of ``path`` with {lang} = source and = target."""
    if "{lang}" not in str(path):
        raise DataError(f"{path}: a translation data path holds {{lang}}, e.g. train.{{lang}}.gz")
    sides = []
    for lang in (source, target):
        file = Path(str(path).replace("{lang}", lang))
        if not file.is_file():
            raise DataError(f"no file at {file} ({{lang}} = {lang!r})")
        text = gzip.decompress(file.read_bytes()).decode() if file.suffix == ".gz" else file.read_text()
        sides.append([line.strip() for line in text.splitlines()])
    if len(sides[0]) != len(sides[1]):
        raise DataError(f"{path}: {len(sides[0])} {source} lines but {len(sides[1])} {target} lines")
    return sides[0], sides[1]


class Seq2SeqObjective(Objective):
    def __init__(self, task: Seq2SeqTask, data: DataSpec, context: int, tokenizer: Tokenizer | None) -> None:
        self.task = task
        self.context = context
        source, target = read_parallel(data.path, task.source, task.target)
        if data.val_path is not None:
            val = read_parallel(data.val_path, task.source, task.target)
            train = (source, target)
        else:  # the last lines, as for language modelling
            n_val = max(1, int(len(source) * data.val_fraction))
            train, val = (source[:-n_val], target[:-n_val]), (source[-n_val:], target[-n_val:])
        # One vocabulary for both languages, so that the embeddings can be shared.
        self.tokenizer = tokenizer or train_tokenizer(data.tokenizer, train[0] + train[1], SEQ2SEQ_TOKENS)
        self.ids = {token: self.tokenizer.token_to_id(token) for token in SEQ2SEQ_TOKENS}
        if None in self.ids.values():
            raise DataError(
                f"the tokenizer lacks {', '.join(SEQ2SEQ_TOKENS)}: it was not made for translation"
            )
        self.pairs = {"train": self._encode(*train), "val": self._encode(*val)}
        self.test = read_parallel(data.test_path, task.source, task.target) if data.test_path else None

    def _encode(self, source: list[str], target: list[str]) -> list[tuple[list[int], list[int]]]:
        """-> (source ids up to the context, [BOS] target [EOS] up to the context + 1)."""
        bos, eos = self.ids[BOS], self.ids[EOS]
        src = self.tokenizer.encode_batch(source, add_special_tokens=False)
        tgt = self.tokenizer.encode_batch(target, add_special_tokens=False)
        return [
            (s.ids[: self.context], [bos, *t.ids[: self.context - 1], eos])
            for s, t in zip(src, tgt, strict=True)
            if s.ids
        ]

    def _collate(self, pairs: list[tuple[list[int], list[int]]]) -> Batch:
        return {
            "source_ids": pad_rows([s for s, _ in pairs], self.ids[PAD]),
            "source_mask": pad_rows([[1] * len(s) for s, _ in pairs], 0),
            "input_ids": pad_rows([t[:-1] for _, t in pairs], self.ids[PAD]),  # the target, shifted right
            "targets": pad_rows([t[1:] for _, t in pairs], IGNORE_INDEX),
        }

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        pairs = self.pairs[split]
        return self._collate(
            [pairs[i] for i in torch.randint(len(pairs), (size,), generator=generator).tolist()]
        )

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
        """Source sentences -> detokenized translations, with the task's beam and length penalty."""
        task, bos, eos = self.task, self.ids[BOS], self.ids[EOS]
        max_len = task.max_decode_len or model.spec.max_seq_len - 1
        out: list[str] = []
        for start in range(0, len(sentences), 64):
            encoded = self.tokenizer.encode_batch(sentences[start : start + 64], add_special_tokens=False)
            ids = [e.ids[: self.context] or [self.ids[UNK]] for e in encoded]
            source = pad_rows(ids, self.ids[PAD])
            source, mask = source.to(device), (source != self.ids[PAD]).long().to(device)
            if task.beam == 1:
                tokens = greedy_translate(model, source, mask, bos, eos, max_len)
            else:
                tokens = beam_translate(
                    model, source, mask, bos, eos, max_len, task.beam, task.length_penalty
                )
            out += self.tokenizer.decode_batch(tokens)
        return [t.strip() for t in out]

    def test_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """BLEU of the test split: sacrebleu's corpus BLEU on detokenized, case-sensitive text."""
        if self.test is None:
            return {}
        assert isinstance(model, Seq2Seq)
        sources, references = self.test
        hypotheses = self.translate(model, sources, device)
        return {"test_bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}


@torch.no_grad()
def greedy_translate(
    model: Seq2Seq, source_ids: torch.Tensor, source_mask: torch.Tensor, bos: int, eos: int, max_len: int
) -> list[list[int]]:
    """source (B, S) -> each sentence's target ids, without [BOS] and [EOS], up to ``max_len``
    tokens. The encoder runs once; each step feeds one token through the decoder's cache."""
    model.eval()
    B = source_ids.shape[0]
    memory = model.project_memory(model.encode(source_ids, source_mask))
    cache = model.empty_cache(B, source_ids.device)
    tokens = torch.full((B, 1), bos, dtype=torch.long, device=source_ids.device)
    out: list[list[int]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=source_ids.device)
    for _ in range(min(max_len, model.spec.max_seq_len - 1) + 1):
        next_ids = model.decode(tokens, memory, source_mask, cache=cache)[:, -1].argmax(-1)  # (B,)
        for row in (~done).nonzero().flatten().tolist():
            if next_ids[row] != eos and len(out[row]) < max_len:
                out[row].append(int(next_ids[row]))
        done |= (next_ids == eos) | torch.tensor([len(o) >= max_len for o in out], device=done.device)
        if done.all():
            break
        tokens = next_ids[:, None]
    return out


@torch.no_grad()
def beam_translate(
    model: Seq2Seq,
    source_ids: torch.Tensor,
    source_mask: torch.Tensor,
    bos: int,
    eos: int,
    max_len: int,
    beam: int = 4,
    length_penalty: float = 0.6,
) -> list[list[int]]:
    """Beam search, one source sentence at a time: keep the ``beam`` best partial translations by
    summed log-probability; a finished one is scored by log p / ((5 + length) / 6) ** alpha (Wu et
    al. 2016, as in Vaswani et al. 2017 with alpha 0.6). Beam 1 is greedy decoding."""
    model.eval()
    results = []
    for row in range(source_ids.shape[0]):
        real = source_mask[row].bool()
        src = source_ids[row : row + 1, real]
        memory = model.project_memory(model.encode(src, None))
        limit = min(max_len, model.spec.max_seq_len - 1)
        results.append(_beam_one(model, memory, bos, eos, limit, beam, length_penalty))
    return results


def _beam_one(
    model: Seq2Seq, memory: list[KVCache], bos: int, eos: int, max_len: int, beam: int, alpha: float
) -> list[int]:
    device = memory[0].key.device
    cache = model.empty_cache(1, device)
    hypotheses: list[tuple[float, list[int]]] = [(0.0, [])]  # (summed log p, tokens after [BOS])
    finished: list[tuple[float, list[int]]] = []  # (length-normalised score, tokens)
    tokens = torch.tensor([[bos]], device=device)
    for step in range(max_len + 1):
        n = len(hypotheses)
        expanded = [KVCache(kv.key.expand(n, -1, -1, -1), kv.value.expand(n, -1, -1, -1)) for kv in memory]
        log_probs = model.decode(tokens, expanded, None, cache=cache)[:, -1].float().log_softmax(-1)  # (n, V)
        scores = torch.tensor([score for score, _ in hypotheses], device=device)[:, None] + log_probs
        top = scores.flatten().topk(min(2 * beam, scores.numel()))
        survivors: list[tuple[float, list[int], int]] = []
        for rank, (score, index) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True)):
            parent, token = divmod(index, log_probs.shape[1])
            words = hypotheses[parent][1]
            if token == eos:
                # As in fairseq: [EOS] ends a hypothesis only from within the top `beam` candidates.
                if rank < beam:
                    finished.append((length_normalised(score, len(words), alpha), words))
            elif len(survivors) < beam:
                survivors.append((score, [*words, token], parent))
        if len(finished) >= beam:
            break
        if step == max_len:  # out of length: the current hypotheses end here, unfinished
            finished += [(length_normalised(score, len(words), alpha), words) for score, words in hypotheses]
            break
        parents = torch.tensor([parent for _, _, parent in survivors], device=device)
        for kv in cache:
            kv.key, kv.value = kv.key[parents], kv.value[parents]
        hypotheses = [(score, words) for score, words, _ in survivors]
        tokens = torch.tensor([[words[-1]] for _, words in hypotheses], device=device)
    return max(finished, key=lambda f: f[0])[1]
