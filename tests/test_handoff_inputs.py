"""What tfcompile optimize, export-triton and export-genai take from the user and from a bundle:
impossible plans refused before any work, every onnxruntime failure a one-line OptimizeError, a
bundle checked as the runtime's loader checks it before it is handed on, no --out inside the
bundle, settings bounded by what the target's config holds, and a gate run that must be the
bundle's own."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from helpers import ROOT, TINY

from tfcompile.errors import BundleError, ExportError
from tfcompile.export import Source, export_bundle
from tfcompile.handoffs.genai import export_genai
from tfcompile.handoffs.triton import export_triton, model_config
from tfcompile.manifest import Graph
from tfcompile.optimize import GateData, OptimizeError, Plan, optimize_bundle, passes
from tfcompile.spec import load_spec

Command = Callable[[Path, Path], Any]
COMMANDS: dict[str, Command] = {
    "optimize": lambda bundle, out: optimize_bundle(bundle, out, Plan(fuse=True), None),
    "export-triton": export_triton,
    # An end token of the vocabulary: genai's export then runs no graph of its own.
    "export-genai": lambda bundle, out: export_genai(bundle, out, end_token="$"),
}


def run_of(bundle: Path) -> Path:
    return bundle.parent / "run"  # the conftest fixtures keep ROOT/run beside ROOT/bundle


def copy_bundle(bundle: Path, to: Path) -> Path:
    shutil.copytree(bundle, to)
    return to


def edit_manifest(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def replace_file(bundle: Path, name: str, data: bytes) -> None:
    """A listed file replaced, and its sha256 in the manifest updated to match."""
    (bundle / name).write_bytes(data)
    edit_manifest(bundle, lambda m: m["files"].update({name: hashlib.sha256(data).hexdigest()}))


def forbid(monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """Make ``target`` fail the test if it is called: the refusal must come before that work."""

    def called(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{target} ran before the refusal")

    monkeypatch.setattr(target, called)


@pytest.fixture(scope="module")
def int8_bundle(char_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "bundle"
    optimize_bundle(char_bundle, out, Plan(quantize="int8"), None)
    return out


# ------------------------------------------------------------------------ 1: plans and onnxruntime


def test_fp16_on_a_quantized_bundle_is_refused_naming_its_steps(
    int8_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid(monkeypatch, "tfcompile.optimize.to_fp16")
    with pytest.raises(OptimizeError, match=r"quantized \(its steps: export fp32, quantize int8\)"):
        optimize_bundle(int8_bundle, tmp_path / "out", Plan(precision="fp16"), None)
    assert not (tmp_path / "out").exists()


def test_a_fused_graph_onnxruntime_cannot_load_is_not_chosen(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unloadable(model: onnx.ModelProto) -> onnx.ModelProto:
        """Every contrib operator a fuser could want, in a graph that does not type-check."""
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        node = onnx.helper.make_node("FastGelu", [broken.graph.input[0].name], ["x"], domain="com.microsoft")
        broken.graph.node.extend([node] * 50)
        return broken

    fusers = {"broken": unloadable, **passes.FUSERS}
    monkeypatch.setattr(passes, "FUSERS", fusers)
    done = optimize_bundle(char_bundle, tmp_path / "fused", Plan(fuse=True), None)
    assert "broken" not in done.steps[0].tool
    monkeypatch.setattr(passes, "FUSERS", {"broken": unloadable})
    with pytest.raises(OptimizeError, match=r"no fusion applies .*onnxruntime could not fuse with broken: "):
        optimize_bundle(char_bundle, tmp_path / "none", Plan(fuse=True), None)


@pytest.mark.parametrize(
    ("target", "plan", "needle"),
    [
        ("onnxruntime.quantization.quantize_dynamic", Plan(quantize="int8"), "quantize the graph to int8"),
        (
            "onnxruntime.transformers.float16.convert_float_to_float16",
            Plan(precision="fp16"),
            "convert the graph to fp16",
        ),
    ],
)
def test_onnxruntime_failing_in_a_pass_is_an_optimize_error(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, plan: Plan, needle: str
) -> None:
    def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : first line\nsecond line")

    monkeypatch.setattr(target, fails)
    with pytest.raises(OptimizeError, match=f"^onnxruntime could not {needle}: .*first line$"):
        optimize_bundle(char_bundle, tmp_path / "out", plan, None)


def test_a_transformed_graph_onnxruntime_cannot_load_is_an_optimize_error(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_typed(model: onnx.ModelProto) -> onnx.ModelProto:
        """fp16 outputs declared over a graph that still computes float32."""
        typed = onnx.ModelProto()
        typed.CopyFrom(model)
        for output in typed.graph.output:
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
        return typed

    monkeypatch.setattr("tfcompile.optimize.to_fp16", half_typed)
    with pytest.raises(
        OptimizeError, match=r"^onnxruntime could not run the fp16 model graph beside its source: "
    ):
        optimize_bundle(char_bundle, tmp_path / "out", Plan(precision="fp16"), None)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_fp16_llama_bundle_fuses_with_parity(tmp_path: Path) -> None:
    """Its RMSNorm multiplied an fp16 input by a float32 scale, which onnxruntime's fused graph
    refused (an OptimizeError after the attempt); the norm scales in its input's type now."""
    spec = load_spec(ROOT / "specs" / "shakespeare-char-llama.yaml", [*TINY, "model.max_seq_len=16"])
    export_bundle(spec, Source(seed=0), tmp_path / "llama", precision="fp16")
    done = optimize_bundle(tmp_path / "llama", tmp_path / "fused", Plan(fuse=True), None)
    assert [step.kind for step in done.steps] == ["fuse"] and all(v < 1e-2 for v in done.parity.values())


