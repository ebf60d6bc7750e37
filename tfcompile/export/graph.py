"""PyTorch -> ONNX with the torch.export-based exporter: named inputs, dynamic batch and sequence
axes, checked by onnx.checker (with shape inference)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import torch

from tfcompile.models import DecoderLM

DECODER_INPUTS = ("input_ids", "attention_mask")
DECODER_OUTPUTS = ("logits",)


def export_decoder(model: DecoderLM, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``forward(input_ids (B, T) int64, attention_mask (B, T) int64) -> logits (B, T, V)``.

    Batch and sequence are dynamic; the sequence axis is bounded by the model's max_seq_len.
    """
    model = model.eval()
    max_len = model.spec.max_seq_len
    # torch.export specialises sizes 0 and 1, so the example uses 2 of each where the model allows.
    example_len = min(max_len, 8)
    ids = torch.zeros(2, example_len, dtype=torch.long)
    mask = torch.ones(2, example_len, dtype=torch.long)
    batch = torch.export.Dim("batch", min=1, max=4096)
    axes: dict[int, torch.export.Dim] = {0: batch}
    if max_len >= 2:
        axes[1] = torch.export.Dim("sequence", min=1, max=max_len)
    with _quiet():
        program = torch.onnx.export(
            model,
            (ids, mask),
            dynamo=True,
            input_names=list(DECODER_INPUTS),
            output_names=list(DECODER_OUTPUTS),
            dynamic_shapes={"input_ids": axes, "attention_mask": axes},
            opset_version=opset,
            verbose=False,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)  # full_check runs strict shape inference too
    return proto


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter narrates each stage and warns about optional packages; keep the CLI readable."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
