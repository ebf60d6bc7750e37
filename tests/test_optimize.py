"""tfcompile optimize: fused graphs keep parity, quantized ones pass (or fail) their task's accuracy
gate on held-out data, the source is never changed, and an optimized bundle loads, verifies and
serves like any other."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import ROOT, assert_follows_schema
from serving import BackgroundServer

from tfcompile.cli import main
from tfcompile.errors import UserError
from tfcompile.export import verify_bundle
from tfcompile.optimize import GateData, OptimizeError, Plan, optimize_bundle, passes
from tfcompile.runtime import LanguageModel, load
from tfcompile.runtime.bundle import sha256_file
from tfcompile.tasks.causal_lm import LanguageModelling
from tfcompile.tasks.task import Batch

GATE_EXAMPLES = 16


def run_of(bundle: Path) -> Path:
    return bundle.parent / "run"  # the conftest fixtures keep ROOT/run beside ROOT/bundle


def digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def fused(char_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fused") / "bundle"
    optimize_bundle(char_bundle, out, Plan(fuse=True), None)
    return out


@pytest.fixture(scope="module")
def int8(char_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "bundle"
    optimize_bundle(char_bundle, out, Plan(quantize="int8"), GateData(run_of(char_bundle), GATE_EXAMPLES))
    return out


def test_fusion_keeps_parity_and_the_greedy_tokens(char_bundle: Path, fused: Path) -> None:
    manifest = json.loads((fused / "manifest.json").read_text())
    (optimization,) = manifest["optimization"]
    (step,) = optimization["steps"]
    assert step["kind"] == "fuse" and sum(step["operators"].values()) > 0
    assert all(op.startswith("com.microsoft::") for op in step["operators"])
    assert max(optimization["parity"].values()) <= 1e-4
    assert optimization["source"] == sha256_file(char_bundle / "manifest.json")
    source, optimized = load(char_bundle), load(fused)
    assert isinstance(source, LanguageModel) and isinstance(optimized, LanguageModel)
    prompts = ["ROMEO:", "First Citizen:\nBefore"]
    assert optimized.generate_text(prompts, 12, temperature=0) == source.generate_text(
        prompts, 12, temperature=0
    )
    assert_follows_schema(fused)


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every batch the gate evaluates, as it reads them."""
    rows: list[int] = []
    evaluate = LanguageModelling.evaluate

    def counted(self: LanguageModelling, model: Any, batches: Iterator[Batch]) -> dict[str, float]:
        def seen() -> Iterator[Batch]:
            for batch in batches:
                rows.append(len(batch["input_ids"]))
                yield batch

        return evaluate(self, model, seen())

    monkeypatch.setattr(LanguageModelling, "evaluate", counted)
    return rows


def test_the_gate_reads_as_many_windows_as_it_says(
    char_bundle: Path, tmp_path: Path, read: list[int]
) -> None:
    """It read whole batches of 8: asked for 5 windows, it measured 8 and recorded 5."""
    done = optimize_bundle(
        char_bundle, tmp_path / "out", Plan(quantize="int8"), GateData(run_of(char_bundle), 13)
    )
    assert done.gate is not None and done.gate.data.startswith("13 windows")
    assert sum(read) == 2 * 13  # the source's and the optimized bundle's


@pytest.mark.slow  # every window of the split, twice: a minute
def test_a_gate_asked_for_more_windows_than_the_split_has_reads_them_all(
    char_bundle: Path, tmp_path: Path, read: list[int]
) -> None:
    """10**30 windows ran for ever."""
    done = optimize_bundle(
        char_bundle, tmp_path / "all", Plan(quantize="int8"), GateData(run_of(char_bundle), 10**30)
    )
    assert done.gate is not None
    windows = int(done.gate.data.split()[0])
    assert 13 < windows < 10**6 and sum(read) == 2 * windows


