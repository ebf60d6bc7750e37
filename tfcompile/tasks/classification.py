"""Sentence and sentence-pair classification from the final state of the first token ([CLS], or
the imported tokenizer's own: RoBERTa's <s>), with accuracy and F1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tfcompile.data import DataError, train_tokenizer
from tfcompile.data.table import LabelledTexts, read_table
from tfcompile.data.tokenizer import frame_sentences
from tfcompile.graphs.export import Graph, export_classifier
from tfcompile.graphs.parity import check_classifier_parity
from tfcompile.manifest import TokenizerInfo
from tfcompile.models import Classifier
from tfcompile.sequences import SPECIAL_ROLES
from tfcompile.spec.schema import ClassificationTask, EncoderSpec, Spec
from tfcompile.tasks.task import (
    Batch,
    DataSize,
    GateRule,
    ModelFn,
    Task,
    pad_rows,
    register_task,
    served,
    special_ids,
)

if TYPE_CHECKING:
    from tfcompile.runtime import Bundle


def f1_score(predicted: np.ndarray, actual: np.ndarray, num_labels: int) -> float:
    """Binary tasks: F1 of class 1 (GLUE's convention); more classes: the macro average."""
    scores = []
    for c in [1] if num_labels == 2 else range(num_labels):
        tp = np.sum((predicted == c) & (actual == c))
        fp = np.sum((predicted == c) & (actual != c))
        fn = np.sum((predicted != c) & (actual == c))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(scores))


def resolve_labels(declared: list[str] | None, splits: dict[str, list[str]], source: str) -> list[str]:
    """task.labels, else the first (training) split's labels sorted. Every split's labels must be
    among them (or all be class indices into them, see ``label_index``), and a classifier needs two
    at least: a DataError that says what to do otherwise."""
    labels = declared or sorted(set(next(iter(splits.values()))))
    if not _by_index(labels, {value for values in splits.values() for value in values}):
        for split, found in splits.items():
            unknown = sorted(set(found) - set(labels))
            if unknown:
                fix = (
                    "add them to task.labels or leave task.labels out to take the training data's"
                    if declared
                    else "task.labels is taken from the training data, so give it rows with them, "
                    "or list every label in task.labels"
                )
                raise DataError(
                    f"the {split} data has labels {unknown[:5]} outside task.labels {labels}; {fix}"
                )
    if len(labels) < 2:
        raise DataError(f"{source}: a classifier needs at least two labels, found {labels}")
    return labels


def check_label_values(declared: list[str] | None, values: list[str], source: Path) -> None:
    """With task.labels, every label of a file is one of the names or, where the file numbers its
    classes (SST-2's 0 and 1: none of its labels is a name), an index into them; the first that is
    neither is a DataError naming the file, the row and the value."""
    if not declared:
        return
    names = set(declared)
    by_index = not names & set(values)
    for row, value in enumerate(values, 1):
        if (value.isdecimal() and int(value) < len(declared)) if by_index else value in names:
            continue
        expected = (
            f"a class index from 0 to {len(declared) - 1} into task.labels {declared}"
            if by_index
            else f"one of task.labels {declared}"
        )
        raise DataError(
            f"{source}, row {row}: the label {value!r} is not {expected}; fix or remove the row, "
            f"or change task.labels"
        )


def label_index(labels: list[str], values: set[str]) -> dict[str, int]:
    """Each label value in the data -> its class index. The values are the names in task.labels,
    or, when none of them is a name and all are integers below the number of names, the class
    indices themselves (GLUE's SST-2 labels its sentences 0 and 1; `task.labels: [negative,
    positive]` names them)."""
    if _by_index(labels, values):
        return {value: int(value) for value in values}
    return {label: i for i, label in enumerate(labels)}


def check_framing(spec: Spec, tokenizer: Tokenizer, text: str) -> None:
    """The classifier's framing (``frame_sentences``) must fit the model: its special tokens and a
    token of each sentence within the training context (RoBERTa's <s> A </s></s> B </s> takes
    6: one fewer and its tokenizer cuts B away whole), and every segment id it gives a pair below
    model.type_vocab_size unless that is 0 (no segment embeddings): the bundle reads pairs whatever
    the data holds. The ids are those of ``text`` framed as both sentences of a pair, for a
    post-processor gives each part of its template one segment id whatever the text. A DataError
    names the field and the fix otherwise."""
    assert isinstance(spec.model, EncoderSpec) and isinstance(spec.task, ClassificationTask)
    pair, context = spec.task.pair_column is not None, spec.context_length
    framing = tokenizer.num_special_tokens_to_add(is_pair=pair)
    shortest = framing + 1 + pair
    if context < shortest:
        example = " ".join(tokenizer.encode("", "" if pair else None).tokens)
        raise DataError(
            f"train.context_length: the tokenizer frames a {'pair' if pair else 'sentence'} with "
            f"{framing} special tokens ({example}), so an example with a token of "
            f"{'each sentence' if pair else 'the sentence'} takes {shortest}, more than the context of "
            f"{context}; raise train.context_length to {shortest} at least (and model.max_seq_len, where "
            f"it is lower)"
        )
    rows = spec.model.type_vocab_size
    used = max(tokenizer.encode(text, text).type_ids) + 1
    if rows and used > rows:
        raise DataError(
            f"model.type_vocab_size: the tokenizer gives a sentence pair segment ids 0 to {used - 1}, but "
            f"type_vocab_size {rows} embeds 0 to {rows - 1} (the classifier's bundle reads pairs); set "
            f"model.type_vocab_size: {used} (with train.init_from, a run with as many rows, or with one), "
            f"or 0 for no segment embeddings"
        )


