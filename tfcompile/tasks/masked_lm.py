"""Masked language modelling and next-sentence prediction (BERT, Devlin et al. 2019).

The corpus is split into lines (tiny shakespeare: consecutive lines are real next sentences).
An example packs consecutive lines into ``[CLS] A [SEP]``, or with next-sentence prediction into
``[CLS] A [SEP] B [SEP]`` where B follows A half of the time and otherwise starts at a random line
other than the one that follows A.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tfcompile.data import DataError, read_corpus, text_lines, train_tokenizer
from tfcompile.models import MaskedLM
from tfcompile.spec.schema import EncoderSpec, MaskedLMTask, Spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.tasks.task import Batch, ModelFn, Task, pad_rows, register_task, special_ids

SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")  # none of them is masked or drawn at random


@dataclass(frozen=True)
class MaskingRule:
    mask_prob: float = 0.15  # of the maskable tokens: chosen for the loss
    mask_token_prob: float = 0.8  # of the chosen: replaced by [MASK]
    random_token_prob: float = 0.1  # of the chosen: replaced by a random non-special token


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    rule: MaskingRule,
    mask_id: int,
    replacements: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (B, T), maskable (B, T) bool (False at special and padding tokens) ->
    (corrupted input_ids, targets): targets hold the original id at the chosen positions and
    IGNORE_INDEX elsewhere. Random replacements are drawn from the ids ``replacements`` (1-D).
    Every row with a maskable token has one chosen at least, as in BERT's data (max(1, round(n *
    mask_prob)) per example): a short example could otherwise leave a whole batch without a
    target, and its loss a mean over nothing (NaN)."""
    chosen = (torch.rand(input_ids.shape, generator=generator) < rule.mask_prob) & maskable
    unchosen = maskable.any(-1) & ~chosen.any(-1)  # (B,)
    if unchosen.any():  # one maskable position of each such row, at random
        scores = torch.where(maskable, torch.rand(input_ids.shape, generator=generator), -1.0)
        rows = unchosen.nonzero()[:, 0]
        chosen[rows, scores[rows].argmax(-1)] = True
    targets = torch.where(chosen, input_ids, IGNORE_INDEX)
    fate = torch.rand(input_ids.shape, generator=generator)
    to_mask = chosen & (fate < rule.mask_token_prob)
    to_random = (
        chosen & (fate >= rule.mask_token_prob) & (fate < rule.mask_token_prob + rule.random_token_prob)
    )
    random_tokens = replacements[torch.randint(len(replacements), input_ids.shape, generator=generator)]
    corrupted = torch.where(to_mask, mask_id, torch.where(to_random, random_tokens, input_ids))
    return corrupted, targets


