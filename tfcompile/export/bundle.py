"""Bundles: a folder that another application serves with onnxruntime alone.

    model.onnx          the full forward (dynamic batch and sequence axes): a decoder's next-token
                        logits, or a classifier's label logits
    decoder_step.onnx   decoders: new tokens + per-layer past K/V -> logits + present K/V
    encoder.onnx        translators: a source to the decoder's cross-attention keys and values
    tokenizer.json      text models from a run: the run's tokenizer
    spec.yaml           the resolved spec
    manifest.json       format 2 (tfcompile.manifest, schemas/manifest.schema.json): the
                        graphs with their roles and named, explained inputs and outputs, the special
                        tokens, padding, the context, generation or translation settings, labels,
                        image preprocessing, versions, parity, and every file's sha256

Which graphs a bundle holds, and what its manifest says about the task, is the task's to say
(tfcompile.tasks). The bundle is assembled in a temporary sibling folder and renamed into place
only when parity holds; an existing bundle is replaced only when asked (``force``), and a folder
that is not a bundle tfcompile wrote is never touched.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeGuard

import onnx
import torch
from tokenizers import Tokenizer
from torch import nn

from tfcompile import __version__
from tfcompile.destination import check_destination, move_into_place, staging_folder
from tfcompile.errors import ExportError
from tfcompile.files import TOKENIZER_FILE
from tfcompile.graphs.export import Graph, tensor_meaning
from tfcompile.graphs.parity import ParityReport
from tfcompile.manifest import (
    MANIFEST,
    SPEC_FILE,
    Cache,
    Manifest,
    Padding,
    SpecialToken,
    Tensor,
    TokenizerInfo,
)
from tfcompile.manifest import Graph as GraphEntry
from tfcompile.nn.moe import half
from tfcompile.runtime import check_bundle
from tfcompile.runtime.bundle import BundleFiles, sha256_file
from tfcompile.runtime.errors import BundleError
from tfcompile.runtime.ort import ort
from tfcompile.runtime.session import checked_truncation
from tfcompile.sequences import SPECIAL_ROLES
from tfcompile.spec import Spec, dump_spec, parse_spec
from tfcompile.spec.schema import MAX_OPSET, MIN_OPSET, OPSETS, SpecialTokens
from tfcompile.tasks.task import build_model, task_of
from tfcompile.train.checkpoint import FOLDER_NAME, RunWarning
from tfcompile.train.runs import load_trained_checkpoint

# A graph's file is its name: model.onnx, encoder.onnx, ...; "step" keeps its descriptive name.
GRAPH_FILES = {"step": "decoder_step.onnx"}


def graph_file(name: str) -> str:
    return GRAPH_FILES.get(name, f"{name}.onnx")


@dataclass(frozen=True)
class Source:
    """Where the weights come from: a run's checkpoint, or a spec initialised with a seed."""

    run: Path | None = None
    checkpoint: str = "last"  # last, best, or a checkpoint folder's name
    seed: int = 0
    folder: str | None = None  # the checkpoint folder loaded: verify reads the same one

    def load(self, spec: Spec | None = None) -> tuple[Source, Spec, nn.Module]:
        """-> this source, with the checkpoint folder it loaded; the spec; the model."""
        if self.run is not None:
            spec, model, folder = load_trained_checkpoint(self.run, self.checkpoint)
            return dataclasses.replace(self, folder=folder.name), spec, model
        assert spec is not None
        torch.manual_seed(self.seed)
        return self, spec, build_model(spec).eval()

    def to_dict(self) -> dict[str, Any]:
        if self.run is not None:
            folder = {"checkpoint_folder": self.folder} if self.folder else {}
            return {"run": str(self.run.resolve()), "checkpoint": self.checkpoint} | folder
        return {"seed": self.seed}


