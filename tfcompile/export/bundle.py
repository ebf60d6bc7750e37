"""Bundles: a folder that another application serves with onnxruntime alone.

    model.onnx          the full forward (dynamic batch and sequence axes): a decoder's next-token
                        logits, or a classifier's label logits
    decoder_step.onnx   decoders only, the incremental form: new tokens + per-layer past K/V ->
                        logits + present K/V
    tokenizer.json      text models from a run: the run's tokenizer
    preprocessing.json  image models from a run: image size, channels, normalisation statistics
    spec.yaml        the resolved spec
    manifest.json    format version, graphs with named inputs/outputs, versions, file hashes, parity

The bundle is assembled in a temporary folder and renamed into place only when parity holds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from tfcompile import __version__
from tfcompile.data.tokenizer import BOS, EOS, SEQ2SEQ_TOKENS
from tfcompile.errors import UserError
from tfcompile.export.graph import (
    export_classifier,
    export_decoder,
    export_decoder_step,
    export_image_classifier,
    export_seq2seq_encoder,
    export_seq2seq_step,
)
from tfcompile.export.parity import (
    ParityReport,
    check_classifier_parity,
    check_decoder_parity,
    check_image_classifier_parity,
    check_seq2seq_encoder_parity,
    check_seq2seq_step_parity,
    check_step_parity,
)
from tfcompile.files import PREPROCESSING_FILE, TOKENIZER_FILE
from tfcompile.models import build_model
from tfcompile.runtime.bundle import FORMAT_VERSION, MANIFEST, read_manifest, sha256_file
from tfcompile.runtime.ort import ort
from tfcompile.spec import Spec, dump_spec, parse_spec
from tfcompile.train import load_trained_model

GRAPH_FILES = {"model": "model.onnx", "encoder": "encoder.onnx", "step": "decoder_step.onnx"}


@dataclass(frozen=True)
class Graph:
    export: Callable[[Any, Path, int], onnx.ModelProto]
    check: Callable[..., ParityReport]  # (model, path, tolerance, seed=) -> report


# The graphs a bundle holds, by task. A masked-LM run is pretraining: fine-tune it to serve it.
# A translator's encoder runs once per source; its step graph once per target token.
GRAPHS: dict[str, dict[str, Graph]] = {
    "causal_lm": {
        "model": Graph(export_decoder, check_decoder_parity),
        "step": Graph(export_decoder_step, check_step_parity),
    },
    "classification": {"model": Graph(export_classifier, check_classifier_parity)},
    "seq2seq": {
        "encoder": Graph(export_seq2seq_encoder, check_seq2seq_encoder_parity),
        "step": Graph(export_seq2seq_step, check_seq2seq_step_parity),
    },
    "image_classification": {"model": Graph(export_image_classifier, check_image_classifier_parity)},
}


class ExportError(UserError, RuntimeError):
    """An export that cannot be done or whose parity check fails."""


@dataclass(frozen=True)
class Source:
    """Where the weights come from: a run's checkpoint, or a spec initialised with a seed."""

    run: Path | None = None
    checkpoint: str = "last"
    seed: int = 0

    def load(self, spec: Spec | None = None) -> tuple[Spec, nn.Module]:
        if self.run is not None:
            spec, model = load_trained_model(self.run, self.checkpoint)
        else:
            assert spec is not None
            torch.manual_seed(self.seed)
            model = build_model(spec).eval()
        return spec, model

    def to_dict(self) -> dict[str, Any]:
        if self.run is not None:
            return {"run": str(self.run.resolve()), "checkpoint": self.checkpoint}
        return {"seed": self.seed}


