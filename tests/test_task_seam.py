"""The task is the unit of extension: a task defined entirely in this file (per-character tagging,
vowel or not, on an encoder) goes through validate -> train -> export -> verify -> runtime
without a line of it under tfcompile/. Also: no module outside tasks/ (and the runtime's table)
branches on a task name, and none outside models/ on a family name."""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT
from tokenizers import Tokenizer
from torch import nn

from tfcompile.cli import main
from tfcompile.data import train_tokenizer
from tfcompile.graphs.export import CLASSIFIER_INPUTS, Graph, export_forward
from tfcompile.graphs.parity import check_forward_parity
from tfcompile.manifest import TokenizerInfo
from tfcompile.models import Encoder
from tfcompile.models.common import init_weights
from tfcompile.runtime import Bundle, load, register_runtime
from tfcompile.runtime.ort import run
from tfcompile.sequences import PAD, SPECIAL_TOKENS, pad_rows
from tfcompile.spec.schema import TASK_SECTIONS, EncoderSpec, ModelSpec, Spec, TaskSection
from tfcompile.tasks import Batch, DataSize, ModelFn, Task, register_task
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.train import load_trained_model

VOWELS = set("aeiouAEIOU")


class TaggingTask(TaskSection):
    """Tag every character of a line: a vowel or not."""

    families = ("encoder",)
    data_sizes = ("labels",)

    type: Literal["tagging"] = "tagging"
    labels: list[str] | None = None

    def head_parameters(self, model: Any) -> int:
        assert self.labels is not None
        return (model.d_model + 1) * len(self.labels)


class Tagger(Encoder):
    """An encoder with a linear tag head on every position: -> logits (B, T, labels)."""

    heads = ("tag_head",)

    def __init__(self, spec: EncoderSpec, num_labels: int) -> None:
        super().__init__(spec)
        self.tag_head = nn.Linear(spec.d_model, num_labels)
        self.apply(partial(init_weights, std=spec.init_std))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.tag_head(self.encode(input_ids, attention_mask, token_type_ids))


def _export_tagger(model: Tagger, path: Path, opset: int) -> Any:
    return export_forward(model, CLASSIFIER_INPUTS, path, opset)


def _check_tagger(model: Tagger, path: Path, tolerance: float, seed: int = 0) -> Any:
    return check_forward_parity(model, path, CLASSIFIER_INPUTS, tolerance, seed=seed)


@register_task
class Tagging(Task):
    section = TaggingTask
    graphs: ClassVar[dict[str, Graph]] = {"model": Graph("forward", _export_tagger, _check_tagger)}
    best_metric = "val_accuracy"
    higher_is_better = True

    @staticmethod
    def build_model(spec: Spec) -> Tagger:
        assert isinstance(spec.model, EncoderSpec) and isinstance(spec.task, TaggingTask) and spec.task.labels
        return Tagger(spec.model, len(spec.task.labels))

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        assert isinstance(spec.task, TaggingTask)
        return {"labels": spec.task.labels}

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        assert spec.data is not None and spec.data.path is not None
        lines = [line for line in spec.data.path.read_text().splitlines() if line]
        self.tokenizer = tokenizer or train_tokenizer(spec.data.tokenizer, lines, SPECIAL_TOKENS)
        self.labels = ["other", "vowel"]
        examples = [
            (self.tokenizer.encode(line).ids, [int(c in VOWELS) for c in line])
            for line in (line[: spec.context_length] for line in lines)
        ]
        n_val = len(examples) // 10
        self.examples = {"train": examples[n_val:], "val": examples[:n_val]}

    def sizes(self, spec: Spec) -> list[DataSize]:
        return [*super().sizes(spec), DataSize("task.labels", self.labels, "the tags are other and vowel")]

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        rows = torch.randint(len(self.examples[split]), (size,), generator=generator).tolist()
        chosen = [self.examples[split][i] for i in rows]
        ids = torch.from_numpy(pad_rows([ids for ids, _ in chosen], self.tokenizer.token_to_id(PAD)))
        return {
            "input_ids": ids,
            "attention_mask": torch.from_numpy(pad_rows([[1] * len(ids) for ids, _ in chosen], 0)),
            "token_type_ids": torch.zeros_like(ids),
            "targets": torch.from_numpy(pad_rows([tags for _, tags in chosen], IGNORE_INDEX)),
        }

    def _logits(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).float()

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(self._logits(model, batch).flatten(0, 1), batch["targets"].flatten())

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        loss = correct = count = 0.0
        for batch in batches:
            logits, targets = self._logits(model, batch), batch["targets"]
            real = targets != IGNORE_INDEX
            loss += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
            correct += (logits.argmax(-1) == targets)[real].sum().item()
            count += real.sum().item()
        return {"val_loss": loss / count, "val_accuracy": correct / count}