def test_the_gate_of_a_moved_run_keeps_its_token_cache_beside_it(char_bundle: Path, tmp_path: Path) -> None:
    """It tokenized into the runs folder the run was trained in (train.runs_dir), wherever it is now."""
    moved = shutil.copytree(run_of(char_bundle), tmp_path / "elsewhere" / "runs" / "run")
    optimize_bundle(char_bundle, tmp_path / "out", Plan(quantize="int8"), GateData(moved, 8))
    assert any((moved.parent / ".cache").iterdir())


def test_optimize_opens_every_graph_as_the_runtime_does(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own sessions took onnxruntime's defaults, whose common-subexpression elimination is
    quadratic in some chains of nodes (a 460 KB graph loaded in 28 s); the runtime's leave it out."""
    opened: list[Any] = []
    session = passes.ort.InferenceSession

    def recorded(model: Any, options: Any = None, **kwargs: Any) -> Any:
        opened.append(options)
        return session(model, options, **kwargs)

    monkeypatch.setattr(passes.ort, "InferenceSession", recorded)
    optimize_bundle(char_bundle, tmp_path / "fused", Plan(fuse=True), None)
    entry = "optimization.disable_specified_optimizers"
    assert opened and all(
        o is not None and o.get_session_config_entry(entry) == "CommonSubexpressionElimination"
        for o in opened
    )


@pytest.mark.parametrize("kind", ["classifier_bundle", "translator_bundle", "image_bundle"])
def test_every_bundle_kind_fuses_its_attention_and_keeps_parity(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    bundle: Path = request.getfixturevalue(kind)
    done = optimize_bundle(bundle, tmp_path / "fused", Plan(fuse=True), None)
    (step,) = done.steps
    assert step.operators.get("com.microsoft::MultiHeadAttention", 0) > 0, step.operators
    assert done.parity and max(done.parity.values()) <= 1e-4
    verify_bundle(tmp_path / "fused", run_of(bundle))


def test_int8_passes_its_gate_records_it_and_verifies(char_bundle: Path, int8: Path) -> None:
    manifest = json.loads((int8 / "manifest.json").read_text())
    (optimization,) = manifest["optimization"]
    gate = optimization["gate"]
    assert gate["metric"] == "loss" and gate["allowed"] == "+1%"
    assert gate["optimized"] <= gate["source"] * 1.01
    assert f"{GATE_EXAMPLES} windows" in gate["data"]
    ops = optimization["steps"][0]["operators"]
    assert ops["MatMulInteger"] > 0 and ops["DynamicQuantizeLinear"] > 0
    reports = verify_bundle(int8, run_of(char_bundle))
    assert all(report.passed for report in reports.values())
    graph = onnx.load(str(int8 / "model.onnx"))
    assert any(init.data_type == onnx.TensorProto.INT8 for init in graph.graph.initializer)
    assert_follows_schema(int8)


def test_int4_is_weight_only_matmulnbits_and_gated_at_three_percent(
    char_bundle: Path, tmp_path: Path
) -> None:
    optimization = optimize_bundle(
        char_bundle, tmp_path / "int4", Plan(quantize="int4"), GateData(run_of(char_bundle), GATE_EXAMPLES)
    )
    assert optimization.steps[0].operators["com.microsoft::MatMulNBits"] > 0
    assert optimization.gate is not None and optimization.gate.allowed == "+3%"
    model = load(tmp_path / "int4")
    assert isinstance(model, LanguageModel) and len(model.generate_text("ROMEO:", 5, temperature=0)) == 11


def test_the_gate_refuses_a_broken_quantization_and_writes_nothing(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quantize = passes.quantize_int8

    def broken(model: onnx.ModelProto) -> onnx.ModelProto:
        """int8 with every quantized weight's scale multiplied by 8."""
        quantized = quantize(model)
        for init in quantized.graph.initializer:
            if init.name.endswith("_scale"):
                array = onnx.numpy_helper.to_array(init) * 8
                init.CopyFrom(onnx.numpy_helper.from_array(array.astype(np.float32), init.name))
        return quantized

    monkeypatch.setattr("tfcompile.optimize.quantize_int8", broken)
    before = digests(char_bundle)
    with pytest.raises(OptimizeError, match=r"fails its accuracy gate: loss .* allowed: \+1%"):
        optimize_bundle(
            char_bundle, tmp_path / "out", Plan(quantize="int8"), GateData(run_of(char_bundle), 8)
        )
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())
    assert digests(char_bundle) == before


def test_a_classifier_is_gated_on_accuracy_and_takes_no_int4(classifier_bundle: Path, tmp_path: Path) -> None:
    optimization = optimize_bundle(
        classifier_bundle, tmp_path / "int8", Plan(quantize="int8"), GateData(run_of(classifier_bundle))
    )
    assert optimization.gate is not None
    assert optimization.gate.metric == "accuracy" and optimization.gate.allowed == "-0.005"
    assert "sentences of the validation split" in optimization.gate.data
    with pytest.raises(OptimizeError, match="int4 quantization is for decoders"):
        optimize_bundle(
            classifier_bundle, tmp_path / "int4", Plan(quantize="int4"), GateData(run_of(classifier_bundle))
        )


def test_fp16_keeps_parity_and_declares_float16(char_bundle: Path, tmp_path: Path) -> None:
    optimization = optimize_bundle(char_bundle, tmp_path / "fp16", Plan(precision="fp16"), None)
    assert max(optimization.parity.values()) <= 1e-2
    manifest = json.loads((tmp_path / "fp16" / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    assert manifest["graphs"]["step"]["outputs"][0]["dtype"] == "float16"
    source, half = load(char_bundle), load(tmp_path / "fp16")
    ids = np.array([[5, 6, 7, 8]])
    np.testing.assert_allclose(
        half.logits(ids), source.logits(ids), atol=5e-2 * np.abs(source.logits(ids)).max()
    )
    # Served, its float outputs are float32 (as the runtime gives them), and its metadata says so.
    with BackgroundServer({"half": tmp_path / "fp16"}) as server:
        metadata = httpx.get(f"{server.url}/v2/models/half").json()
        assert {o["name"]: o["datatype"] for o in metadata["outputs"]} == {"logits": "FP32"}
        inputs = [
            {"name": name, "shape": [1, 4], "datatype": "INT64", "data": data}
            for name, data in (("input_ids", ids.ravel().tolist()), ("attention_mask", [1] * 4))
        ]
        r = httpx.post(f"{server.url}/v2/models/half/infer", json={"inputs": inputs})
        (logits,) = r.json()["outputs"]
        assert logits["datatype"] == "FP32" and logits["data"] == half.logits(ids).ravel().tolist()


@pytest.mark.parametrize(
    ("plan", "needle"),
    [
        (Plan(), "nothing to do"),
        (Plan(quantize="int8", precision="fp16"), "quantize an fp32 bundle"),
    ],
)
def test_plans_that_cannot_be_done_are_refused(
    char_bundle: Path, tmp_path: Path, plan: Plan, needle: str
) -> None:
    with pytest.raises(OptimizeError, match=needle):
        optimize_bundle(char_bundle, tmp_path / "out", plan, None)


def test_the_source_and_other_folders_are_never_overwritten(
    char_bundle: Path, fused: Path, tmp_path: Path
) -> None:
    before = digests(char_bundle)
    with pytest.raises(OptimizeError, match="is the bundle itself"):
        optimize_bundle(char_bundle, char_bundle, Plan(fuse=True), None, force=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="not a bundle tfcompile wrote"):
        optimize_bundle(char_bundle, mine, Plan(fuse=True), None, force=True)
    with pytest.raises(OptimizeError, match="is fused already"):
        optimize_bundle(fused, tmp_path / "again", Plan(fuse=True), None)
    assert digests(char_bundle) == before and (mine / "notes.txt").read_text() == "keep"


def test_verify_against_another_run_than_the_recorded_one_says_so(char_bundle: Path, tmp_path: Path) -> None:
    """verify --run OTHER said only that OTHER no longer holds the checkpoint (as if pruned), or that
    parity failed, never that OTHER is not the run the bundle came from. A moved run checks alike."""
    moved = shutil.copytree(run_of(char_bundle), tmp_path / "moved")
    with pytest.warns(UserWarning, match=rf"--run {moved} is not the run .* records it was exported from"):
        reports = verify_bundle(char_bundle, moved)
    assert all(report.passed for report in reports.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verify_bundle(char_bundle, run_of(char_bundle))


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        (["export", "{run}", "--no-gate"], "set the gate of an optimized export: add --fuse or --quantize"),
        (["export", "{run}", "--gate-examples", "5"], "set the gate of an optimized export"),
        (
            ["optimize", "{bundle}", "--fuse", "--no-gate", "--gate-examples", "3"],
            "--gate-examples sets the gate that --no-gate leaves out",
        ),
        (["optimize", "{bundle}", "--fuse", "--gate-examples", "3"], "there is no run: give optimize --run"),
    ],
)
def test_gate_flags_that_would_do_nothing_are_usage_errors(
    char_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], needle: str
) -> None:
    """Each was taken and ignored (exit 0): the export was not optimized, or there was no gate."""
    args = [a.format(run=run_of(char_bundle), bundle=char_bundle) for a in command]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.slow  # end to end: CLI processes exporting and optimizing
def test_the_commands_optimize_and_export_quantized(
    char_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "opt"
    assert main(["optimize", str(char_bundle), "--out", str(out), "--quantize", "int8"]) == 2
    assert "--no-gate" in capsys.readouterr().err
    args = ["optimize", str(char_bundle), "--out", str(out), "--quantize", "int8", "--no-gate"]
    assert main(args) == 0
    said = capsys.readouterr()  # what it is doing, from the start, then what it did
    assert said.err.startswith(f"optimizing {char_bundle} (int8)") and "accuracy gate: not run" in said.out
    assert "gate" not in json.loads((out / "manifest.json").read_text())["optimization"][0]
    exported = tmp_path / "exported"
    run = str(run_of(char_bundle))
    args = ["export", run, "--out", str(exported), "--quantize", "int8", "--gate-examples", "8"]
    assert main(args) == 0
    said = capsys.readouterr()
    assert "exporting" in said.err and "then measuring both bundles on held-out data" in said.err
    assert f"optimizing the export of {run} (int8)" in said.err  # not its staging folder's name
    assert "accuracy gate: loss" in said.out and f"bundle: {exported}" in said.out
    assert json.loads((exported / "manifest.json").read_text())["optimization"][0]["gate"]["metric"] == "loss"


def test_an_optimized_bundle_serves(int8: Path) -> None:
    model = load(int8)
    assert isinstance(model, LanguageModel)
    with BackgroundServer({"lm": int8}) as server:
        body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}
        answer = httpx.post(f"{server.url}/v1/completions", json=body).json()
    assert answer["choices"][0]["text"] == model.generate_text("ROMEO:", 8, temperature=0)[len("ROMEO:") :]


def test_fp16_keeps_the_routing_nodes_float32_and_leaves_the_graphs_own_casts() -> None:
    """The routing nodes (in an MoE's scope, outside its experts) pass float32 from node to node,
    where onnxruntime's converter rounded each output to float16 and back; a Cast of the graph's
    own (an integer index to float) stays, its float32 reader fed by it, not by the integers."""
    from onnx import TensorProto, helper

    def node(op: str, inputs: list[str], output: str, scope: str, **attributes: Any) -> onnx.NodeProto:
        made = helper.make_node(op, inputs, [output], name=output, **attributes)
        made.metadata_props.add(key=passes.CLASS_HIERARCHY, value=f"['{scope}', 'aten.{op}']")
        return made

    moe, block = passes.MOE_CLASS, "tfcompile.nn.block.TransformerBlock"
    w = onnx.numpy_helper.from_array(np.array([[1.0, 1.0 + 1e-4], [0.5, 0.5]], np.float32), "w")
    nodes = [
        node("MatMul", ["x", "w"], "logits", moe),  # the router: a near tie float16 cannot tell
        node("Softmax", ["logits"], "scores", moe, axis=-1),
        node("ArgMax", ["scores"], "chosen", moe, axis=-1, keepdims=1),
        node("Cast", ["chosen"], "chosen_float", block, to=TensorProto.FLOAT),
        node("Mul", ["scores", "chosen_float"], "weighted", moe),
        node("Relu", ["weighted"], "y", block),
    ]
    graph = helper.make_graph(
        nodes,
        "routing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        [w],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    assert passes.routing_nodes(model) == ["logits", "scores", "chosen", "weighted"]
    half = passes.to_fp16(model)
    made_by = {output: n for n in half.graph.node for output in n.output}
    named = {n.name: n for n in half.graph.node}
    for reader, source in (("scores", "logits"), ("chosen", "scores")):  # float32 from node to node
        assert named[reader].input[0] == named[source].output[0]
    assert {i.name: i.data_type for i in half.graph.initializer}["w"] == TensorProto.FLOAT
    assert made_by[named["weighted"].input[1]].op_type == "Cast"  # the index, cast to float32
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.3, 0.7]], np.float32)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,), (want,) = session.run(None, {"x": x.astype(np.float16)}), reference.run(None, {"x": x})
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-3)


