"""Graph transformations for `tfcompile optimize`, each an ONNX model in, an ONNX model out (inputs
and outputs keep their names), and the operators it introduced counted.

- ``fuse``: onnxruntime's contrib operators in place of the exporter's subgraphs (attention,
  residual + norm, GELU), by whichever of onnxscript's ORT rewrite rules and onnxruntime's
  transformer optimizer fuses more of the graph into one that onnxruntime loads.
- ``quantize_int8``: dynamic int8 quantization (int8 weights, per output channel; activations
  quantized on the fly), onnxruntime's ``quantize_dynamic``, for MatMul weights and embedding
  tables.
- ``quantize_int4``: 4-bit weight-only quantization (``MatMulNBits``, blocks of 32, asymmetric,
  int8 compute), onnxruntime's ``MatMulNBitsQuantizer``.
- ``to_fp16``: float16 weights, activations, inputs and outputs; a mixture of experts' routing
  stays float32.

Each is refused (OptimizeError) when its tool is missing, rather than silently skipped, and when
its tool fails (``onnxruntime_failure``).
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tfcompile.errors import ExportError, first_line
from tfcompile.onnx_nodes import graph_nodes
from tfcompile.runtime.ort import ort
from tfcompile.runtime.session import SessionOptions

CONTRIB = "com.microsoft"
QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear", "MatMulNBits")
INT4_BLOCK = 32
# A node's module classes, outermost first, in the metadata torch's exporter writes (a list's repr),
# and the classes of a mixture of experts and of each of its experts (tests hold them to tfcompile.nn's).
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
MOE_CLASS = "tfcompile.nn.moe.MoE"
EXPERT_CLASS = "tfcompile.nn.feedforward.FeedForward"


class OptimizeError(ExportError):
    """A transformation that cannot be done, or whose result fails its check."""


def operator_counts(model: onnx.ModelProto) -> Counter[str]:
    """Node types by (domain-qualified) name, over the main graph and its subgraphs."""
    counts: Counter[str] = Counter()
    for node in graph_nodes(model.graph):
        counts[f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type] += 1
    return counts


def introduced(
    before: onnx.ModelProto, after: onnx.ModelProto, kinds: Callable[[str], bool]
) -> dict[str, int]:
    """Operators of ``kinds`` that ``after`` has more of than ``before``."""
    grown = operator_counts(after) - operator_counts(before)
    return {op: n for op, n in sorted(grown.items()) if kinds(op)}


@contextmanager
def onnxruntime_failure(doing: str) -> Iterator[None]:
    """onnxruntime (or onnxscript) failing while ``doing`` something -> OptimizeError("onnxruntime
    could not <doing>: <the first line of its message>"), not its own exception."""
    try:
        yield
    except OptimizeError:
        raise
    except Exception as e:  # onnxruntime's Fail, InvalidGraph, ...; a tool's own errors
        raise OptimizeError(f"onnxruntime could not {doing}: {first_line(e)}") from None


def fuse(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The graph with onnxruntime's fused operators, and which tool made it: both tools run and,
    of the graphs onnxruntime can load, the one with more contrib operators wins (onnxruntime's
    on a tie: its fusions are the ones its CPU kernels are tuned for). OptimizeError when none
    fused anything onnxruntime can load."""
    candidates: dict[str, onnx.ModelProto] = {}
    failed: list[str] = []
    for tool, run in FUSERS.items():
        try:
            # Each on its own copy: onnxruntime's optimizer rewrites the model it is given.
            with onnxruntime_failure(f"fuse with {tool}"):
                candidates[tool] = _loadable(run(_copy(model)))
        except OptimizeError as e:
            failed.append(str(e))
    before = _contrib_count(model)
    fusing = {tool: fused for tool, fused in candidates.items() if _contrib_count(fused) > before}
    if not fusing:
        half = any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)
        hint = "; fuse the fp32 bundle instead, with --precision fp16 to convert it after fusion" * half
        found = "; ".join([*(f"{tool} fused nothing" for tool in candidates), *failed])
        raise OptimizeError(f"no fusion applies to this graph ({found}){hint}. Nothing was written")
    tool = max(fusing, key=lambda name: _contrib_count(fusing[name]))
    fused = fusing[tool]
    if not any(o.domain == CONTRIB for o in fused.opset_import):  # later passes check it
        fused.opset_import.append(onnx.helper.make_opsetid(CONTRIB, 1))
    return fused, tool


def _loadable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, once onnxruntime has loaded it (on the CPU); its error otherwise."""
    ort.InferenceSession(
        model.SerializeToString(), SessionOptions().to_ort(), providers=["CPUExecutionProvider"]
    )
    return model


@contextmanager
def _quiet() -> Iterator[None]:
    """The tools log warnings and tracebacks (a shape inference they skip, advice to preprocess)
    about steps whose results we check ourselves; they would read as errors."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _contrib_count(model: onnx.ModelProto) -> int:
    return sum(n for op, n in operator_counts(model).items() if op.startswith(CONTRIB))


def fuse_with_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    # opt_level 0: the Python fusions only; onnxruntime's own graph optimizations run at load.
    with _quiet():
        optimized = optimize_model(model, model_type="bert", opt_level=0, optimization_options=options)
    return optimized.model


def fuse_with_onnxscript(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    with _quiet():
        fused, _ = optimize_for_ort(onnx_ir.from_proto(model))
    return onnx_ir.to_proto(fused)


# The fusion tools by name, in the order that breaks a tie.
FUSERS: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]] = {
    "onnxruntime transformers.optimizer": fuse_with_onnxruntime,
    "onnxscript rewriter.ort_fusions": fuse_with_onnxscript,
}


def quantize_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """Dynamic int8: MatMul weights and Gather tables stored as int8 (per output channel), the
    MatMuls computed in integers against activations quantized per call (MatMulInteger), the
    tables dequantized after the lookup. A weight used transposed (a tied output layer) gets its
    own transposed copy first, so that its MatMul quantizes too."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as scratch:
        source, target = Path(scratch) / "in.onnx", Path(scratch) / "out.onnx"
        onnx.save(fold_weight_transposes(model), source)
        with _quiet(), onnxruntime_failure("quantize the graph to int8"):
            quantize_dynamic(
                source,
                target,
                op_types_to_quantize=["MatMul", "Gather"],
                per_channel=True,
                weight_type=QuantType.QInt8,
                extra_options={"MatMulConstBOnly": True},
            )
        return onnx.load(target)


def quantize_int4(model: onnx.ModelProto) -> onnx.ModelProto:
    """4-bit weight-only: each MatMul weight stored in blocks of 32 values along its input axis,
    each block with its own scale and zero point (asymmetric), computed as MatMulNBits with int8
    accumulation (accuracy_level 4). Activations stay float."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    with _quiet(), onnxruntime_failure("quantize the graph to int4"):
        quantizer = MatMulNBitsQuantizer(
            fold_weight_transposes(model), bits=4, block_size=INT4_BLOCK, is_symmetric=False, accuracy_level=4
        )
        quantizer.process()
    return quantizer.model.model


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float tensor in float16, the graph's inputs and outputs too, but for each mixture of
    experts' routing (``routing_nodes``), kept in float32 as an fp16 export keeps it."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    routing = routing_nodes(model)
    with onnxruntime_failure("convert the graph to fp16"):
        half = convert_float_to_float16(model, keep_io_types=False, node_block_list=routing)
    _join_float32_nodes(half, set(routing))
    return half


def _join_float32_nodes(model: onnx.ModelProto, kept: set[str]) -> None:
    """The converter casts each output of a node ``kept`` in float32 to float16, and back to float32
    where another kept node reads it (router scores rounded to float16 between the kept nodes), and
    casts the float32 weights they read to float32: each such Cast to float32 is bypassed, the kept
    nodes reading the float32 tensor itself, and the casts no node reads any more are removed."""
    graph = model.graph
    made_by = {output: node for node in graph.node for output in node.output}
    weights = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    outputs = {output for node in graph.node if node.name in kept for output in node.output}

    def halved(name: str) -> str | None:
        """The kept node's output that the converter's Cast to float16 made ``name`` of, if it did:
        the converter renames a kept node's float output X to X_cast_to_fp16 and casts that back to
        X (a Cast of the graph's own, from an integer output say, is left alone)."""
        node = made_by.get(name)
        if node is None or node.op_type != "Cast" or _cast_to(node) != onnx.TensorProto.FLOAT16:
            return None
        source = node.input[0]
        return source if source in outputs and source == f"{node.output[0]}_cast_to_fp16" else None

    bypass = {}
    for node in graph.node:
        if node.op_type == "Cast" and _cast_to(node) == onnx.TensorProto.FLOAT:
            source = node.input[0]
            origin = source if source in weights else halved(source)
            if origin is not None:
                bypass[node.output[0]] = origin
    for node in graph.node:
        node.input[:] = [bypass.get(name, name) for name in node.input]
    while True:  # casts read by no node nor output, and the casts only they read
        read = {name for node in graph_nodes(graph) for name in node.input} | {o.name for o in graph.output}
        unread = [n for n in graph.node if n.op_type == "Cast" and not set(n.output) & read]
        if not unread:
            break
        for node in unread:
            graph.node.remove(node)
    made = {output for node in graph.node for output in node.output}
    typed = [v for v in graph.value_info if v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(typed)


def _cast_to(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def routing_nodes(model: onnx.ModelProto) -> list[str]:
    """The names of the nodes of each mixture-of-experts layer outside its experts: its router, the
    scores, the top-k choice and the weighted sum of the experts' outputs. Float16 router weights
    and scores tie or flip experts whose scores are close; float32 ones choose as the float32 graph.
    Read from the module scopes the exporter writes into each node's metadata."""
    names = []
    for node in model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == CLASS_HIERARCHY), "")
        classes = [part.strip(" '\"") for part in scopes.strip("[]").split(",")]
        if node.name and MOE_CLASS in classes:
            below = classes[len(classes) - classes[::-1].index(MOE_CLASS) : -1]  # its modules, not its op
            if EXPERT_CLASS not in below:
                names.append(node.name)
    return names


def fold_weight_transposes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy where each Transpose of an initializer is replaced by the transposed initializer,
    so that a MatMul reading it has a constant weight (the exporter writes a tied output layer
    as Transpose(embedding) -> MatMul)."""
    model = _copy(model)
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    kept = []
    for node in graph.node:
        if node.op_type != "Transpose" or node.input[0] not in weights:
            kept.append(node)
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        array = numpy_helper.to_array(weights[node.input[0]])
        graph.initializer.append(
            numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)), node.output[0])
        )
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in graph_nodes(graph) for name in node.input} | {o.name for o in graph.output}
    unused = [init for init in graph.initializer if init.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
