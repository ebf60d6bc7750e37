"""PyTorch -> ONNX with the torch.export-based exporter: named inputs, dynamic batch and sequence
axes, checked by onnx.checker (with shape inference)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch
from torch import nn

from tfcompile.models import Assembly, Classifier, DecoderLM, Seq2Seq, VisionTransformer
from tfcompile.nn.attention import KVCache
from tfcompile.onnx_nodes import graph_nodes

if TYPE_CHECKING:
    from tfcompile.graphs.parity import ParityReport

DECODER_INPUTS = ("input_ids", "attention_mask")
CLASSIFIER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUTS = ("logits",)
UNTRACED = frozenset({"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node"})  # see _drop_traces


@dataclass(frozen=True)
class Graph:
    """One graph of a bundle: its role (as the manifest names it: forward, decode_step, encoder,
    decoder_step), how to write it from the model, and how to prove it equal to the model
    (``check(model, path, tolerance, seed=)`` on fresh inputs at several shapes)."""

    role: str
    export: Callable[[Any, Path, int], onnx.ModelProto]
    check: Callable[..., ParityReport]
    cuda_graphs: bool = False  # written only where the spec asks (export.cuda_graphs)


# What each graph input and output holds, as the manifest explains it to a client.
_MEANINGS = {
    "input_ids": "token ids (batch, sequence); rows may be padded, on either side: attention_mask says where",
    "attention_mask": "1 at real tokens, 0 at padding; in a step graph it covers the cached tokens and the "
    "new ones. A token's position is the number of real tokens before it (the mask's cumulative sum "
    "minus 1), so a padded row is read as it would be alone",
    "token_type_ids": "each token's segment: 0 for the first sentence (with [CLS] and its [SEP]), 1 for the "
    "second of a pair",
    "pixel_values": "images (batch, channels, size, size) in the input's dtype (float16 in an fp16 bundle), "
    "preprocessed as the manifest's image section says",
    "source_ids": "the source sentence's token ids (batch, source_sequence)",
    "source_mask": "1 at real source tokens, 0 at padding",
    "logits": "unnormalised scores on the last axis: of the next token at each position (vocabulary), or "
    "of each class (labels)",
}
_CACHE_MEANINGS = {
    "past": "layer {i}'s cached {kv}s (batch, n_kv_heads, past_sequence, head_dim): empty (past_sequence 0) "
    "at the first step, then the present_{kv}_{i} output of the previous step",
    "present": "layer {i}'s {kv}s of the cached and the new tokens: the next step's past_{kv}_{i}",
    "window": "layer {i}'s {kv}s of the last max_seq_len - 1 positions (batch, n_kv_heads, max_seq_len - 1, "
    "head_dim), left-padded with zeros where attention_mask is 0: zeros at the first step after a "
    "prompt but for the prompt's present_{kv}_{i} at the right",
    "next_window": "layer {i}'s window_{kv}_{i} slid by one position: its first column dropped, the new "
    "token's {kv} appended; the next step's window_{kv}_{i}",
    "memory": "decoder layer {i}'s cross-attention {kv}s of the source (batch, n_kv_heads, source_sequence, "
    "head_dim), computed once by the encoder graph",
}


def tensor_meaning(name: str) -> str:
    """The manifest's explanation of a graph input or output, by its name."""
    match = re.fullmatch(r"(past|present|memory|window|next_window)_(key|value)_(\d+)", name)
    if match:
        kind, kv, i = match.groups()
        return _CACHE_MEANINGS[kind].format(i=i, kv=kv)
    return _MEANINGS.get(name, "")


