"""What the trainer asks of every task: its tokenizer, batches, loss and validation metrics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from tokenizers import Tokenizer

from tfcompile import sequences
from tfcompile.files import TOKENIZER_FILE

Batch = dict[str, torch.Tensor]  # the model's inputs by name, plus the targets
ModelFn = Callable[..., Any]


class Objective(ABC):
    tokenizer: Tokenizer | None = None  # text tasks; images have none
    # The validation metric that picks the `best` checkpoint, and which way is better.
    best_metric: str = "val_loss"
    higher_is_better: bool = False

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.get_vocab_size() if self.tokenizer is not None else None

    def run_files(self) -> dict[str, str]:
        """What a run keeps of the data's preparation, by file name: the tokenizer by default."""
        return {TOKENIZER_FILE: self.tokenizer.to_str()} if self.tokenizer is not None else {}

    def tokens(self, batch: Batch) -> int:
        """Sequence positions in a batch, padding included (for tokens/s)."""
        return batch["input_ids"].numel()

    @abstractmethod
    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        """A batch of ``size`` examples of ``split`` ("train" or "val"), drawn with ``generator``."""

    @abstractmethod
    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        """The mean training loss of ``batch`` (a scalar)."""

    @abstractmethod
    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        """Validation metrics over ``batches``: ``val_loss`` and ``best_metric`` at least."""

    def test_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """Metrics on the data's test split after training (translation: BLEU); none by default."""
        return {}

    def eval_batches(
        self, count: int, size: int, generator_for: Callable[[int], torch.Generator]
    ) -> Iterator[Batch]:
        """The batches ``evaluate`` sees: by default ``count`` random ones, the same at every evaluation."""
        for i in range(count):
            yield self.batch("val", size, generator_for(i))


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """tfcompile.sequences.pad_rows (the runtime pads with it too), as an int64 tensor."""
    return torch.from_numpy(sequences.pad_rows(rows, value))