def _is_seed(value: Any) -> TypeGuard[int]:
    """Whether a manifest's seed is one torch.manual_seed takes (a bool is no seed)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def export_bundle(
    spec: Spec | None,
    source: Source,
    out: Path,
    opset: int | None = None,
    precision: str | None = None,
    force: bool = False,
    cuda_graphs: bool | None = None,
) -> dict[str, ParityReport]:
    """Export, check parity of every graph, and write the bundle; returns the parity reports.
    ``opset``, ``precision`` (fp32, fp16) and ``cuda_graphs`` override the spec's export.opset,
    export.precision and export.cuda_graphs.
    An fp16 graph (its MoE routers in float32) is checked against the fp32 PyTorch model, with its
    outputs read as float32.
    ``force`` replaces an existing bundle at ``out``; nothing else there is ever replaced."""
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"opset {opset}: {OPSETS}")
    overrides = {"precision": precision, "cuda_graphs": cuda_graphs}
    overrides = {field: value for field, value in overrides.items() if value is not None}
    if spec is not None:
        spec = spec.replace({"export": overrides}) if overrides else spec
        _check_exportable(spec)
    replaced = check_destination(out, force)
    source, spec, model = source.load(spec)
    spec = spec.replace({"export": overrides}) if overrides else spec
    _check_exportable(spec)
    graphs = bundle_graphs(spec)
    exported = half(copy.deepcopy(model)) if spec.export.precision == "fp16" else model
    opset = opset or spec.export.opset
    tmp = staging_folder(out)
    try:
        protos = {name: g.export(exported, tmp / graph_file(name), opset) for name, g in graphs.items()}
        reports = {name: _check(g, model, tmp / graph_file(name), spec) for name, g in graphs.items()}
        for name, report in reports.items():
            if not report.passed:
                measure = "relative to the outputs' scale" + ("" if report.relative else " past 1")
                field = "export.fp16_tolerance" if report.relative else "export.tolerance"
                how = (
                    f"by {report.measured:.3g} ({measure}) on the {name} graph's outputs, more than "
                    f"{field} {report.tolerance:g}"
                    if math.isfinite(report.measured)
                    else f"on the {name} graph's outputs: one gives a NaN or an infinity where the other "
                    "does not, or PyTorch's own are not finite (weights that are not, or an fp16 graph "
                    "past its range)"
                )
                routed = (
                    ". An fp16 graph can send a token to other experts than the fp32 model where their "
                    "scores tie within float16's precision, as a new model's router scores all lie close "
                    "together: raise export.fp16_tolerance, or export in fp32"
                    if report.relative and spec.model.moe is not None and math.isfinite(report.measured)
                    else ""
                )
                raise ExportError(
                    f"onnxruntime and PyTorch disagree {how}: {json.dumps(report.to_dict()['cases'])}{routed}"
                )
        if source.run is not None and (source.run / TOKENIZER_FILE).exists():
            shutil.copyfile(source.run / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
        (tmp / SPEC_FILE).write_text(dump_spec(spec))
        manifest = _manifest(spec, protos, opset, source, reports, tmp)
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2, exclude_none=True) + "\n")
        move_into_place(tmp, out, replaced)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return reports


def verify_bundle(bundle: Path, run: Path | None = None) -> dict[str, ParityReport]:
    """Check the bundle as the runtime does (a BundleError for what it refuses), then rerun the
    parity check from the bundle and the weights it was exported from: ``run`` for a bundle
    exported from a run (its manifest records where, but a bundle's word never opens files outside
    it), the recorded seed for one exported from a spec."""
    files = BundleFiles(bundle)
    recorded = files.manifest.source
    spec = parse_spec(files.text(SPEC_FILE), source=str(bundle / SPEC_FILE))
    _spec_is_the_manifests(bundle, spec, files.manifest)
    check_bundle(files)  # every check the runtime makes, of every graph: what it refuses fails here
    if run is not None:
        said = recorded.get("run")
        if isinstance(said, str) and os.path.normpath(said) != str(run.resolve()):  # as export records it
            warnings.warn(
                f"--run {run} is not the run {bundle} records it was exported from ({said}): a run "
                f"moved since checks alike, another fails",
                RunWarning,
                stacklevel=2,
            )
        # The checkpoint folder exported from (a run trained on since has a newer last), else the
        # pointer recorded (bundles exported before folders were recorded).
        folder, checkpoint = recorded.get("checkpoint_folder"), recorded.get("checkpoint", "last")
        if isinstance(folder, str) and FOLDER_NAME.fullmatch(folder):
            checkpoint = folder
        source = Source(run=run, checkpoint=checkpoint if checkpoint in ("last", "best", folder) else "last")
    elif "run" in recorded:
        raise ExportError(
            f"{bundle} was exported from the run {recorded['run']!r}: pass --run RUN to check it against "
            f"that run's checkpoint (tfcompile opens no file outside a bundle on the bundle's word)"
        )
    elif _is_seed(seed := recorded.get("seed")):
        source = Source(seed=seed)
    else:
        raise BundleError(
            f"{bundle / MANIFEST}: source records neither a run nor a seed (a whole number from 0 to "
            f"2^63 - 1, torch's), found {str(seed)[:40]}"
        )
    _, loaded, model = source.load(spec)
    if loaded.model != spec.model or loaded.task.type != spec.task.type:
        differ = [k for k, v in spec.model.model_dump().items() if loaded.model.model_dump().get(k) != v]
        raise ExportError(
            f"{run} is not the run {bundle} was exported from: its {loaded.task.type} model differs from "
            f"the bundle's {SPEC_FILE} ({spec.task.type}) in {', '.join(differ) or 'its task'}"
        )
    graphs = files.manifest.graphs
    reports: dict[str, ParityReport] = {}
    for name, g in bundle_graphs(spec).items():
        if name not in graphs:
            raise BundleError(
                f"{bundle}: the manifest has no {name!r} graph, which a {spec.task.type} bundle holds"
            )
        with tempfile.TemporaryDirectory() as scratch:  # the checked bytes, not the file again
            path = Path(scratch) / graphs[name].file
            path.write_bytes(files.read(graphs[name].file))
            reports[name] = _check(g, model, path, spec, seed=1)
        if files.manifest.optimization:
            reports[name] = _optimized(reports[name], name, files.manifest, spec)
    return reports


def _spec_is_the_manifests(bundle: Path, spec: Spec, manifest: Manifest) -> None:
    """The bundle's spec.yaml says what its manifest does (its task, vocabulary and context): the
    parity check builds the model from it, which would otherwise fail on the graphs' inputs as if
    the graphs were broken."""
    said = (manifest.task, manifest.model.vocab_size, manifest.model.max_seq_len)
    found = (spec.task.type, spec.model.vocab_size, spec.model.max_seq_len)  # as the export wrote them
    if found != said:
        raise BundleError(
            f"{bundle / SPEC_FILE} is not the spec of the manifest's graphs: its task, vocab_size and "
            f"max_seq_len are {found}, the manifest's {said}"
        )


def _optimized(report: ParityReport, graph: str, manifest: Manifest, spec: Spec) -> ParityReport:
    """An optimized graph's report, held relative to the outputs' scale to the export's tolerance
    plus twice what `tfcompile optimize` measured against its source graph (fresh inputs move a
    quantized graph's difference a little)."""
    base = spec.export.fp16_tolerance if manifest.precision == "fp16" else spec.export.tolerance
    recorded = sum(o.parity.get(graph, 0.0) for o in manifest.optimization or [])
    return dataclasses.replace(report, relative=True, tolerance=base + 2 * recorded)


def _check(graph: Graph, model: nn.Module, path: Path, spec: Spec, seed: int = 0) -> ParityReport:
    """The graph's parity against the fp32 model; fp16 graphs are bounded relative to the outputs'
    scale, since half precision keeps about three significant digits whatever the magnitude."""
    report = graph.check(model, path, spec.export.parity_tolerance, seed=seed)
    return dataclasses.replace(report, relative=spec.export.precision == "fp16")


def bundle_graphs(spec: Spec) -> dict[str, Graph]:
    """The graphs a bundle of ``spec`` holds, by name: its task's, those for CUDA graphs where
    export.cuda_graphs asks for them."""
    graphs = task_of(spec).graphs
    return {name: g for name, g in graphs.items() if spec.export.cuda_graphs or not g.cuda_graphs}


def _check_exportable(spec: Spec) -> None:
    task = task_of(spec)
    if not task.graphs:
        raise ExportError(f"a {spec.task.type} model is not exported: {task.not_served}")
    if spec.export.cuda_graphs and not any(g.cuda_graphs for g in task.graphs.values()):
        raise ExportError(
            f"export.cuda_graphs asks for a graph of fixed shapes to replay as CUDA graphs, which "
            f"{spec.task.type} bundles do not have (causal_lm bundles do: fixed_step); leave it false"
        )
    missing = spec.sizes_from_data()
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise ExportError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: export a trained "
            f"run, which took {them} from the data, or set {them} in the spec"
        )


