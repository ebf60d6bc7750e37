"""Prove that onnxruntime and PyTorch agree: fresh random inputs at several shapes, logits compared."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tfcompile.agreement import finite_scale, largest_difference
from tfcompile.graphs.export import (
    CLASSIFIER_INPUTS,
    DECODER_INPUTS,
    fixed_step_names,
    seq2seq_names,
    step_names,
)
from tfcompile.models import Assembly, Classifier, DecoderLM, Seq2Seq, VisionTransformer
from tfcompile.sequences import left_pad, longest


def _session(onnx_path: Path) -> Any:
    """A CPU onnxruntime session: the reference PyTorch runs on the CPU too, in turn with it, so
    onnxruntime's threads do not spin between runs (they would take the cores from PyTorch).
    onnxruntime is imported here, not at the top, so that training needs neither of its builds."""
    from tfcompile.runtime.ort import ort
    from tfcompile.runtime.session import SessionOptions

    options = SessionOptions(spin=False).to_ort()
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def _run(session: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    from tfcompile.runtime.ort import run

    return run(session, feed)


def _difference(actual: np.ndarray, expected: np.ndarray) -> float:
    """largest_difference, and infinite where PyTorch's own outputs are not finite (NaN weights, an
    fp16 graph past its range): agreeing on a NaN proves nothing about the graph."""
    return largest_difference(actual, expected) if np.isfinite(expected).all() else float("inf")


@dataclass(frozen=True)
class ParityCase:
    batch: int
    seq: int
    padded: bool  # the first row starts with padding and the last ends in it (one row: neither)
    max_abs_diff: float
    max_rel_diff: float  # max |ort - torch| / max |torch|: relative to the logits' scale

    @property
    def scaled_diff(self) -> float:
        """max |ort - torch| / max(1, max |torch|): absolute for outputs within +-1, relative to
        their scale past it, where float32's rounding grows with the values."""
        return min(self.max_abs_diff, self.max_rel_diff)


@dataclass(frozen=True)
class ParityReport:
    tolerance: float
    cases: list[ParityCase]
    relative: bool = False  # the tolerance bounds max_rel_diff (fp16 graphs), not the scaled diff

    @property
    def max_abs_diff(self) -> float:
        return max(c.max_abs_diff for c in self.cases)

    @property
    def max_rel_diff(self) -> float:
        return max(c.max_rel_diff for c in self.cases)

    @property
    def measured(self) -> float:
        """What the tolerance bounds: fp16 graphs, the difference relative to the outputs' scale
        (half precision keeps three digits at any magnitude); fp32 graphs, each case's difference
        relative to its scale past 1 (``ParityCase.scaled_diff``)."""
        return self.max_rel_diff if self.relative else max(c.scaled_diff for c in self.cases)

    @property
    def passed(self) -> bool:
        return self.measured <= self.tolerance

    def to_dict(self) -> dict:
        return {
            "tolerance": self.tolerance,
            "relative": self.relative,
            "passed": self.passed,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "cases": [asdict(c) for c in self.cases],
        }


STEPS = 8  # single-token steps after a batch of prompts, in check_step_parity


def default_shapes(max_seq_len: int) -> list[tuple[int, int, bool]]:
    """Batch 1 and > 1; sequence 1, short, and the full context (up to LONGEST); padding where it
    can occur."""
    short = min(7, max_seq_len)
    return [(1, 1, False), (1, short, False), (4, short, True), (2, longest(max_seq_len), True)]


def check_decoder_parity(
    model: DecoderLM,
    onnx_path: Path,
    tolerance: float,
    shapes: Sequence[tuple[int, int, bool]] | None = None,
    seed: int = 0,
) -> ParityReport:
    return check_forward_parity(model, onnx_path, DECODER_INPUTS, tolerance, shapes, seed)


def check_classifier_parity(
    model: Classifier,
    onnx_path: Path,
    tolerance: float,
    shapes: Sequence[tuple[int, int, bool]] | None = None,
    seed: int = 0,
) -> ParityReport:
    return check_forward_parity(model, onnx_path, CLASSIFIER_INPUTS, tolerance, shapes, seed)


def check_image_classifier_parity(
    model: VisionTransformer,
    onnx_path: Path,
    tolerance: float,
    batches: Sequence[int] = (1, 4, 16),
    seed: int = 0,
) -> ParityReport:
    """Standard-normal pixel values (what normalised images look like) at each batch size;
    ``seq`` in the report is the model's sequence length (patches + [CLS])."""
    model = model.eval()
    s = model.spec
    assert s.max_seq_len is not None
    session = _session(onnx_path)
    rng = np.random.default_rng(seed)
    cases = []
    for batch in batches:
        pixels = rng.standard_normal((batch, s.channels, s.image_size, s.image_size), dtype=np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(pixels)).numpy()
        (actual,) = _run(session, {"pixel_values": pixels})
        diff = _difference(actual, expected)
        cases.append(ParityCase(batch, s.max_seq_len, False, diff, diff / (finite_scale(expected) or 1.0)))
    return ParityReport(tolerance, cases)