def export_bundle(
    spec: Spec | None,
    source: Source,
    out: Path,
    opset: int | None = None,
    precision: str | None = None,
) -> dict[str, ParityReport]:
    """Export, check parity of every graph, and write the bundle; returns the parity reports.
    ``precision`` (fp32, fp16) overrides the spec's export.precision. An fp16 graph is checked
    against the fp32 PyTorch model, with its outputs read as float32."""
    if spec is not None:
        _check_exportable(spec)
    spec, model = source.load(spec)
    _check_exportable(spec)
    if precision is not None:
        spec.export.precision = precision  # type: ignore[assignment]
    graphs = GRAPHS[spec.task.type]
    exported = copy.deepcopy(model).half() if spec.export.precision == "fp16" else model
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise ExportError(f"{out} exists and is not a bundle: choose an empty or new folder with --out")
    opset = opset or spec.export.opset
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        protos = {name: g.export(exported, tmp / GRAPH_FILES[name], opset) for name, g in graphs.items()}
        reports = {name: _check(g, model, tmp / GRAPH_FILES[name], spec) for name, g in graphs.items()}
        for name, report in reports.items():
            if not report.passed:
                measure = "relative to the outputs' scale " if report.relative else ""
                raise ExportError(
                    f"onnxruntime and PyTorch disagree by {report.measured:.3g} {measure}on the {name} "
                    f"graph's logits, more than export.tolerance {report.tolerance:g}: "
                    f"{json.dumps(report.to_dict()['cases'])}"
                )
        for name in (TOKENIZER_FILE, PREPROCESSING_FILE):
            if source.run is not None and (source.run / name).exists():
                shutil.copyfile(source.run / name, tmp / name)
        (tmp / "spec.yaml").write_text(dump_spec(spec))
        manifest = _manifest(spec, protos, opset, source, reports, tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return reports


def verify_bundle(bundle: Path, run: Path | None = None) -> dict[str, ParityReport]:
    """Rerun the parity check from the bundle and the weights it was exported from."""
    manifest = read_manifest(bundle)
    recorded = manifest["source"]
    spec = parse_spec((bundle / "spec.yaml").read_text(), source=str(bundle / "spec.yaml"))
    if run is not None or "run" in recorded:
        run_dir = run or Path(recorded["run"])
        if not run_dir.exists():
            raise ExportError(f"the run {run_dir} that {bundle} came from is gone; pass --run RUN")
        source = Source(run=run_dir, checkpoint=recorded.get("checkpoint", "last"))
    else:
        source = Source(seed=recorded["seed"])
    _, model = source.load(spec)
    files = manifest["graphs"]
    return {
        name: _check(g, model, bundle / files[name]["file"], spec, seed=1)
        for name, g in GRAPHS[spec.task.type].items()
    }


def _check(graph: Graph, model: nn.Module, path: Path, spec: Spec, seed: int = 0) -> ParityReport:
    """The graph's parity against the fp32 model; fp16 graphs are bounded relative to the outputs'
    scale, since half precision keeps about three significant digits whatever the magnitude."""
    report = graph.check(model, path, spec.export.parity_tolerance, seed=seed)
    return dataclasses.replace(report, relative=spec.export.precision == "fp16")


def _check_exportable(spec: Spec) -> None:
    if spec.task.type not in GRAPHS:
        raise ExportError(
            f"a {spec.task.type} model is pretraining, not something to serve: fine-tune it "
            f"(train.init_from) into one of {', '.join(GRAPHS)}, and export that run"
        )
    if spec.model.vocab_size is None and spec.model.family != "vit":
        raise ExportError("model.vocab_size is not set: export a trained run, or set it in the spec")
    if spec.task.type in ("classification", "image_classification") and not spec.task.labels:
        raise ExportError("task.labels is not set: export a trained run, or set it in the spec")


def _manifest(
    spec: Spec,
    protos: dict[str, onnx.ModelProto],
    opset: int,
    source: Source,
    reports: dict[str, ParityReport],
    folder: Path,
) -> dict[str, Any]:
    def io(values: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": v.name,
                "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
            }
            for v in values
        ]

    sizes: dict[str, Any] = {
        "family": spec.model.family,
        "vocab_size": spec.model.vocab_size,
        "max_seq_len": spec.model.max_seq_len,
    }
    task, m = spec.task, spec.model
    if task.type == "classification":
        sizes |= {"labels": task.labels}
    elif task.type == "image_classification":
        assert m.family == "vit"
        sizes |= {"labels": task.labels, "image_size": m.image_size, "channels": m.channels}
    else:  # what the runtime needs to build an empty KV cache
        layers = m.n_decoder_layers if m.family == "encoder_decoder" else m.n_layers
        sizes |= {"n_layers": layers, "n_kv_heads": m.n_kv_heads, "head_dim": m.head_dim}
    if task.type == "seq2seq":
        decode_len = task.max_decode_len or spec.model.max_seq_len - 1
        sizes |= {"beam": task.beam, "length_penalty": task.length_penalty, "max_decode_len": decode_len}
        sizes |= {"bos_id": SEQ2SEQ_TOKENS.index(BOS), "eos_id": SEQ2SEQ_TOKENS.index(EOS)}
    return {
        "format_version": FORMAT_VERSION,
        "task": spec.task.type,
        "precision": spec.export.precision,
        "model": sizes,
        "graphs": {
            name: {"file": GRAPH_FILES[name], "inputs": io(p.graph.input), "outputs": io(p.graph.output)}
            for name, p in protos.items()
        },
        "opset": opset,
        "versions": {
            "tfcompile": __version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxscript": version("onnxscript"),
            "onnxruntime": ort.__version__,
        },
        "source": source.to_dict(),
        "parity": {name: report.to_dict() for name, report in reports.items()},
        "files": {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.name != MANIFEST},
    }