def _manifest(
    spec: Spec,
    protos: dict[str, onnx.ModelProto],
    opset: int,
    source: Source,
    reports: dict[str, ParityReport],
    folder: Path,
) -> Manifest:
    """The bundle's manifest, validated as the schema says before it is written."""
    task = task_of(spec)
    tokenizer = (
        tokenizer_info(
            Tokenizer.from_file(str(folder / TOKENIZER_FILE)),
            spec.tokens,
            source.run / TOKENIZER_FILE if source.run is not None else TOKENIZER_FILE,
        )
        if (folder / TOKENIZER_FILE).exists()
        else None
    )
    pad = tokenizer.special_tokens.get("pad") if tokenizer is not None else None
    padding = Padding(side=task.padding_side, pad_id=pad.id if pad is not None else 0)
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    return Manifest(
        format_version=2,
        task=spec.task.type,
        precision=spec.export.precision,
        model={
            "family": spec.model.family,
            "vocab_size": spec.model.vocab_size,
            "max_seq_len": spec.model.max_seq_len,
        },
        graphs={name: _graph_entry(name, task.graphs[name], proto) for name, proto in protos.items()},
        padding=padding,
        tokenizer=tokenizer,
        opset=opset,
        versions={
            "tfcompile": __version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxscript": version("onnxscript"),
            "onnxruntime": ort.__version__,
        },
        source=source.to_dict(),
        parity={name: report.to_dict() for name, report in reports.items()},
        files=files,
        **task.manifest(spec, tokenizer, source.run),
    )


