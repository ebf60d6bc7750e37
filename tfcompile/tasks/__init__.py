"""Training objectives (data, loss, validation metrics) and decoding."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tfcompile.spec.schema import Spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX, CausalLMObjective, causal_lm_loss, generate, sample_next
from tfcompile.tasks.classification import ClassificationObjective, f1_score
from tfcompile.tasks.image_classification import ImageClassificationObjective, augment
from tfcompile.tasks.masked_lm import MaskedLMObjective, MaskingRule, mask_tokens
from tfcompile.tasks.objective import Batch, Objective
from tfcompile.tasks.seq2seq import Seq2SeqObjective, beam_translate, greedy_translate, read_parallel


def build_objective(spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> Objective:
    """The spec's task on its data. ``tokenizer``: reuse one (a resumed or fine-tuned run)
    instead of training a new one."""
    assert spec.data is not None
    task, context = spec.task, spec.context_length
    if task.type == "causal_lm":
        return CausalLMObjective(task, spec.data, context, cache_dir, tokenizer)
    if task.type == "masked_lm":
        return MaskedLMObjective(task, spec.data, context, tokenizer)
    if task.type == "seq2seq":
        return Seq2SeqObjective(task, spec.data, context, tokenizer)
    if task.type == "image_classification":
        assert spec.model.family == "vit"  # the schema pairs the task with the family
        return ImageClassificationObjective(task, spec.data, spec.model)
    return ClassificationObjective(task, spec.data, context, spec.train.seed, tokenizer)


__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "CausalLMObjective",
    "ClassificationObjective",
    "ImageClassificationObjective",
    "MaskedLMObjective",
    "MaskingRule",
    "Objective",
    "Seq2SeqObjective",
    "augment",
    "beam_translate",
    "build_objective",
    "causal_lm_loss",
    "f1_score",
    "generate",
    "greedy_translate",
    "mask_tokens",
    "read_parallel",
    "sample_next",
]
