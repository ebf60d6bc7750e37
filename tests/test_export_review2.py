"""Export review: parity fails on what a client would meet (a NaN at one step, left padding), and
the bundle's manifest is what its graphs are."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from helpers import tiny_model
from onnx import numpy_helper

from tfcompile.export import (
    ExportError,
    Graph,
    Source,
    check_decoder_parity,
    check_step_parity,
    export_bundle,
    export_decoder,
    export_decoder_step,
)
from tfcompile.models import DecoderLM
from tfcompile.spec import parse_spec
from tfcompile.tasks import build_model
from tfcompile.tasks.causal_lm import LanguageModelling

SMALL = "model: {vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8}\n"


Export = Callable[[Any, Path, int], onnx.ModelProto]


def _poisoned(export: Export) -> Export:
    """``export``, then its largest weight set to NaN in the file: a graph whose every output is NaN."""

    def write(model: DecoderLM, path: Path, opset: int) -> onnx.ModelProto:
        proto = export(model, path, opset)
        weight = max(proto.graph.initializer, key=lambda t: np.prod(t.dims))
        weight.CopyFrom(
            numpy_helper.from_array(np.full_like(numpy_helper.to_array(weight), np.nan), weight.name)
        )
        onnx.save(proto, str(path))
        return proto

    return write


def test_a_step_graph_giving_nan_fails_export_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step check kept a running max(), which skips NaN: a decode_step graph giving NaN at
    every step passed with a difference of 0 and was written."""
    step = LanguageModelling.graphs["step"]  # the step graph alone: the forward check keeps NaN
    monkeypatch.setattr(
        LanguageModelling, "graphs", {"step": Graph(step.role, _poisoned(step.export), step.check)}
    )
    with pytest.raises(ExportError, match=r"disagree on the step graph's outputs: one gives a NaN"):
        export_bundle(parse_spec(SMALL), Source(seed=0), tmp_path / "bundle")
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor its staging folder


class _IgnoresFirstColumn(DecoderLM):
    """A model whose mask's first column is always read as a real token: wrong only for a row that
    starts with padding, as generation's left-padded prompts do."""

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: list | None = None
    ) -> torch.Tensor:
        mask = torch.cat([torch.ones_like(attention_mask[:, :1]), attention_mask[:, 1:]], dim=1)
        return super().forward(input_ids, mask, cache=cache)


@pytest.mark.slow
def test_parity_reads_left_padded_rows_in_both_decoder_graphs(tmp_path: Path) -> None:
    """Parity padded only the end of a row, so a graph that misread a left-padded row (what
    generation sends the step graph for a batch of prompts) passed."""
    spec = tiny_model()
    model = DecoderLM(spec).eval()
    wrong = _IgnoresFirstColumn(spec).eval()
    wrong.load_state_dict(model.state_dict())
    export_decoder(wrong, tmp_path / "model.onnx", opset=18)
    export_decoder_step(wrong, tmp_path / "step.onnx", opset=18)
    forward = check_decoder_parity(model, tmp_path / "model.onnx", tolerance=1e-4)
    step = check_step_parity(model, tmp_path / "step.onnx", tolerance=1e-4)
    assert not forward.passed and not step.passed
    assert [c.padded for c in forward.cases if c.max_abs_diff > 1e-4] == [True, True]
    assert [c.padded for c in step.cases if c.max_abs_diff > 1e-4] == [True, True]