def _graph_entry(name: str, graph: Graph, proto: onnx.ModelProto) -> GraphEntry:
    def tensors(values: Any) -> list[Tensor]:
        return [
            Tensor(
                name=v.name,
                dtype=onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                shape=[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                meaning=tensor_meaning(v.name),
            )
            for v in values
        ]

    inputs, outputs = tensors(proto.graph.input), tensors(proto.graph.output)
    past = [t.name for t in inputs if t.name.startswith("past_")]
    present = [t.name for t in outputs if t.name.startswith("present_")]
    cache = Cache(past=past, present=present) if past else None
    return GraphEntry(file=graph_file(name), role=graph.role, inputs=inputs, outputs=outputs, cache=cache)


def tokenizer_info(
    tokenizer: Tokenizer, tokens: SpecialTokens | None = None, where: Path | str = TOKENIZER_FILE
) -> TokenizerInfo:
    """The tokenizer's special tokens by role (the spec's ``tokens``, else tfcompile's own
    strings), the roles its post-processor adds by itself, what becomes of an unknown character,
    and how a text too long is cut.

    The roles added are read from what the tokenizer does to an empty text (a pair's own, the
    library adds as it encodes the pair), not from the post-processor's settings: RoBERTa's
    processor, or a Sequence holding a template (Llama 3's), add tokens that a bare template's
    ``special_tokens`` would not name."""
    roles = tokens.roles() if tokens is not None else {role: token for token, role in SPECIAL_ROLES.items()}
    specials = {
        role: SpecialToken(token=token, id=i)
        for role, token in roles.items()
        if (i := tokenizer.token_to_id(token)) is not None
    }
    by_id: dict[int, str] = {}
    for role, special in specials.items():  # a token of two roles (T5's <pad>, its bos too) by its first
        by_id.setdefault(special.id, role)
    text = tokenizer.to_str()
    unpadded = Tokenizer.from_str(text)
    unpadded.no_padding()  # a tokenizer.json's padding (to a fixed length, say) adds no role
    added = list(dict.fromkeys(by_id[i] for i in unpadded.encode("").ids if i in by_id))
    saved = json.loads(text)
    byte_level = (saved.get("pre_tokenizer") or {}).get("type") == "ByteLevel"
    return TokenizerInfo(
        file=TOKENIZER_FILE,
        special_tokens=specials,
        added_by_tokenizer=added,
        unknown="map" if "unk" in specials or byte_level else "refuse",
        truncation=checked_truncation(tokenizer, where),  # refused as the runtime would refuse it
    )