def check_forward_parity(
    model: Assembly,
    onnx_path: Path,
    inputs: tuple[str, ...],
    tolerance: float,
    shapes: Sequence[tuple[int, int, bool]] | None = None,
    seed: int = 0,
) -> ParityReport:
    """``model(*inputs)`` against the graph that ``export_forward`` wrote, on random token ids at
    ``shapes`` (batch, seq, padded; default ``default_shapes``): in padded cases the first row starts
    with padding and the last ends in it, as left- and right-padded batches do; token types mark a
    second segment from the middle on, as in a sentence pair."""
    model = model.eval()
    spec = model.spec
    assert spec.vocab_size is not None
    session = _session(onnx_path)
    rng = np.random.default_rng(seed)
    cases = []
    for batch, seq, padded in shapes or default_shapes(spec.max_seq_len):
        feed = {
            "input_ids": rng.integers(0, spec.vocab_size, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64),
            "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
        }
        if padded and seq > 1:
            feed["attention_mask"][-1, rng.integers(1, seq) :] = 0
            if batch > 1:
                feed["attention_mask"][0, : rng.integers(1, seq)] = 0
        feed["token_type_ids"][:, seq // 2 :] = 1
        feed = {name: feed[name] for name in inputs}
        with torch.no_grad():
            expected = model(*(torch.from_numpy(v) for v in feed.values())).numpy()
        (actual,) = _run(session, feed)
        diff = _difference(actual, expected)
        cases.append(ParityCase(batch, seq, padded, diff, diff / (finite_scale(expected) or 1.0)))
    return ParityReport(tolerance, cases)


def check_step_parity(model: DecoderLM, onnx_path: Path, tolerance: float, seed: int = 0) -> ParityReport:
    """The incremental graph against PyTorch's cached forward: a prompt with an empty cache, then
    single tokens: at batch 1 from one token; at batch 3 from a short prompt, and from a prompt
    that leaves STEPS tokens to the full context (up to LONGEST), so that the steps read the
    shortest and the longest caches (a step costs a pass over the cache: walking a 1,024-token
    context one token at a time took 5 minutes for GPT-2 on 2 cores). ``seq`` is the final length.
    At batch 3 the first row's prompt starts with padding, as generation left-pads a batch of
    prompts."""
    model = model.eval()
    spec = model.spec
    assert spec.vocab_size is not None
    session = _session(onnx_path)
    inputs, _ = step_names(spec.n_layers)
    rng = np.random.default_rng(seed)
    cases = []
    context = longest(spec.max_seq_len)
    walks = [
        (1, 1, min(3, spec.max_seq_len)),
        (3, min(5, spec.max_seq_len - 1), min(5 + STEPS, context)),
        (3, max(context - STEPS, 1), context),
    ]
    for batch, prompt, total in dict.fromkeys(walks):  # a short context walks one way once
        ids, full_mask, padded = _token_rows(spec, rng, batch, prompt, total)
        cache = model.empty_cache(batch)
        past = [c.key.numpy() for c in cache] + [c.value.numpy() for c in cache]
        diff = scale = 0.0
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, total))]:
            mask = full_mask[:, :end]
            with torch.no_grad():
                expected = model(
                    torch.from_numpy(ids[:, start:end]), torch.from_numpy(mask), cache=cache
                ).numpy()
            feed = dict(zip(inputs, [ids[:, start:end], mask, *past], strict=True))
            actual, *past = _run(session, feed)
            diff = max(diff, _difference(actual, expected))
            scale = max(scale, finite_scale(expected))
        cases.append(ParityCase(batch, total, padded, diff, diff / (scale or 1.0)))
    return ParityReport(tolerance, cases)


def check_fixed_step_parity(
    model: DecoderLM, onnx_path: Path, tolerance: float, seed: int = 0
) -> ParityReport:
    """The fixed-shape step graph against PyTorch's cached forward, fed as the runtime feeds it: a
    prompt read by PyTorch, its cache left-padded with zeros into the window, then single tokens,
    each step's window the last's output; the logits and, at the end, the window's real columns
    compared. At batch 1 the window fills up (the last step reads the full context); at batch 3
    the first row's prompt starts with padding. ``seq`` is the final length."""
    model = model.eval()
    spec = model.spec
    assert spec.vocab_size is not None
    session = _session(onnx_path)
    inputs, _ = fixed_step_names(spec.n_layers)
    window = spec.max_seq_len - 1
    rng = np.random.default_rng(seed)
    cases = []
    for batch, prompt, total in [
        (1, max(window - 2, 1), spec.max_seq_len),
        (3, min(5, window), min(9, spec.max_seq_len)),
    ]:
        ids, full_mask, padded = _token_rows(spec, rng, batch, prompt, total)
        cache = model.empty_cache(batch)
        with torch.no_grad():
            model(torch.from_numpy(ids[:, :prompt]), torch.from_numpy(full_mask[:, :prompt]), cache=cache)
        held = [left_pad(c.key.numpy(), window, 2) for c in cache] + [
            left_pad(c.value.numpy(), window, 2) for c in cache
        ]
        diff = scale = 0.0
        for t in range(prompt, total):
            mask = left_pad(full_mask[:, : t + 1], window + 1, 1)
            with torch.no_grad():
                expected = model(
                    torch.from_numpy(ids[:, t : t + 1]), torch.from_numpy(full_mask[:, : t + 1]), cache=cache
                ).numpy()
            actual, *held = _run(session, dict(zip(inputs, [ids[:, t : t + 1], mask, *held], strict=True)))
            diff = max(diff, _difference(actual, expected))
            scale = max(scale, finite_scale(expected))
        kept = [c.key.numpy() for c in cache] + [c.value.numpy() for c in cache]
        real = min(total, window)  # the window's last columns, the cache's last positions
        for actual, expected in zip(held, kept, strict=True):
            diff = max(diff, _difference(actual[:, :, window - real :], expected[:, :, total - real :]))
        cases.append(ParityCase(batch, total, padded, diff, diff / (scale or 1.0)))
    return ParityReport(tolerance, cases)