def _assert_manifest_is_the_graphs(bundle: Path) -> None:
    """Each graph's inputs and outputs in the manifest are the .onnx file's (names, element types,
    symbolic or fixed dims, in order), its opset is the file's, every file is listed with its hash,
    and a meaning that names a float type names the tensor's own."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert sorted(p.name for p in bundle.iterdir()) == sorted([*manifest["files"], "manifest.json"])
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest, name
    for entry in manifest["graphs"].values():
        proto = onnx.load(str(bundle / entry["file"]))
        assert {o.domain: o.version for o in proto.opset_import}[""] == manifest["opset"]
        for recorded, values in [
            (entry["inputs"], proto.graph.input),
            (entry["outputs"], proto.graph.output),
        ]:
            actual = [
                (
                    v.name,
                    onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                    [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                )
                for v in values
            ]
            assert [(t["name"], t["dtype"], t["shape"]) for t in recorded] == actual
            assert all(d for _, _, shape in actual for d in shape), "an axis neither named nor sized"
            for t in recorded:
                named = {"float16", "float32"} & set(t["meaning"].replace(",", " ").split())
                assert named <= {t["dtype"]}, (t["name"], t["meaning"])


def test_an_fp16_image_bundle_says_what_its_graph_takes(tmp_path: Path) -> None:
    """An fp16 ViT's pixel_values are float16, while their meaning said float32."""
    spec = parse_spec(
        "model: {family: vit, image_size: 8, channels: 1, patch_size: 4, d_model: 16, n_layers: 1, "
        "n_heads: 2}\ntask: {type: image_classification, labels: [a, b]}\n"
        "export: {precision: fp16, opset: 17}\n"
    )
    export_bundle(spec, Source(seed=0), tmp_path / "bundle")
    _assert_manifest_is_the_graphs(tmp_path / "bundle")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["char_bundle", "classifier_bundle", "translator_bundle", "image_bundle"])
def test_every_bundle_kind_says_what_its_graphs_are(kind: str, request: pytest.FixtureRequest) -> None:
    _assert_manifest_is_the_graphs(request.getfixturevalue(kind))
    _assert_names_no_file_of_the_exporting_machine(request.getfixturevalue(kind))


@pytest.mark.parametrize("kind", ["char_bundle", "classifier_bundle"])
def test_a_graph_names_no_file_of_the_exporting_machine(kind: str, request: pytest.FixtureRequest) -> None:
    _assert_names_no_file_of_the_exporting_machine(request.getfixturevalue(kind))


def _assert_names_no_file_of_the_exporting_machine(bundle: Path) -> None:
    """The exporter records each node's Python stack (the files of the package and of its
    virtualenv): a bundle keeps each node's module scope, and none of those paths."""
    import tfcompile
    from tfcompile.onnx_nodes import graph_nodes

    package = str(Path(tfcompile.__file__).parent.parent)
    for graph in json.loads((bundle / "manifest.json").read_text())["graphs"].values():
        nodes = graph_nodes(onnx.load(str(bundle / graph["file"])).graph)
        props = [p for node in nodes for p in node.metadata_props]
        assert any(p.key == "pkg.torch.onnx.class_hierarchy" for p in props)
        leaks = [p.key for p in props if package in p.value or "site-packages" in p.value]
        assert not leaks, sorted(set(leaks))


def test_a_nan_or_infinity_on_one_side_only_is_an_infinite_difference() -> None:
    from tfcompile.agreement import largest_difference

    torch_side = np.array([1.0, np.nan, np.inf, 2.0], dtype=np.float32)
    assert largest_difference(torch_side.copy(), torch_side) == 0.0  # the same NaN and infinity agree
    for broken in ([np.nan, np.nan, np.inf, 2.0], [1.0, np.nan, -np.inf, 2.0], [1.0, 0.0, np.inf, 2.0]):
        assert largest_difference(np.array(broken, dtype=np.float32), torch_side) == np.inf


