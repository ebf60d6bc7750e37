"""The parity gate of `tfcompile optimize` against transformations that are wrong in ways a lax
check would miss: outputs that turn NaN, a fusion whose error hides behind a later step's looser
bound, a graph that goes wrong only at long sequences, and a quantization that changes nothing
(which the manifest would record as done). Each is refused, and nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tfcompile.optimize import OptimizeError, Plan, optimize_bundle
from tfcompile.optimize.passes import quantize_int8

Wrong = Callable[[onnx.ModelProto], onnx.ModelProto]


def plus(model: onnx.ModelProto, output: str, nodes: list[onnx.NodeProto], term: str) -> onnx.ModelProto:
    """A copy of ``model`` whose ``output`` has ``term`` (computed by ``nodes``) added to it."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    for node in changed.graph.node:
        node.output[:] = [f"{output}_raw" if name == output else name for name in node.output]
    changed.graph.node.extend([*nodes, helper.make_node("Add", [f"{output}_raw", term], [output])])
    return changed


def constant(name: str, value: float | list[int]) -> onnx.TensorProto:
    kind = np.float32 if isinstance(value, float) else np.int64
    return numpy_helper.from_array(np.array(value, dtype=kind), name)


def nan_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    changed = plus(model, "logits", [], "wrong_nan")
    changed.graph.initializer.append(constant("wrong_nan", float("nan")))
    return changed


def logits_off_by_1e3(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every logit 0.1% too large: ten times the fusion's bound, a tenth of fp16's."""
    changed = plus(
        model, "logits", [helper.make_node("Mul", ["logits_raw", "wrong_gain"], ["wrong_off"])], "wrong_off"
    )
    changed.graph.initializer.append(constant("wrong_gain", 1e-3))
    return changed


def wrong_beyond_16(input_name: str, axis: int) -> Wrong:
    """A pass that shifts the first output of each graph reading ``input_name`` once that input's
    ``axis`` is longer than 16, and leaves other graphs unchanged."""

    def wrong(model: onnx.ModelProto) -> onnx.ModelProto:
        if input_name not in [i.name for i in model.graph.input]:
            return model
        nodes = [
            helper.make_node("Shape", [input_name], ["wrong_shape"]),
            helper.make_node("Gather", ["wrong_shape", "wrong_axis"], ["wrong_length"]),
            helper.make_node("Greater", ["wrong_length", "wrong_16"], ["wrong_long"]),
            helper.make_node("Cast", ["wrong_long"], ["wrong_shift"], to=onnx.TensorProto.FLOAT),
        ]
        changed = plus(model, model.graph.output[0].name, nodes, "wrong_shift")
        changed.graph.initializer.extend([constant("wrong_axis", [axis]), constant("wrong_16", [16])])
        return changed

    return wrong


def fused_wrongly(wrong: Wrong, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tfcompile.optimize.fuse", lambda model: (wrong(model), "a wrong fuser"))


def test_a_graph_that_turns_nan_is_refused(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fused_wrongly(nan_logits, monkeypatch)
    with pytest.raises(OptimizeError, match=r"fused model graph gives outputs that are not finite"):
        optimize_bundle(char_bundle, tmp_path / "out", Plan(fuse=True), None)
    assert not list(tmp_path.iterdir())


def test_a_quantized_graph_that_turns_nan_is_refused_even_ungated(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tfcompile.optimize.quantize_int8", lambda model: nan_logits(quantize_int8(model)))
    with pytest.raises(OptimizeError, match=r"int8 model graph gives outputs that are not finite"):
        optimize_bundle(char_bundle, tmp_path / "out", Plan(quantize="int8"), None)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("then", [Plan(fuse=True, quantize="int8"), Plan(fuse=True, precision="fp16")])
def test_a_fusion_is_held_to_its_own_bound_whatever_follows_it(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: Plan
) -> None:
    fused_wrongly(logits_off_by_1e3, monkeypatch)
    with pytest.raises(
        OptimizeError, match=r"the fused model graph differs .* by 0\.001\d* .* more than 0\.0001"
    ):
        optimize_bundle(char_bundle, tmp_path / "out", then, None)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kind", "graph", "read"),
    [
        ("char_bundle", "step", ("past_key_0", 2)),
        ("translator_bundle", "encoder", ("source_ids", 1)),
        ("translator_bundle", "step", ("past_key_0", 2)),
    ],
)
def test_every_graph_is_checked_at_the_context_window(
    kind: str,
    graph: str,
    read: tuple[str, int],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wrong only once a cache or a source is longer than 16 (the contexts are 64 and 48)."""
    bundle: Path = request.getfixturevalue(kind)
    fused_wrongly(wrong_beyond_16(*read), monkeypatch)
    with pytest.raises(OptimizeError, match=rf"the fused {graph} graph differs from the source's"):
        optimize_bundle(bundle, tmp_path / "out", Plan(fuse=True), None)
    assert not list(tmp_path.iterdir())


def test_a_graph_quantized_already_is_not_quantized_again_whatever_its_manifest_says(
    char_bundle: Path, tmp_path: Path
) -> None:
    """A quantized bundle whose manifest was edited to drop its history: the quantization would
    change nothing, and the manifest would record int4 weights in an int8 graph."""
    int8 = tmp_path / "int8"
    optimize_bundle(char_bundle, int8, Plan(quantize="int8"), None)
    manifest = json.loads((int8 / "manifest.json").read_text())
    del manifest["optimization"]
    (int8 / "manifest.json").write_text(json.dumps(manifest))
    for scheme in ("int8", "int4"):
        with pytest.raises(OptimizeError, match=f"{scheme} quantization found no float weight to quantize"):
            optimize_bundle(int8, tmp_path / "again", Plan(quantize=scheme), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8"]


def test_parity_reads_a_long_context_only_up_to_the_longest_sequence_export_checks(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uncapped, a 32k-context bundle's step and forward graphs read all of it: (1, H, 32768, 32768)
    scores. Here the char bundle's context of 64, held to a cap of 16."""
    from tfcompile import sequences
    from tfcompile.optimize import parity

    monkeypatch.setattr(sequences, "LONGEST", 16)
    read: list[int] = []
    run = parity.run

    def recorded(session: object, feed: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        ids = feed.get("input_ids", feed.get("source_ids"))
        if ids is not None:
            mask = feed.get("attention_mask")
            read.append(ids.shape[1] if mask is None else mask.shape[1])
        return run(session, feed, names)

    monkeypatch.setattr(parity, "run", recorded)
    optimize_bundle(char_bundle, tmp_path / "fused", Plan(fuse=True), None)
    assert max(read) == 16