def _token_rows(
    spec: Any, rng: np.random.Generator, batch: int, prompt: int, total: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Random token ids (B, total) and their mask, whose first row's prompt starts with padding
    when B > 1 and the prompt is longer than a token, as generation left-pads a batch of prompts;
    and whether it does."""
    ids = rng.integers(0, spec.vocab_size, size=(batch, total), dtype=np.int64)
    padded = batch > 1 and prompt > 1
    mask = np.ones((batch, total), dtype=np.int64)
    if padded:
        mask[0, : rng.integers(1, prompt)] = 0
    return ids, mask, padded


def _source(spec: Any, rng: np.random.Generator, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Random source ids (B, S) and a mask whose last row ends in padding when B > 1."""
    ids = rng.integers(0, spec.vocab_size, size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), dtype=np.int64)
    if batch > 1 and length > 1:
        mask[-1, rng.integers(1, length) :] = 0
    return ids, mask


def check_seq2seq_encoder_parity(
    model: Seq2Seq, onnx_path: Path, tolerance: float, seed: int = 0
) -> ParityReport:
    """The encoder graph's cross-attention keys and values against PyTorch's, at several shapes."""
    model = model.eval()
    session = _session(onnx_path)
    rng = np.random.default_rng(seed)
    cases = []
    for batch, length, _ in default_shapes(model.spec.max_seq_len):
        ids, mask = _source(model.spec, rng, batch, length)
        with torch.no_grad():
            memory = model.project_memory(model.encode(torch.from_numpy(ids), torch.from_numpy(mask)))
        expected = [m.key.numpy() for m in memory] + [m.value.numpy() for m in memory]
        actual = _run(session, {"source_ids": ids, "source_mask": mask})
        real = mask.astype(bool)[:, None, :, None]  # padded source positions are never read
        pairs = zip(actual, expected, strict=True)
        diff = max(_difference(np.where(real, a, 0), np.where(real, e, 0)) for a, e in pairs)
        scale = max(finite_scale(e) for e in expected) or 1.0
        cases.append(ParityCase(batch, length, batch > 1, diff, diff / scale))
    return ParityReport(tolerance, cases)


def check_seq2seq_step_parity(
    model: Seq2Seq, onnx_path: Path, tolerance: float, seed: int = 0
) -> ParityReport:
    """The decoder step graph against PyTorch's cached decoding: a prefix, then one token at a
    time up to the full context (up to LONGEST), over a padded source; ``seq`` is the final target
    length."""
    model = model.eval()
    spec = model.spec
    session = _session(onnx_path)
    _, inputs, _ = seq2seq_names(len(model.decoder_blocks))
    rng = np.random.default_rng(seed)
    cases = []
    for batch, source_len, prefix, total in [
        (1, 1, 1, min(3, spec.max_seq_len)),
        (3, 9, 4, longest(spec.max_seq_len)),
    ]:
        source, source_mask = _source(spec, rng, batch, min(source_len, spec.max_seq_len))
        target = rng.integers(0, spec.vocab_size, size=(batch, total), dtype=np.int64)
        with torch.no_grad():
            memory = model.project_memory(
                model.encode(torch.from_numpy(source), torch.from_numpy(source_mask))
            )
        memory_arrays = [m.key.numpy() for m in memory] + [m.value.numpy() for m in memory]
        cache = model.empty_cache(batch)
        past = [c.key.numpy() for c in cache] + [c.value.numpy() for c in cache]
        diff = scale = 0.0
        for start, end in [(0, min(prefix, total)), *((t, t + 1) for t in range(min(prefix, total), total))]:
            with torch.no_grad():
                expected = model.decode(
                    torch.from_numpy(target[:, start:end]), memory, torch.from_numpy(source_mask), cache=cache
                ).numpy()
            feed = dict(zip(inputs, [target[:, start:end], source_mask, *past, *memory_arrays], strict=True))
            actual, *past = _run(session, feed)
            diff = max(diff, _difference(actual, expected))
            scale = max(scale, finite_scale(expected))
        cases.append(ParityCase(batch, total, batch > 1, diff, diff / (scale or 1.0)))
    return ParityReport(tolerance, cases)