@register_task
class MaskedLanguageModelling(Task):
    """Pretraining: a masked-LM run is not served; a classifier fine-tuned from it is."""

    section = MaskedLMTask
    not_served = "it is pretraining: fine-tune it (train.init_from) into a classifier, and export that run"

    @staticmethod
    def build_model(spec: Spec) -> MaskedLM:
        assert isinstance(spec.model, EncoderSpec) and isinstance(spec.task, MaskedLMTask)
        return MaskedLM(spec.model, next_sentence=spec.task.next_sentence)

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        assert isinstance(spec.task, MaskedLMTask) and spec.data is not None
        task, data = spec.task, spec.data
        self.task = task
        self.context = spec.context_length  # holds an example: task.shortest_example
        self.rule = MaskingRule(task.mask_prob, task.mask_token_prob, task.random_token_prob)
        # Each line keeps its newline: a character tokenizer then sees where lines meet; word and
        # subword tokenizers treat it as the whitespace it is.
        lines = [line.strip() + "\n" for line in text_lines(read_corpus(data)) if line.strip()]
        n_train = int(len(lines) * (1 - data.val_fraction))
        if n_train < 2 or len(lines) - n_train < 2:
            raise DataError(
                f"data.path {data.path}: {len(lines)} non-empty lines are too few to split into "
                f"training and validation sentences (val_fraction {data.val_fraction})"
            )
        self.tokenizer: Tokenizer = tokenizer or train_tokenizer(
            data.tokenizer, lines[:n_train], spec.task.reserved_tokens()
        )
        # By role, wherever the vocabulary holds them (tfcompile's at 0-4, BERT's [CLS] at 101).
        self.ids = special_ids(spec, self.tokenizer, SPECIAL_ROLES)
        self.special = torch.tensor(sorted(set(self.ids.values())))
        ordinary = torch.ones(self.tokenizer.get_vocab_size(), dtype=torch.bool)
        ordinary[self.special] = False
        self.replacements = ordinary.nonzero()[:, 0]  # what a chosen token may become at random
        encoded = [e.ids for e in self.tokenizer.encode_batch(lines, add_special_tokens=False)]
        self.lines = {"train": encoded[:n_train], "val": encoded[n_train:]}

    def _span(self, lines: list[list[int]], start: int, budget: int) -> tuple[list[int], int]:
        """Consecutive lines from ``start`` up to ``budget`` tokens (at least part of one line)
        -> (token ids, index of the next line)."""
        ids: list[int] = []
        i = start
        while i < len(lines) and (not ids or len(ids) + len(lines[i]) <= budget):
            ids += lines[i][: budget - len(ids)]
            i += 1
        return ids, i

    def _example(self, lines: list[list[int]], g: torch.Generator) -> tuple[list[int], list[int], int]:
        """-> (ids, segment ids, is_next: 1 when B follows A, 0 when random, -1 without NSP)."""
        cls, sep = self.ids["cls"], self.ids["sep"]
        n = len(lines)
        if not self.task.next_sentence:
            a, _ = self._span(lines, int(torch.randint(n, (1,), generator=g)), self.context - 2)
            return [cls, *a, sep], [0] * (len(a) + 2), -1
        budget = self.context - 3
        a, after = self._span(lines, int(torch.randint(n - 1, (1,), generator=g)), budget // 2)
        is_next = int(torch.rand((), generator=g) < 0.5) if after < n else 0
        if is_next:
            start = after
        else:  # any line but the one that follows A, which would make the label a lie
            start = int(torch.randint(n - (after < n), (1,), generator=g))
            start += start >= after
        b, _ = self._span(lines, start, budget - len(a))
        return [cls, *a, sep, *b, sep], [0] * (len(a) + 2) + [1] * (len(b) + 1), is_next

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        examples = [self._example(self.lines[split], generator) for _ in range(size)]
        input_ids = pad_rows([ids for ids, _, _ in examples], self.ids["pad"])
        token_type_ids = pad_rows([types for _, types, _ in examples], 0)
        attention_mask = (input_ids != self.ids["pad"]).long()
        maskable = ~torch.isin(input_ids, self.special)
        corrupted, targets = mask_tokens(
            input_ids, maskable, self.rule, self.ids["mask"], self.replacements, generator
        )
        batch = {
            "input_ids": corrupted,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "targets": targets,
        }
        if self.task.next_sentence:
            batch["is_next"] = torch.tensor([is_next for _, _, is_next in examples])
        return batch

    def _sums(self, model: ModelFn, batch: Batch) -> dict[str, torch.Tensor]:
        """The batch's summed losses, right predictions and counts: over its chosen tokens
        (``mlm_*``) and, with next-sentence prediction, over its examples (``nsp_*``)."""
        logits, nsp_logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        targets = batch["targets"]
        chosen = targets != IGNORE_INDEX
        sums = {
            "mlm_loss": F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            ),
            "mlm_correct": (logits.argmax(-1) == targets)[chosen].sum(),
            "mlm_count": chosen.sum(),
        }
        if nsp_logits is not None:
            is_next = batch["is_next"]
            sums["nsp_loss"] = F.cross_entropy(nsp_logits.float(), is_next, reduction="sum")
            sums["nsp_correct"] = (nsp_logits.argmax(-1) == is_next).sum()
            sums["nsp_count"] = torch.tensor(len(is_next))
        return sums

    @staticmethod
    def _mean_loss(sums: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss per chosen token, plus the next-sentence loss per example."""
        mlm = sums["mlm_loss"] / sums["mlm_count"]
        return mlm + sums["nsp_loss"] / sums["nsp_count"] if "nsp_loss" in sums else mlm

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return self._mean_loss(self._sums(model, batch))

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        """Sums over every batch, then the means: each chosen token and each example counts once,
        however the batches divide them."""
        totals: dict[str, torch.Tensor] = {}
        for batch in batches:
            for key, value in self._sums(model, batch).items():
                totals[key] = totals.get(key, 0) + value.detach().double().cpu()
        metrics = {
            "val_loss": float(self._mean_loss(totals)),
            "val_mlm_accuracy": float(totals["mlm_correct"] / totals["mlm_count"]),
        }
        if "nsp_count" in totals:
            metrics["val_nsp_accuracy"] = float(totals["nsp_correct"] / totals["nsp_count"])
        return metrics