@register_runtime("tagging")
class TaggerBundle(Bundle):
    def tag(self, text: str) -> list[str]:
        assert self.tokenizer is not None
        ids = np.array([self.tokenizer.encode(text).ids])
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (logits,) = run(self.session, feed)
        assert self.manifest.labels is not None
        return [self.manifest.labels[i] for i in logits[0].argmax(-1)]


SPEC = """\
model: {family: encoder, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 48}
data: {path: corpus.txt, tokenizer: char}
task: tagging
train: {steps: 80, batch_size: 32, optimizer: {lr: 3.0e-3}, eval_interval: 40, eval_batches: 2}
"""


def test_a_task_whose_graph_name_and_role_disagree_is_refused_at_registration() -> None:
    """A runtime finds a graph by its name in the manifest, which its role must agree with."""

    class Misnamed(Tagging):
        graphs: ClassVar[dict[str, Graph]] = {"step": Graph("forward", _export_tagger, _check_tagger)}

    with pytest.raises(ValueError, match=r"Misnamed's graph 'step' has the role 'forward'"):
        register_task(Misnamed)


@pytest.mark.slow  # end to end: trains, exports and serves
def test_a_task_defined_outside_tfcompile_trains_exports_and_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt").read_text().splitlines()[:3000]
    (tmp_path / "corpus.txt").write_text("\n".join(lines))
    (tmp_path / "tagging.yaml").write_text(SPEC)

    assert main(["validate", "tagging.yaml"]) == 0
    assert "task.labels from the data" in capsys.readouterr().out
    assert main(["train", "tagging.yaml"]) == 0
    assert main(["export", "runs/tagging", "--out", "bundle"]) == 0
    assert main(["verify", "bundle", "--run", "runs/tagging"]) == 0

    tagger = load("bundle")
    assert isinstance(tagger, TaggerBundle)
    text = "Now is the winter of our discontent"
    tags = tagger.tag(text)
    spec, model = load_trained_model(Path("runs/tagging"))
    assert spec.task.labels == ["other", "vowel"] and spec.parameter_count() == sum(
        p.numel() for p in model.parameters()
    )
    ids = torch.tensor([tagger.tokenizer.encode(text).ids])
    with torch.no_grad():
        expected = model(ids, torch.ones_like(ids), torch.zeros_like(ids))[0].argmax(-1).tolist()
    assert tags == [spec.task.labels[i] for i in expected]
    right = sum(tag == ("vowel" if c in VOWELS else "other") for tag, c in zip(tags, text, strict=True))
    assert right >= 0.9 * len(text)


# ----------------------------------------------------------------- names in branches


def _names(union: Any) -> set[str]:
    out = set()
    for member in typing.get_args(typing.get_args(union)[0]):
        cls = typing.get_args(member)[0] if typing.get_origin(member) is typing.Annotated else member
        out.add(cls.model_fields["family"].default)
    return out


TASK_NAMES = set(TASK_SECTIONS) - {"tagging"}
FAMILY_NAMES = _names(ModelSpec)


def _literals(node: ast.AST) -> set[str]:
    """The string constants of a node, or of a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for e in node.elts for s in _literals(e)}
    return set()


def _branching_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Names compared against (==, in, match), used as dict keys, or looked up by literal."""
    for node in ast.walk(tree):
        found: set[str] = set()
        if isinstance(node, ast.Compare):
            found = _literals(node.left).union(*(_literals(c) for c in node.comparators))
        elif isinstance(node, ast.Dict):
            found = {s for key in node.keys if key is not None for s in _literals(key)}
        elif isinstance(node, ast.match_case):
            found = {n.value.value for n in ast.walk(node.pattern) if isinstance(n, ast.MatchValue)}
        elif isinstance(node, ast.Subscript) and not (
            isinstance(node.value, ast.Name) and node.value.id == "Literal"
        ):
            found = _literals(node.slice)
        for name in found:
            yield node.lineno, name


# A translator's graphs are named "encoder" and "step": a graph's name, not the family's.
GRAPH_NAMES = {"tasks/seq2seq.py": {"encoder"}, "manifest.py": {"encoder"}}


@pytest.mark.parametrize(
    ("names", "allowed"),
    [
        # manifest.py reads format 1 bundles, whose per-task conventions were code, not data.
        (TASK_NAMES, ("tasks/", "runtime/__init__.py", "manifest.py")),
        (FAMILY_NAMES, ("models/",)),
    ],
    ids=["task names outside tasks/", "family names outside models/"],
)
def test_no_module_branches_on_a_name_it_does_not_own(names: set[str], allowed: tuple[str, ...]) -> None:
    package = ROOT / "tfcompile"
    offences = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path in sorted(package.rglob("*.py"))
        if not str(path.relative_to(package)).startswith(allowed)
        for line, name in _branching_names(ast.parse(path.read_text()))
        if name in names - GRAPH_NAMES.get(str(path.relative_to(package)), set())
    ]
    assert names and not offences, offences
