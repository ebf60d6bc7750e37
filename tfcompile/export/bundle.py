"""Bundles: a folder that another application serves with onnxruntime alone.

    model.onnx          the full forward (dynamic batch and sequence axes)
    decoder_step.onnx   the incremental form: new tokens + per-layer past K/V -> logits + present K/V
    tokenizer.json   the run's tokenizer, when the model came from a run
    spec.yaml        the resolved spec
    manifest.json    format version, graphs with named inputs/outputs, versions, file hashes, parity

The bundle is assembled in a temporary folder and renamed into place only when parity holds.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
import torch

from tfcompile import __version__
from tfcompile.errors import UserError
from tfcompile.export.graph import DECODER_INPUTS, DECODER_OUTPUTS, export_decoder, export_decoder_step
from tfcompile.export.parity import ParityReport, check_decoder_parity, check_step_parity
from tfcompile.models import DecoderLM, build_model
from tfcompile.runtime.bundle import FORMAT_VERSION, MANIFEST, read_manifest, sha256_file
from tfcompile.runtime.ort import ort
from tfcompile.spec import Spec, dump_spec, parse_spec
from tfcompile.train import load_trained_model

GRAPH_FILES = {"model": "model.onnx", "step": "decoder_step.onnx"}


class ExportError(UserError, RuntimeError):
    """An export that cannot be done or whose parity check fails."""


@dataclass(frozen=True)
class Source:
    """Where the weights come from: a run's checkpoint, or a spec initialised with a seed."""

    run: Path | None = None
    checkpoint: str = "last"
    seed: int = 0

    def load(self, spec: Spec | None = None) -> tuple[Spec, DecoderLM]:
        if self.run is not None:
            spec, model = load_trained_model(self.run, self.checkpoint)
        else:
            assert spec is not None
            torch.manual_seed(self.seed)
            model = build_model(spec).eval()
        assert isinstance(model, DecoderLM)
        return spec, model

    def to_dict(self) -> dict[str, Any]:
        if self.run is not None:
            return {"run": str(self.run.resolve()), "checkpoint": self.checkpoint}
        return {"seed": self.seed}


def export_bundle(
    spec: Spec | None, source: Source, out: Path, opset: int | None = None
) -> dict[str, ParityReport]:
    """Export, check parity of every graph, and write the bundle; returns the parity reports."""
    spec, model = source.load(spec)
    if spec.model.vocab_size is None:
        raise ExportError("model.vocab_size is not set: export a trained run, or set it in the spec")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise ExportError(f"{out} exists and is not a bundle: choose an empty or new folder with --out")
    opset = opset or spec.export.opset
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        protos = {
            "model": export_decoder(model, tmp / GRAPH_FILES["model"], opset),
            "step": export_decoder_step(model, tmp / GRAPH_FILES["step"], opset),
        }
        reports = {
            "model": check_decoder_parity(model, tmp / GRAPH_FILES["model"], spec.export.tolerance),
            "step": check_step_parity(model, tmp / GRAPH_FILES["step"], spec.export.tolerance),
        }
        for name, report in reports.items():
            if not report.passed:
                raise ExportError(
                    f"onnxruntime and PyTorch disagree by {report.max_abs_diff:.3g} on the {name} graph's "
                    f"logits, more than export.tolerance {spec.export.tolerance:g}: "
                    f"{json.dumps(report.to_dict()['cases'])}"
                )
        if source.run is not None and (source.run / "tokenizer.json").exists():
            shutil.copyfile(source.run / "tokenizer.json", tmp / "tokenizer.json")
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
    graphs, tolerance = manifest["graphs"], spec.export.tolerance
    return {
        "model": check_decoder_parity(model, bundle / graphs["model"]["file"], tolerance, seed=1),
        "step": check_step_parity(model, bundle / graphs["step"]["file"], tolerance, seed=1),
    }


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

    assert [i.name for i in protos["model"].graph.input] == list(DECODER_INPUTS)
    assert [o.name for o in protos["model"].graph.output] == list(DECODER_OUTPUTS)
    return {
        "format_version": FORMAT_VERSION,
        "task": spec.task.type,
        "model": {
            "family": spec.model.family,
            "vocab_size": spec.model.vocab_size,
            "max_seq_len": spec.model.max_seq_len,
            "n_layers": spec.model.n_layers,
            "n_kv_heads": spec.model.n_kv_heads,
            "head_dim": spec.model.head_dim,
        },
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