# ------------------------------------------------------------------------ 2: int4 before any work


@pytest.mark.parametrize("gated", [False, True])
def test_int4_on_a_classifier_is_refused_before_any_work(
    classifier_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gated: bool
) -> None:
    forbid(monkeypatch, "tfcompile.optimize.quantize_int4")
    gate = GateData(run_of(classifier_bundle)) if gated else None
    with pytest.raises(
        OptimizeError, match="int4 quantization is for decoders; classification bundles take int8"
    ):
        optimize_bundle(classifier_bundle, tmp_path / "out", Plan(quantize="int4"), gate)


# ------------------------------------------------------------------------ 3: the loader's checks


def garbage_graph(bundle: Path) -> None:
    replace_file(bundle, "model.onnx", b"\x08\x07 not a graph")


def renamed_input(bundle: Path) -> None:
    model = onnx.load(str(bundle / "decoder_step.onnx"))
    model.graph.input[1].name = "mask"
    for node in model.graph.node:
        node.input[:] = ["mask" if name == "attention_mask" else name for name in node.input]
    replace_file(bundle, "decoder_step.onnx", model.SerializeToString())


def half_logits(manifest: dict[str, Any]) -> None:
    for graph in manifest["graphs"].values():
        graph["outputs"][0]["dtype"] = "float16"


