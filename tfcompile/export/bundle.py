"""Bundles: a folder that another application serves with onnxruntime alone.

    model.onnx          the full forward (dynamic batch and sequence axes): a decoder's next-token
                        logits, or a classifier's label logits
    decoder_step.onnx   decoders only, the incremental form: new tokens + per-layer past K/V ->
                        logits + present K/V
    tokenizer.json      text models from a run: the run's tokenizer
    preprocessing.json  image models from a run: image size, channels, normalisation statistics
    spec.yaml        the resolved spec
    manifest.json    format version, graphs with named inputs/outputs, versions, file hashes, parity

Which graphs a bundle holds, and what its manifest says about the model, is the task's to say
(tfcompile.tasks). The bundle is assembled in a temporary folder and renamed into place only when
parity holds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from tfcompile import __version__
from tfcompile.errors import UserError
from tfcompile.files import PREPROCESSING_FILE, TOKENIZER_FILE
from tfcompile.graphs.export import Graph
from tfcompile.graphs.parity import ParityReport
from tfcompile.runtime.bundle import FORMAT_VERSION, MANIFEST, read_manifest, sha256_file
from tfcompile.runtime.ort import ort
from tfcompile.spec import Spec, dump_spec, parse_spec
from tfcompile.tasks.task import build_model, task_of
from tfcompile.train.runs import load_trained_model

# A graph's file is its name: model.onnx, encoder.onnx, ...; "step" keeps its descriptive name.
GRAPH_FILES = {"step": "decoder_step.onnx"}


def graph_file(name: str) -> str:
    return GRAPH_FILES.get(name, f"{name}.onnx")


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
        spec = spec.replace({"export": {"precision": precision}})
    graphs = task_of(spec).graphs
    exported = copy.deepcopy(model).half() if spec.export.precision == "fp16" else model
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise ExportError(f"{out} exists and is not a bundle: choose an empty or new folder with --out")
    opset = opset or spec.export.opset
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        protos = {name: g.export(exported, tmp / graph_file(name), opset) for name, g in graphs.items()}
        reports = {name: _check(g, model, tmp / graph_file(name), spec) for name, g in graphs.items()}
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
        for name, g in task_of(spec).graphs.items()
    }


def _check(graph: Graph, model: nn.Module, path: Path, spec: Spec, seed: int = 0) -> ParityReport:
    """The graph's parity against the fp32 model; fp16 graphs are bounded relative to the outputs'
    scale, since half precision keeps about three significant digits whatever the magnitude."""
    report = graph.check(model, path, spec.export.parity_tolerance, seed=seed)
    return dataclasses.replace(report, relative=spec.export.precision == "fp16")


def _check_exportable(spec: Spec) -> None:
    task = task_of(spec)
    if not task.graphs:
        raise ExportError(f"a {spec.task.type} model is not exported: {task.not_served}")
    missing = spec.sizes_from_data()
    if missing:
        raise ExportError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: export a trained "
            f"run, which took {'it' if len(missing) == 1 else 'them'} from the data, or set "
            f"{'it' if len(missing) == 1 else 'them'} in the spec"
        )


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
    } | task_of(spec).manifest(spec)
    return {
        "format_version": FORMAT_VERSION,
        "task": spec.task.type,
        "precision": spec.export.precision,
        "model": sizes,
        "graphs": {
            name: {"file": graph_file(name), "inputs": io(p.graph.input), "outputs": io(p.graph.output)}
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