def test_verify_reads_the_checkpoint_exported_even_after_the_run_trained_on(
    char_bundle: Path, tmp_path: Path
) -> None:
    """The manifest said only 'last': a run resumed after its export moved last on, and verify
    --run reported the export as disagreeing with PyTorch."""
    import shutil

    from tfcompile.export import verify_bundle
    from tfcompile.spec import load_spec
    from tfcompile.train import Trainer
    from tfcompile.train.checkpoint import CheckpointError, checkpoint_dir

    source = json.loads((char_bundle / "manifest.json").read_text())["source"]
    assert source["checkpoint"] == "last" and source["checkpoint_folder"] == "step-000001"
    run = tmp_path / "run"
    shutil.copytree(char_bundle.parent / "run", run)
    spec = load_spec(run / "spec.yaml", ["train.steps=2", f"train.runs_dir={tmp_path}"])
    Trainer(spec, run, resume=True, show_progress=False).train()  # last is step-000002 now
    assert all(report.passed for report in verify_bundle(char_bundle, run).values())
    shutil.rmtree(checkpoint_dir(run) / "step-000001")
    with pytest.raises(CheckpointError, match=r"no longer holds its checkpoint step-000001"):
        verify_bundle(char_bundle, run)


def test_a_model_whose_own_outputs_are_nan_is_not_exported(tmp_path: Path) -> None:
    """The same NaN on both sides agrees (add162e): a NaN checkpoint exported with difference 0."""
    import tfcompile.export.bundle as bundle

    spec = parse_spec(SMALL)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))

    class NaNSource(Source):
        def load(self, spec: Any = None) -> Any:
            return self, spec, model

    with pytest.raises(ExportError, match=r"PyTorch's own are not finite"):
        bundle.export_bundle(spec, NaNSource(seed=0), tmp_path / "bundle")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("processor", "added"),
    [
        ("roberta", ["bos", "eos"]),  # RobertaProcessing: <s> A </s>, <s> A </s></s> B </s>
        ("byte-level then template", ["bos"]),  # Llama 3's Sequence: <|begin_of_text|> A
        ("template", ["eos"]),
        ("template adding eos to pairs alone", ["bos"]),
        ("none", []),
    ],
)
def test_the_roles_a_tokenizer_adds_are_read_from_what_it_adds(processor: str, added: list[str]) -> None:
    """Read from a bare template's special_tokens alone, RoBERTa's and Llama 3's bundles said their
    tokenizers add nothing: a client following the manifest (a Triton handoff's) added <s> again."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from tfcompile.export.bundle import tokenizer_info
    from tfcompile.spec.schema import SpecialTokens

    made = {
        "roberta": processors.RobertaProcessing(("</s>", 1), ("<s>", 0)),
        "byte-level then template": processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
                ),
            ]
        ),
        "template": processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)]),
        "template adding eos to pairs alone": processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A </s> $B", special_tokens=[("<s>", 0), ("</s>", 1)]
        ),
        "none": None,
    }[processor]
    tokenizer = Tokenizer(
        models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2, "<pad>": 3, "a": 4}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if made is not None:
        tokenizer.post_processor = made
    tokenizer.enable_padding(pad_id=3, pad_token="<pad>", length=4)  # padding adds no role
    tokens = SpecialTokens(bos="<s>", eos="</s>", unk="<unk>", pad="<pad>")
    assert tokenizer_info(tokenizer, tokens).added_by_tokenizer == added


@pytest.mark.parametrize(
    ("truncation", "message"),
    [
        ({"max_length": 0, "stride": 0}, "its truncation's max_length 0 is not one the manifest can hold"),
        ({"max_length": 4, "stride": 4}, "its truncation's stride 4 is not below the 4 tokens"),
    ],
)
def test_a_runs_tokenizer_truncation_no_bundle_takes_is_refused_at_export(
    char_bundle: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    truncation: dict[str, int],
    message: str,
) -> None:
    """A max_length of 0 was a pydantic traceback; a stride past it was exported, and refused at load."""
    import shutil

    from tfcompile.cli import main

    run = tmp_path / "run"
    shutil.copytree(char_bundle.parent / "run", run)
    saved = json.loads((run / "tokenizer.json").read_text())
    saved["truncation"] = {"direction": "Right", "strategy": "LongestFirst", **truncation}
    (run / "tokenizer.json").write_text(json.dumps(saved))
    assert main(["export", str(run), "--out", str(tmp_path / "bundle")]) == 1
    err = capsys.readouterr().err
    assert f"{run / 'tokenizer.json'}: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "bundle").exists()
