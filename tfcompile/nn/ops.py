"""Tensor operations the building blocks share, written in the form that the ONNX exporter
converts to every opset a spec may ask for (export.opset)."""

from __future__ import annotations

import torch


def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., 2n) -> its first and last n features. Split by explicit sizes, not ``chunk``: the
    exporter writes a chunk as opset 18's Split(num_outputs), which it leaves as it is in a graph
    of opset 17 (onnx.checker: "Unrecognized attribute: num_outputs for operator Split")."""
    half = x.shape[-1] // 2
    first, last = x.split([half, half], dim=-1)
    return first, last