def _by_index(labels: list[str], values: set[str]) -> bool:
    return (
        bool(values)
        and not values & set(labels)
        and all(v.isdecimal() and int(v) < len(labels) for v in values)
    )


@register_task
class TextClassification(Task):
    section = ClassificationTask
    graphs: ClassVar[dict[str, Graph]] = {
        "model": Graph("forward", export_classifier, check_classifier_parity)
    }
    # Accuracy is what a classifier is judged by; its loss can rise while accuracy still improves.
    best_metric = "val_accuracy"
    higher_is_better = True
    gate = GateRule("accuracy", higher_is_better=True, tolerance={"int8": 0.005})

    @staticmethod
    def build_model(spec: Spec) -> Classifier:
        assert isinstance(spec.model, EncoderSpec) and isinstance(spec.task, ClassificationTask)
        assert spec.task.labels is not None
        return Classifier(spec.model, len(spec.task.labels))

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        assert isinstance(spec.task, ClassificationTask)
        return {"labels": spec.task.labels}

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        assert isinstance(spec.task, ClassificationTask) and spec.data is not None
        task, data, context, seed = spec.task, spec.data, spec.context_length, spec.train.seed
        self.task = task
        assert data.path is not None  # builtin data is images
        train = read_table(data.path, task.text_column, task.pair_column, task.label_column)
        check_label_values(task.labels, train.labels, data.path)
        if data.val_path is not None:
            val = read_table(data.val_path, task.text_column, task.pair_column, task.label_column)
            check_label_values(task.labels, val.labels, data.val_path)
        else:  # a seeded shuffle, so that a file sorted by label still validates on every label
            order = np.random.default_rng(seed).permutation(len(train))
            n_val = max(1, int(len(train) * data.val_fraction))
            train, val = _subset(train, order[n_val:]), _subset(train, order[:n_val])
        self.labels = resolve_labels(
            task.labels, {"training": train.labels, "validation": val.labels}, str(data.path)
        )
        self.index = label_index(self.labels, {*train.labels, *val.labels})
        if tokenizer is None:
            texts = train.texts + (train.pairs or [])
            tokenizer = train_tokenizer(data.tokenizer, texts, spec.task.reserved_tokens())
        # The encoder's special tokens by role, wherever the vocabulary holds them (a DataError
        # names the missing: a causal LM's tokenizer, from train.init_from, has no [CLS]).
        roles = [SPECIAL_ROLES[token] for token in spec.task.reserved_tokens()]
        ids = special_ids(spec, tokenizer, roles)
        self.pad_id = ids["pad"]
        frame_sentences(tokenizer, ids["cls"], ids["sep"], context)
        check_framing(spec, tokenizer, train.texts[0])
        self.tokenizer: Tokenizer = tokenizer
        self.examples = {"train": self._encode(train), "val": self._encode(val)}

    def sizes(self, spec: Spec) -> list[DataSize]:
        labels = DataSize("task.labels", self.labels, f"the data's labels are {self.labels}")
        return [*super().sizes(spec), labels]

    def _encode(self, rows: LabelledTexts) -> tuple[list, torch.Tensor]:
        inputs = list(zip(rows.texts, rows.pairs, strict=True)) if rows.pairs else rows.texts
        encodings = self.tokenizer.encode_batch(inputs)
        return encodings, torch.tensor([self.index[label] for label in rows.labels])

    def _collate(self, split: str, rows: list[int]) -> Batch:
        encodings, labels = self.examples[split]
        input_ids = pad_rows([encodings[i].ids for i in rows], self.pad_id)
        return {
            "input_ids": input_ids,
            "attention_mask": pad_rows([[1] * len(encodings[i].ids) for i in rows], 0),
            "token_type_ids": pad_rows([encodings[i].type_ids for i in rows], 0),
            "labels": labels[rows],
        }

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        n = len(self.examples[split][1])
        return self._collate(split, torch.randint(n, (size,), generator=generator).tolist())

    def eval_batches(
        self, count: int, size: int, generator_for: Callable[[int], torch.Generator]
    ) -> Iterator[Batch]:
        """The whole validation split, in order: accuracy is reported on every example."""
        n = len(self.examples["val"][1])
        for start in range(0, n, size):
            yield self._collate("val", list(range(start, min(start + size, n))))

    def _logits(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).float()

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(
            self._logits(model, batch), batch["labels"], label_smoothing=self.task.label_smoothing
        )

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        loss_sum, predicted, actual = 0.0, [], []
        for batch in batches:
            logits = self._logits(model, batch)
            loss_sum += F.cross_entropy(logits, batch["labels"], reduction="sum").item()
            predicted.append(logits.argmax(-1).cpu())
            actual.append(batch["labels"].cpu())
        p, a = torch.cat(predicted).numpy(), torch.cat(actual).numpy()
        return {
            "val_loss": loss_sum / len(a),
            "val_accuracy": float(np.mean(p == a)),
            "val_f1": f1_score(p, a, len(self.labels)),
        }

    def held_out(self, bundle: Bundle, limit: int | None) -> tuple[float, str]:
        """Accuracy over the validation split (its first ``limit`` examples)."""
        from tfcompile.runtime import Classifier as Served

        assert isinstance(bundle, Served)
        n = min(len(self.examples["val"][1]), limit or len(self.examples["val"][1]))
        batches = (self._collate("val", list(range(i, min(i + 64, n)))) for i in range(0, n, 64))
        accuracy = self.evaluate(served(bundle.logits), batches)["val_accuracy"]
        return accuracy, f"{n} sentences of the validation split"


def _subset(rows: LabelledTexts, index: np.ndarray) -> LabelledTexts:
    return LabelledTexts(
        [rows.texts[i] for i in index],
        [rows.pairs[i] for i in index] if rows.pairs else None,
        [rows.labels[i] for i in index],
    )