def kv_heads(manifest: dict[str, Any]) -> None:
    for tensor in manifest["graphs"]["step"]["inputs"][2:]:
        batch, heads, past, head_dim = tensor["shape"]
        tensor["shape"] = [batch, heads * 2, past, head_dim // 2]


TAMPERINGS: dict[str, tuple[Callable[[Path], None], str]] = {
    "garbage graph": (garbage_graph, "model.onnx is not a graph onnxruntime can run"),
    "renamed input": (renamed_input, r"has inputs \['input_ids', 'mask', .*but the manifest says"),
    "float16 logits": (
        lambda b: edit_manifest(b, half_logits),
        "logits is tensor.float. .* manifest says float16",
    ),
    "kv heads": (
        lambda b: edit_manifest(b, kv_heads),
        "past_key_0 is tensor.float. of shape .* manifest says",
    ),
    "tokenizer": (
        lambda b: replace_file(b, "tokenizer.json", b'{"model": {}}'),
        "tokenizer.json is not a tokenizer the tokenizers library reads",
    ),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_a_bundle_is_checked_as_the_loader_checks_it_before_it_is_handed_on(
    char_bundle: Path, tmp_path: Path, tampering: str, command: str
) -> None:
    bundle = copy_bundle(char_bundle, tmp_path / "bundle")
    tamper, needle = TAMPERINGS[tampering]
    tamper(bundle)
    with pytest.raises(BundleError, match=needle):
        COMMANDS[command](bundle, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ 4: --out inside the bundle


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_writes_inside_its_bundle(char_bundle: Path, tmp_path: Path, command: str) -> None:
    bundle = copy_bundle(char_bundle, tmp_path / "bundle")
    (tmp_path / "link").symlink_to(bundle)
    before = sorted(p.name for p in bundle.iterdir())
    for out in (bundle / "out", tmp_path / "link" / "out"):
        with pytest.raises(ExportError, match="is inside the bundle"):
            COMMANDS[command](bundle, out)
    with pytest.raises(ExportError, match="is the bundle itself"):
        COMMANDS[command](bundle, tmp_path / "link")
    assert sorted(p.name for p in bundle.iterdir()) == before


# ------------------------------------------------------------------------ 5: config bounds


@pytest.mark.parametrize(
    ("setting", "value", "needle"),
    [
        ("max_queue_delay_us", 2**64, "from 0 to 18,446,744,073,709,551,615 .*uint64"),
        ("max_batch_size", 2**31, "from 0 to 2,147,483,647 .*int32"),
        ("instances", 2**31, "from 1 to 2,147,483,647 .*int32"),
    ],
)
def test_triton_settings_are_bounded_by_config_pbtxt(
    char_bundle: Path, tmp_path: Path, setting: str, value: int, needle: str
) -> None:
    given = {"max_batch_size": 0, "instances": 1, "max_queue_delay_us": 0, setting: value}
    settings = (given["max_batch_size"], given["instances"], given["max_queue_delay_us"])
    with pytest.raises(ExportError, match=f"{setting} must be a whole number {needle}"):
        export_triton(char_bundle, tmp_path / "repo", *settings)
    assert not (tmp_path / "repo").exists()
    graph = Graph(file="model.onnx", role="forward", inputs=[], outputs=[])
    with pytest.raises(ExportError, match=needle):
        model_config("m", graph, *settings)


def test_a_manifest_size_past_what_a_config_holds_is_refused(char_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(char_bundle, tmp_path / "bundle")
    edit_manifest(  # the loader holds the two equal
        bundle, lambda m: (m["generation"].update(context_length=2**31), m["model"].update(max_seq_len=2**31))
    )
    with pytest.raises(
        BundleError, match=r"model\.context_length would be 2,147,483,648, past the int32 range"
    ):
        export_genai(bundle, tmp_path / "genai")
    sequence = 2**63  # an axis the graph leaves open, fixed past int64 by the manifest: the loader's bound
    edit_manifest(bundle, lambda m: m["graphs"]["model"]["inputs"][0].update(shape=["batch", sequence]))
    with pytest.raises(
        BundleError, match=r"input_ids's fixed sizes .* more than the 67,108,864 a bundle's input"
    ):
        export_triton(bundle, tmp_path / "repo")


# ------------------------------------------------------------------------ 6: the gate's run


def test_the_gate_refuses_a_run_the_bundle_did_not_come_from(
    char_bundle: Path, classifier_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid(monkeypatch, "tfcompile.optimize.fuse")
    own = run_of(char_bundle)
    other = tmp_path / "run"
    other.mkdir()
    shutil.copy(own / "spec.yaml", other / "spec.yaml")
    tokenizer = json.loads((own / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.__getitem__)[:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))

    def refused(run: Path, needle: str) -> None:
        with pytest.raises(
            OptimizeError, match=f"^{run} is not the run {char_bundle} was exported from .*{needle}"
        ):
            optimize_bundle(char_bundle, tmp_path / "out", Plan(fuse=True), GateData(run, 4))

    refused(other, r"the run's tokenizer.json \(sha256 \w+\.\.\.\) is not the bundle's \(sha256 \w+\.\.\.\)")
    (other / "spec.yaml").write_text((own / "spec.yaml").read_text().replace("d_model: 16", "d_model: 32"))
    refused(other, "the model section of its spec is not the bundle's spec.yaml's")
    refused(run_of(classifier_bundle), "it is a classification run, and the bundle a causal_lm one")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_out_that_is_a_link_is_refused_as_one(char_bundle: Path, tmp_path: Path, command: str) -> None:
    """A link to an empty folder elsewhere was refused as "exists and is not a folder"."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ExportError, match=r"link is a symbolic link: choose an --out that is not one"):
        COMMANDS[command](char_bundle, tmp_path / "link")
    assert not any((tmp_path / "elsewhere").iterdir())
