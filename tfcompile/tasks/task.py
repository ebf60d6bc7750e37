"""The task, tfcompile's unit of extension: one class per task, in its own module, that says
everything the rest of the system asks about it.

As a class (no data needed): the spec section it reads (which names the model families it
trains), how to build its model, the graphs export writes with their parity checks, and what it
adds to a bundle's manifest. As an instance (its data loaded): the sizes it takes from the data,
batches, the loss, validation metrics, and what it measures after training.

``cli``, ``train``, ``export`` and ``summary`` look a task up in ``TASKS`` by the spec's
``task.type`` and never compare task names. Adding a task is one module with a
``@register_task`` class (and its runtime class in ``tfcompile.runtime``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from tfcompile import sequences
from tfcompile.data import DataError
from tfcompile.data.corpus import corpus_files
from tfcompile.errors import ExportError
from tfcompile.files import TOKENIZER_FILE
from tfcompile.manifest import GRAPH_ROLES, TokenizerInfo
from tfcompile.memory import require_fits
from tfcompile.models import Assembly
from tfcompile.registry import Registry
from tfcompile.spec.schema import Spec, TaskSection, register_task_section

if TYPE_CHECKING:  # export imports the tasks to look them up
    from tfcompile.graphs.export import Graph
    from tfcompile.runtime import Bundle

Batch = dict[str, torch.Tensor]  # the model's inputs by name, plus the targets
ModelFn = Callable[..., Any]


@dataclass(frozen=True)
class DataSize:
    """A size a task took from its data: the dotted spec field, its value, and where it came from
    (for the error when the spec declares another value)."""

    field: str
    value: Any
    origin: str


@dataclass(frozen=True)
class GateRule:
    """How far an optimized bundle's held-out ``metric`` may move from its source bundle's, in
    the worse direction: ``tolerance`` by quantization scheme (fusion and fp16, which change no
    weights, are held to int8's), a fraction of the source's value when ``relative``."""

    metric: str
    higher_is_better: bool
    tolerance: dict[str, float]
    relative: bool = False

    def allowed(self, scheme: str) -> str:
        limit = self.tolerance[scheme]
        sign = "-" if self.higher_is_better else "+"
        return f"{sign}{limit:.0%}" if self.relative else f"{sign}{limit:g}"

    def passes(self, source: float, optimized: float, scheme: str) -> bool:
        limit = self.tolerance[scheme] * (abs(source) if self.relative else 1.0)
        worse = source - optimized if self.higher_is_better else optimized - source
        return worse <= limit


def served(call: Callable[..., np.ndarray]) -> ModelFn:
    """A bundle's call (numpy in, numpy out) as a ModelFn, so a task's own ``evaluate`` scores it."""
    return lambda *tensors: torch.from_numpy(call(*(t.numpy() for t in tensors)))


class Task(ABC):
    section: ClassVar[type[TaskSection]]  # the spec's `task:` section for this task
    # The graphs a bundle of this task holds, by name; none for a task that is not served.
    graphs: ClassVar[dict[str, Graph]] = {}
    not_served: ClassVar[str] = "it is not something to serve"  # why, when there are no graphs
    # Which side a client pads a batch of its inputs on (the positions come from the mask, so
    # either reads the same; generation appends on the right, so decoders pad on the left).
    padding_side: ClassVar[str] = "right"
    # The validation metric that picks the `best` checkpoint, and which way is better.
    best_metric: ClassVar[str] = "val_loss"
    higher_is_better: ClassVar[bool] = False

    # What `tfcompile optimize` holds a transformed bundle to; None: the task's bundles are not gated.
    gate: ClassVar[GateRule | None] = None

    tokenizer: Tokenizer | None = None  # text tasks; images have none

    @staticmethod
    def folder_files(folder: Path) -> list[Path]:
        """The files the task reads from a data path that is a folder (a run's data digest covers
        them): a corpus's text files."""
        return corpus_files(folder)

    # ------------------------------------------------------------------ without data

    @staticmethod
    @abstractmethod
    def build_model(spec: Spec) -> Assembly:
        """The model this task trains, from a spec whose sizes are all known."""

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        """The bundle manifest's task sections (labels, generation, translation, image; see
        tfcompile.manifest), given the bundle's tokenizer and the run it comes from, if any."""
        return {}

    # ------------------------------------------------------------------ with data

    @abstractmethod
    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        """Load the spec's data. ``tokenizer``: reuse one (a resumed or fine-tuned run) instead of
        training a new one; ``cache_dir`` keeps what is expensive to recompute (token ids)."""

    def sizes(self, spec: Spec) -> list[DataSize]:
        """The sizes this task took from the data: by default the tokenizer's vocabulary, or the
        spec's larger one (an embedding table padded past the tokenizer, as T5's 32128 rows for
        32100 tokens: the tokenizer never gives the extra ids); a smaller one is refused."""
        if self.tokenizer is None:
            return []
        tokens = self.tokenizer.get_vocab_size()
        declared = getattr(spec.model, "vocab_size", None)
        assert spec.data is not None
        origin = f"the {spec.data.tokenizer.type} tokenizer of data.path has {tokens} tokens"
        padded = declared is not None and declared > tokens
        return [DataSize("model.vocab_size", declared if padded else tokens, origin)]

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

    def test_metrics(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Metrics on the data's test split after training (translation: BLEU), each named
        TEST_PREFIX + name; none by default."""
        return {}

    def held_out(self, bundle: Bundle, limit: int | None) -> tuple[float, str]:
        """The gate's metric of a served bundle on this data's held-out split (at most ``limit``
        examples), and a description of what it was measured on."""
        raise NotImplementedError(f"{type(self).__name__} has no accuracy gate")

    def eval_batches(
        self, count: int, size: int, generator_for: Callable[[int], torch.Generator]
    ) -> Iterator[Batch]:
        """The batches ``evaluate`` sees: by default ``count`` random ones, the same at every evaluation."""
        for i in range(count):
            yield self.batch("val", size, generator_for(i))


TASKS: Registry[type[Task]] = Registry("task")


def register_task(cls: type[Task]) -> type[Task]:
    """Register a task under its section's ``type``, and its section in the spec schema; each of
    its graphs under a name the manifest gives its role (a runtime finds graphs by name)."""
    for name, graph in cls.graphs.items():
        if graph.role not in GRAPH_ROLES.get(name, ()):
            raise ValueError(
                f"{cls.__name__}'s graph {name!r} has the role {graph.role!r}; the manifest's graph "
                f"names and their roles are {GRAPH_ROLES}"
            )
    register_task_section(cls.section)
    TASKS.register(cls.section.model_fields["type"].default)(cls)
    return cls


def task_of(spec: Spec) -> type[Task]:
    return TASKS[spec.task.type]


def build_model(spec: Spec) -> Assembly:
    """The model that the spec's task trains on the spec's family. Sizes the spec leaves to the
    data (vocabulary, labels) must be known: a ValueError names them otherwise. Weights and
    buffers that cannot fit in memory are refused (TooLarge) before anything is allocated."""
    missing = spec.sizes_from_data()
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: set "
            f"{'it' if len(missing) == 1 else 'them'} in the spec, or train, which takes "
            f"{'it' if len(missing) == 1 else 'them'} from the data"
        )
    task = task_of(spec)
    if torch.get_default_device().type != "meta":  # measured on the meta device, which allocates nothing
        with torch.device("meta"):
            shape = task.build_model(spec)
        params = list(shape.parameters())
        nbytes = sum(t.numel() * t.element_size() for t in [*params, *shape.buffers()])
        require_fits(nbytes, sum(p.numel() for p in params))
    return task.build_model(spec)


def token_strings(spec: Spec) -> dict[str, str]:
    """Role (pad, cls, eos, ...) -> the special token's string: the spec's ``tokens:`` (an
    imported vocabulary's: RoBERTa's <s>, GPT-2's <|endoftext|>), else tfcompile's own ([CLS])."""
    if spec.tokens is not None:
        return spec.tokens.roles()
    return {role: token for token, role in sequences.SPECIAL_ROLES.items()}


def listed_token_ids(
    task: TaskSection, field: str, run: Path | Tokenizer | None, error: type[Exception] = ExportError
) -> list[int]:
    """The ids of the token strings a task field lists (task.stop_tokens, task.suppressed_tokens) in
    the run's tokenizer (its folder's, or one at hand); ``error`` names the tokens it lacks, or that
    there is no tokenizer to find them in."""
    return token_ids(getattr(task, field), field, run, error)


def listed_sequences(
    task: TaskSection, field: str, run: Path | Tokenizer | None, error: type[Exception] = ExportError
) -> list[list[int]]:
    """``listed_token_ids`` of a task field that lists sequences of token strings
    (task.banned_sequences)."""
    sequences: list[list[str]] = getattr(task, field)
    ids = iter(token_ids([token for sequence in sequences for token in sequence], field, run, error))
    return [[next(ids) for _ in sequence] for sequence in sequences]


def token_ids(
    tokens: list[str], field: str, run: Path | Tokenizer | None, error: type[Exception]
) -> list[int]:
    """``listed_token_ids`` of the strings ``tokens`` that task.``field`` lists, in their order."""
    if not tokens:
        return []
    if isinstance(run, Path):
        run = Tokenizer.from_file(str(run / TOKENIZER_FILE)) if (run / TOKENIZER_FILE).exists() else None
    if run is None:
        raise error(
            f"task.{field} names tokens, and there is no run's tokenizer to find them in: "
            f"export a run with a tokenizer, or leave {field} out"
        )
    ids = {token: run.token_to_id(token) for token in tokens}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        raise error(
            f"task.{field}: {', '.join(map(repr, missing))} is no token of the run's tokenizer: "
            f"name tokens it has"
        )
    return [i for token in tokens if (i := ids[token]) is not None]


def special_ids(spec: Spec, tokenizer: Tokenizer, roles: Sequence[str]) -> dict[str, int]:
    """Role (pad, cls, mask, ...) -> id of the special tokens a task needs, by their strings
    (``token_strings``: BERT's [CLS] at 101 in an imported vocabulary); a DataError names the
    roles the tokenizer has no token for, and the run whose tokenizer it is (train.init_from's,
    made for another task)."""
    strings = token_strings(spec)
    ids = {role: tokenizer.token_to_id(strings[role]) if role in strings else None for role in roles}
    missing = [role for role, i in ids.items() if i is None]
    if missing:
        named = ", ".join(f"{role} ({strings.get(role, 'not in tokens:')})" for role in missing)
        parent = spec.train.init_from
        whose, fix = (
            (f" of train.init_from {parent}", "fine-tune from a run of a task that has them")
            if parent is not None
            else ("", "name them by role in the spec's tokens: section")
        )
        raise DataError(
            f"the tokenizer{whose} has no special token for {named}: the task needs {', '.join(roles)}; {fix}"
        )
    return {role: i for role, i in ids.items() if i is not None}


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """tfcompile.sequences.pad_rows (the runtime pads with it too), as an int64 tensor."""
    return torch.from_numpy(sequences.pad_rows(rows, value))