@pytest.mark.parametrize("case", ["existing bundle", "int4 for a classifier", "fp16"])
def test_export_refuses_what_optimizing_would_before_exporting(
    char_bundle: Path,
    classifier_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    """Both were refused after the whole export (27 s of a small model's), naming a staging folder."""
    import tfcompile.export

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("exported before the refusal")

    monkeypatch.setattr(tfcompile.export, "export_bundle", never)
    if case == "existing bundle":
        out = tmp_path / "out"
        shutil.copytree(char_bundle, out)
        args = ["export", str(run_of(char_bundle)), "--out", str(out), "--quantize", "int8"]
        expected = f"{out} already holds a bundle: pass --force to replace it"
    elif case == "fp16":
        out = tmp_path / "new"
        args = [
            "export",
            str(run_of(char_bundle)),
            "--out",
            str(out),
            "--quantize",
            "int8",
            "--precision",
            "fp16",
        ]
        expected = "--quantize int8 takes an fp32 export"
    else:
        out = tmp_path / "new"
        args = ["export", str(run_of(classifier_bundle)), "--out", str(out), "--quantize", "int4"]
        expected = "int4 quantization is for decoders"
    assert main(args) == 1
    assert expected in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_a_quantized_fixed_step_graph_is_measured_over_a_real_window_and_verifies(
    char_bundle: Path, tmp_path: Path
) -> None:
    """The fixed step graph (--cuda-graphs) was measured with its window fed standard normal noise:
    int4 recorded 0.0128 where verify, over a window the step graph filled, found 0.103 and
    refused the bundle optimize had just written."""
    assert main(["export", str(run_of(char_bundle)), "--out", str(tmp_path / "cg"), "--cuda-graphs"]) == 0
    optimization = optimize_bundle(tmp_path / "cg", tmp_path / "int4", Plan(quantize="int4"), None)
    assert set(optimization.parity) == {"model", "step", "fixed_step"}
    reports = verify_bundle(tmp_path / "int4", run_of(char_bundle))
    assert all(report.passed for report in reports.values()), {n: r.to_dict() for n, r in reports.items()}


def test_optimize_measures_each_case_on_its_own_scale_as_verify_does(tmp_path: Path) -> None:
    """optimize divided the worst difference over every case by the largest output over every
    case, verify each case's by its own: a case of small logits (batch 1 of a small classifier)
    put the int8 bundle optimize had just written outside verify's allowance (2.31e-02 > 1.84e-02)."""
    sets = ["model.n_layers=1", "model.d_model=64", "model.vocab_size=100", "model.max_seq_len=32"]
    argv = ["export", str(ROOT / "specs" / "sst2-finetune.yaml"), "--out", str(tmp_path / "sst2")]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    optimize_bundle(tmp_path / "sst2", tmp_path / "int8", Plan(quantize="int8"), None)
    reports = verify_bundle(tmp_path / "int8")
    assert all(report.passed for report in reports.values()), {n: r.to_dict() for n, r in reports.items()}