def export_decoder(model: DecoderLM, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``forward(input_ids (B, T) int64, attention_mask (B, T) int64) -> logits (B, T, V)``."""
    return export_forward(model, DECODER_INPUTS, path, opset)


def export_classifier(model: Classifier, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``forward(input_ids, attention_mask, token_type_ids (B, T) int64) -> logits (B, labels)``."""
    return export_forward(model, CLASSIFIER_INPUTS, path, opset)


def export_image_classifier(model: VisionTransformer, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``forward(pixel_values (B, channels, image_size, image_size) float32) -> logits
    (B, labels)``; the batch is dynamic."""
    model = model.eval()
    s = model.spec
    example = (torch.zeros(2, s.channels, s.image_size, s.image_size, dtype=_dtype(model)),)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = _export(model, example, ["pixel_values"], list(OUTPUTS), {"pixel_values": {0: batch}}, opset)
    return _save(program, path, {})


def export_forward(model: Assembly, inputs: tuple[str, ...], path: Path, opset: int) -> onnx.ModelProto:
    """Export ``model(*inputs)``, each input (B, T) int64, to ``logits``. Batch and sequence are
    dynamic; the sequence axis is bounded by the model's ``spec.max_seq_len``. An
    ``attention_mask`` input is all ones in the example, every other input zeros."""
    model = model.eval()
    max_len = model.spec.max_seq_len
    # torch.export specialises sizes 0 and 1, so the example uses 2 of each where the model allows.
    example_len = min(max_len, 8)
    example = tuple(
        (torch.ones if name == "attention_mask" else torch.zeros)(2, example_len, dtype=torch.long)
        for name in inputs
    )
    batch = torch.export.Dim("batch", min=1, max=4096)
    axes: dict[int, torch.export.Dim] = {0: batch}
    if max_len >= 2:
        axes[1] = torch.export.Dim("sequence", min=1, max=max_len)
    program = _export(model, example, list(inputs), list(OUTPUTS), {name: axes for name in inputs}, opset)
    return _save(program, path, {})  # the named Dims already name the axes


# The step graphs' example sizes: cached tokens, new tokens, source tokens. torch.export makes an
# axis of size 1 in the example a constant 1 (and may take equal sizes for one symbol), and its
# graph then fails on other sizes, so each is at least 2 and they differ, whatever the context: a
# model checks no length while it is exported (tfcompile.models.common.check_token_ids).
STEP_EXAMPLE = (4, 3, 5)


class DecoderStep(nn.Module):
    """The incremental form: new tokens plus each layer's past keys and values in, logits and the
    extended keys and values out, so that generating costs one token per step."""

    def __init__(self, model: DecoderLM) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        cache = [KVCache(k, v) for k, v in zip(past_keys, past_values, strict=True)]
        logits = self.model(input_ids, attention_mask, cache=cache)
        return logits, [c.key for c in cache], [c.value for c in cache]


def step_names(n_layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of the incremental graph, per layer."""
    layers = range(n_layers)
    inputs = (
        ["input_ids", "attention_mask"]
        + [f"past_key_{i}" for i in layers]
        + [f"past_value_{i}" for i in layers]
    )
    outputs = ["logits"] + [f"present_key_{i}" for i in layers] + [f"present_value_{i}" for i in layers]
    return inputs, outputs


def export_decoder_step(model: DecoderLM, path: Path, opset: int) -> onnx.ModelProto:
    """Write the incremental graph: ``input_ids`` (B, T), ``attention_mask`` (B, P + T) over past and
    new tokens, ``past_key_i``/``past_value_i`` (B, n_kv_heads, P, head_dim) -> ``logits`` (B, T, V),
    ``present_key_i``/``present_value_i`` (B, n_kv_heads, P + T, head_dim). P may be 0."""
    model = model.eval()
    spec = model.spec
    assert spec.n_kv_heads is not None
    n, past, new = spec.n_layers, *STEP_EXAMPLE[:2]
    kv_shape = (2, spec.n_kv_heads, past, spec.head_dim)
    example = (
        torch.zeros(2, new, dtype=torch.long),
        torch.ones(2, past + new, dtype=torch.long),
        [torch.zeros(kv_shape, dtype=_dtype(model)) for _ in range(n)],
        [torch.zeros(kv_shape, dtype=_dtype(model)) for _ in range(n)],
    )
    # The mask spans past + new tokens, a relation named Dims cannot state; AUTO lets export infer it.
    auto = torch.export.Dim.AUTO
    kv_axes = [{0: auto, 2: auto}] * n
    dynamic = {
        "input_ids": {0: auto, 1: auto},
        "attention_mask": {0: auto, 1: auto},
        "past_keys": kv_axes,
        "past_values": kv_axes,
    }
    inputs, outputs = step_names(n)
    program = _export(DecoderStep(model), example, inputs, outputs, dynamic, opset)
    names = {("input_ids", 0): "batch", ("input_ids", 1): "sequence", ("attention_mask", 1): "total_sequence"}
    for i in range(n):
        names |= {(f"past_{kv}_{i}", 2): "past_sequence" for kv in ("key", "value")}
    return _save(program, path, names)


class FixedDecoderStep(DecoderStep):
    """The decode step at fixed shapes, which a GPU captures once and replays as a CUDA graph: one
    new token (B, 1) and each layer's window of the last max_seq_len - 1 positions' keys and
    values, left-padded (attention_mask 0 where empty), in; logits and the window slid by one
    position out. The window is a left-padded cache, read as DecoderLM reads any padded batch."""

    def forward(  # its inputs named as the export names them
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        window_keys: list[torch.Tensor],
        window_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        logits, keys, values = super().forward(input_ids, attention_mask, window_keys, window_values)
        return logits, [k[:, :, 1:] for k in keys], [v[:, :, 1:] for v in values]  # the oldest out


def fixed_step_names(n_layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of the fixed-shape step graph, per layer."""
    layers = range(n_layers)
    window = [f"window_{kv}_{i}" for kv in ("key", "value") for i in layers]
    return ["input_ids", "attention_mask", *window], ["logits", *(f"next_{w}" for w in window)]


def export_decoder_fixed_step(model: DecoderLM, path: Path, opset: int) -> onnx.ModelProto:
    """Write the fixed-shape step graph: ``input_ids`` (B, 1), ``attention_mask`` (B, max_seq_len)
    over the window and the new token, ``window_key_i``/``window_value_i`` (B, n_kv_heads,
    max_seq_len - 1, head_dim) -> ``logits`` (B, 1, V), ``next_window_key_i``/``next_window_value_i``
    of the window's shape. Only the batch axis is dynamic (a runtime fixes it per CUDA graph)."""
    model = model.eval()
    spec = model.spec
    assert spec.n_kv_heads is not None
    n, window = spec.n_layers, spec.max_seq_len - 1
    kv_shape = (2, spec.n_kv_heads, window, spec.head_dim)
    example = (
        torch.zeros(2, 1, dtype=torch.long),
        torch.ones(2, window + 1, dtype=torch.long),
        [torch.zeros(kv_shape, dtype=_dtype(model)) for _ in range(n)],
        [torch.zeros(kv_shape, dtype=_dtype(model)) for _ in range(n)],
    )
    batch = torch.export.Dim("batch", min=1, max=4096)
    dynamic = {
        "input_ids": {0: batch},
        "attention_mask": {0: batch},
        "window_keys": [{0: batch}] * n,
        "window_values": [{0: batch}] * n,
    }
    inputs, outputs = fixed_step_names(n)
    program = _export(FixedDecoderStep(model), example, inputs, outputs, dynamic, opset)
    return _save(program, path, {})


class Seq2SeqEncoder(nn.Module):
    """The encoder graph: the source, once, to each decoder block's cross-attention keys and values."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, source_ids: torch.Tensor, source_mask: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        memory = self.model.project_memory(self.model.encode(source_ids, source_mask))
        return [m.key for m in memory], [m.value for m in memory]


class Seq2SeqStep(nn.Module):
    """The decoder step graph: new target tokens, the self-attention cache and the source's
    cross-attention keys and values in; logits and the extended cache out."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        source_mask: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        memory_keys: list[torch.Tensor],
        memory_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        cache = [KVCache(k, v) for k, v in zip(past_keys, past_values, strict=True)]
        memory = [KVCache(k, v) for k, v in zip(memory_keys, memory_values, strict=True)]
        logits = self.model.decode(input_ids, memory, source_mask, None, cache)
        return logits, [c.key for c in cache], [c.value for c in cache]


def seq2seq_names(n_layers: int) -> tuple[list[str], list[str], list[str]]:
    """The encoder graph's outputs, and the step graph's inputs and outputs, per decoder layer."""
    layers = range(n_layers)
    memory = [f"memory_key_{i}" for i in layers] + [f"memory_value_{i}" for i in layers]
    past = [f"past_key_{i}" for i in layers] + [f"past_value_{i}" for i in layers]
    present = [f"present_key_{i}" for i in layers] + [f"present_value_{i}" for i in layers]
    return memory, ["input_ids", "source_mask", *past, *memory], ["logits", *present]


def export_seq2seq_encoder(model: Seq2Seq, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``source_ids``, ``source_mask`` (B, S) -> ``memory_key_i``/``memory_value_i``
    (B, n_kv_heads, S, head_dim) for each decoder layer."""
    model = model.eval()
    n = len(model.decoder_blocks)
    example_len = min(model.spec.max_seq_len, 8)
    example = (torch.zeros(2, example_len, dtype=torch.long), torch.ones(2, example_len, dtype=torch.long))
    auto = torch.export.Dim.AUTO
    memory, _, _ = seq2seq_names(n)
    program = _export(
        Seq2SeqEncoder(model),
        example,
        ["source_ids", "source_mask"],
        memory,
        {"source_ids": {0: auto, 1: auto}, "source_mask": {0: auto, 1: auto}},
        opset,
    )
    return _save(program, path, {("source_ids", 0): "batch", ("source_ids", 1): "source_sequence"})


def export_seq2seq_step(model: Seq2Seq, path: Path, opset: int) -> onnx.ModelProto:
    """Write ``input_ids`` (B, T), ``source_mask`` (B, S), ``past_key_i``/``past_value_i``
    (B, n_kv_heads, P, head_dim), ``memory_key_i``/``memory_value_i`` (B, n_kv_heads, S, head_dim)
    -> ``logits`` (B, T, V), ``present_key_i``/``present_value_i`` (B, n_kv_heads, P + T, head_dim)."""
    model = model.eval()
    spec = model.spec
    n = len(model.decoder_blocks)
    past, new, source = STEP_EXAMPLE
    kv = (2, spec.n_kv_heads, past, spec.head_dim)
    mem = (2, spec.n_kv_heads, source, spec.head_dim)
    example = (
        torch.zeros(2, new, dtype=torch.long),
        torch.ones(2, source, dtype=torch.long),
        [torch.zeros(kv, dtype=_dtype(model)) for _ in range(n)],
        [torch.zeros(kv, dtype=_dtype(model)) for _ in range(n)],
        [torch.zeros(mem, dtype=_dtype(model)) for _ in range(n)],
        [torch.zeros(mem, dtype=_dtype(model)) for _ in range(n)],
    )
    auto = torch.export.Dim.AUTO
    kv_axes = [{0: auto, 2: auto}] * n
    dynamic = {
        "input_ids": {0: auto, 1: auto},
        "source_mask": {0: auto, 1: auto},
        "past_keys": kv_axes,
        "past_values": kv_axes,
        "memory_keys": kv_axes,
        "memory_values": kv_axes,
    }
    _, inputs, outputs = seq2seq_names(n)
    program = _export(Seq2SeqStep(model), example, inputs, outputs, dynamic, opset)
    names = {("input_ids", 0): "batch", ("input_ids", 1): "sequence", ("source_mask", 1): "source_sequence"}
    for i in range(n):  # the exporter may give each layer's tensors their own symbols
        names |= {(f"past_{kv}_{i}", 2): "past_sequence" for kv in ("key", "value")}
        names |= {(f"memory_{kv}_{i}", 2): "source_sequence" for kv in ("key", "value")}
    return _save(program, path, names)


def _dtype(model: nn.Module) -> torch.dtype:
    """The float type of the model's weights: example activations and caches take it (fp16 export)."""
    return next(model.parameters()).dtype


def _export(
    module: nn.Module, example: tuple, inputs: list[str], outputs: list[str], dynamic: dict, opset: int
) -> torch.onnx.ONNXProgram:
    with _quiet():
        program = torch.onnx.export(
            module,
            example,
            dynamo=True,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=dynamic,
            opset_version=opset,
            verbose=False,
        )
    assert program is not None  # dynamo=True always returns the program
    return program


def _save(program: torch.onnx.ONNXProgram, path: Path, names: dict[tuple[str, int], str]) -> onnx.ModelProto:
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    proto = onnx.load(str(path))
    _rename_symbols(proto, names)
    _drop_traces(proto.graph)
    onnx.save(proto, str(path))
    onnx.checker.check_model(proto, full_check=True)  # full_check runs strict shape inference too
    return proto


def _rename_symbols(proto: onnx.ModelProto, names: dict[tuple[str, int], str]) -> None:
    """Give the exporter's generated axis symbols (s0, s1, ...) readable names, graph-wide."""
    values = {v.name: v for v in proto.graph.input}
    mapping = {}
    for (value, axis), name in names.items():
        symbol = values[value].type.tensor_type.shape.dim[axis].dim_param
        if symbol:
            mapping[symbol] = name
    for v in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in v.type.tensor_type.shape.dim:
            if dim.dim_param:  # a symbol or an expression of symbols, e.g. "s3 + s70"
                renamed = re.sub(r"\bs\d+\b", lambda m: mapping.get(m.group(), m.group()), dim.dim_param)
                terms = renamed.split(" + ")  # a sum in one order, whichever the exporter wrote
                if all(re.fullmatch(r"\w+", term) for term in terms):
                    renamed = " + ".join(sorted(terms))
                dim.dim_param = renamed


def _drop_traces(graph: onnx.GraphProto) -> None:
    """Each node's metadata without the exporter's record of the Python that made it (UNTRACED):
    its stack trace names the exporting machine's files (its home, its virtualenv), which a bundle
    must not carry to whoever it is given. The module scopes stay (`tfcompile optimize` reads them)."""
    for node in graph_nodes(graph):
        kept = [p for p in node.metadata_props if p.key not in UNTRACED]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


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
