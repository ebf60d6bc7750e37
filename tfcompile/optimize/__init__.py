"""`tfcompile optimize`: a faster bundle made from a bundle, which is never changed.

Every graph goes through the asked transformations (tfcompile/optimize/passes.py), in this order:
fusion, fp16, quantization. Each transformed graph is run beside its source on fresh inputs
(parity.py): fusion and fp16 must keep parity (fusion within 1e-4 of the outputs' scale, fp16
within 1e-2; a fused graph is held to its own bound before a later step converts or quantizes
it), quantization's difference is recorded (outputs NaN or infinite where the source's are not
are refused at every step). A quantized bundle must then pass its task's
accuracy gate on held-out data (``GateRule`` in tfcompile/tasks): the task's metric, measured with
onnxruntime on the source bundle and on the new one, may not get worse by more than the rule
allows. The data comes from the run the bundle was exported from, named by the user (``--run``):
a bundle's word opens nothing outside it. The new bundle's manifest records every step, the
operators each introduced, the parity and the gate; anything that fails writes nothing.

Before any work, the plan is checked against the steps the bundle records and its task's gate
rule, the bundle as the runtime's loader checks it (``check_bundle``), and the run against the
spec and tokenizer the bundle records.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx

from tfcompile.destination import check_destination, check_outside, move_into_place, staging_folder
from tfcompile.manifest import (
    FIXED_STEP_ROLE,
    MANIFEST,
    SPEC_FILE,
    STEP_ROLE,
    Gate,
    Graph,
    GraphName,
    Manifest,
    Optimization,
    Tensor,
    Transformation,
)
from tfcompile.optimize.parity import relative_difference
from tfcompile.optimize.passes import (
    CONTRIB,
    QUANTIZED_OPS,
    OptimizeError,
    fuse,
    introduced,
    onnxruntime_failure,
    quantize_int4,
    quantize_int8,
    to_fp16,
)
from tfcompile.runtime import check_bundle
from tfcompile.runtime.bundle import BundleFiles, sha256_file

FUSED_TOLERANCE = 1e-4  # of the outputs' scale: fusion reorders arithmetic, nothing more
FP16_TOLERANCE = 1e-2  # half precision keeps about three significant digits

__all__ = ["GateData", "OptimizeError", "Plan", "optimize_bundle"]


@dataclass(frozen=True)
class Plan:
    """What to do to every graph."""

    fuse: bool = False
    quantize: Literal["int8", "int4"] | None = None
    precision: Literal["fp16"] | None = None

    def describe(self) -> str:
        parts = ["fused"] * self.fuse + [self.precision or "", self.quantize or ""]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class GateData:
    """Where the accuracy gate's held-out data comes from: the run the bundle was exported from,
    and at most ``limit`` examples of its held-out split (None: the task's default)."""

    run: Path
    limit: int | None = None


def optimize_bundle(
    bundle: Path, out: Path, plan: Plan, gate: GateData | None, force: bool = False
) -> Optimization:
    """Write the optimized bundle at ``out`` (a new or empty folder, or with ``force`` a bundle
    tfcompile wrote) and return what its manifest records of the optimization. A quantization
    needs ``gate`` unless the caller decided otherwise (the CLI's --no-gate)."""
    files = BundleFiles(bundle)
    manifest = files.manifest
    _check_plan(plan, manifest, files.format_version, gate is not None)
    check_outside(bundle, out, OptimizeError)
    replacing = check_destination(out, force)
    check_bundle(files)
    if gate is not None:
        _check_run(gate.run, files)
    tmp = staging_folder(out)
    try:
        graphs, steps, parity = _transform(files, plan)
        written = {manifest.graphs[name].file: data for name, data in graphs.items()}
        for name in manifest.files:
            (tmp / name).write_bytes(written[name] if name in written else files.read(name))
        optimization = Optimization(source=sha256_file(bundle / MANIFEST), steps=steps, parity=parity)
        _write_manifest(tmp, manifest, plan, optimization)
        if gate is not None:
            optimization = optimization.model_copy(update={"gate": _gate(gate, bundle, tmp, plan)})
            _write_manifest(tmp, manifest, plan, optimization)
        move_into_place(tmp, out, replacing)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return optimization


def _check_plan(plan: Plan, manifest: Manifest, format_version: int, gated: bool) -> None:
    """Refuse, before any work, a plan that cannot be done to this bundle, whatever the gate."""
    if not (plan.fuse or plan.quantize or plan.precision):
        raise OptimizeError("nothing to do: ask for --fuse, --quantize int8|int4 or --precision fp16")
    if format_version < 2:
        raise OptimizeError("this bundle has format 1: export it again with this tfcompile first")
    history = f"its steps: {_history(manifest)}"
    if plan.precision == "fp16" and manifest.precision == "fp16":
        raise OptimizeError(f"the bundle is fp16 already ({history})")
    if plan.quantize and plan.precision == "fp16":
        raise OptimizeError(
            "quantize an fp32 bundle, without --precision fp16: onnxruntime's int8 and int4 kernels "
            "take float32 activations"
        )
    if plan.quantize and manifest.precision == "fp16":
        raise OptimizeError(f"the bundle is fp16 ({history}): quantize the fp32 bundle it was exported with")
    done = [step.kind for o in manifest.optimization or [] for step in o.steps]
    if plan.quantize and "quantize" in done:
        raise OptimizeError(
            f"the bundle is quantized already ({history}): quantize the bundle it was made from"
        )
    if plan.precision == "fp16" and "quantize" in done:
        raise OptimizeError(
            f"the bundle is quantized ({history}), and onnxruntime's int8 and int4 kernels take float32 "
            f"activations: convert the fp32 bundle it was made from with --precision fp16 instead"
        )
    if plan.fuse and "fuse" in done:
        raise OptimizeError(f"the bundle is fused already ({history})")
    if plan.quantize or gated:
        check_gate_rule(plan, manifest.task, gated)


def _history(manifest: Manifest) -> str:
    """How the bundle was made, as its manifest records it: "export fp32, fuse, quantize int8"."""
    done = [step for optimization in manifest.optimization or [] for step in optimization.steps]
    converted = any(step.kind == "precision" for step in done)
    steps = [f"export {'fp32' if converted else manifest.precision}"]
    for step in done:
        setting = step.settings.get("scheme", step.settings.get("precision", ""))
        steps.append(f"{step.kind} {setting}".strip())
    return ", ".join(steps)


def check_gate_rule(plan: Plan, task: str, gated: bool) -> None:
    """The bundle's task has an accuracy gate for the run to hold it to, and the quantization asked
    for is one the gate rule holds (int4 is for decoders)."""
    from tfcompile.tasks import TASKS

    rule = TASKS[task].gate if task in TASKS else None
    if rule is None:
        if gated:
            raise OptimizeError(f"{task} bundles have no accuracy gate: pass --no-gate instead of --run")
        return
    if plan.quantize and plan.quantize not in rule.tolerance:
        raise OptimizeError(
            f"{plan.quantize} quantization is for decoders; {task} bundles take "
            f"{' or '.join(rule.tolerance)}: ask for --quantize {next(iter(rule.tolerance))}"
        )


def _check_run(run: Path, files: BundleFiles) -> None:
    """The gate's run must be the one the bundle was exported from: the same task, model and
    tokenizer as the bundle records (its spec.yaml and its tokenizer's sha256)."""
    from tfcompile.files import TOKENIZER_FILE
    from tfcompile.spec import parse_spec
    from tfcompile.train.runs import load_run_spec

    spec = load_run_spec(run)
    manifest = files.manifest
    recorded = manifest.source.get("run")
    named = f" (its manifest names the run {recorded})" if recorded else ""
    mismatch = f"{run} is not the run {files.folder} was exported from{named}: "
    advice = "; pass the run it was exported from to --run, or --no-gate"
    if spec.task.type != manifest.task:
        raise OptimizeError(
            f"{mismatch}it is a {spec.task.type} run, and the bundle a {manifest.task} one{advice}"
        )
    if SPEC_FILE in manifest.files:
        exported = parse_spec(files.text(SPEC_FILE), source=str(files.folder / SPEC_FILE))
        for section in ("model", "task"):
            if getattr(spec, section) != getattr(exported, section):
                raise OptimizeError(
                    f"{mismatch}the {section} section of its spec is not the bundle's {SPEC_FILE}'s{advice}"
                )
    bundle_tokenizer = manifest.files[manifest.tokenizer.file] if manifest.tokenizer is not None else None
    run_tokenizer = sha256_file(run / TOKENIZER_FILE) if (run / TOKENIZER_FILE).exists() else None
    if run_tokenizer != bundle_tokenizer:
        raise OptimizeError(
            f"{mismatch}the run's {TOKENIZER_FILE} (sha256 {_short(run_tokenizer)}) is not the bundle's "
            f"(sha256 {_short(bundle_tokenizer)}){advice}"
        )


def _short(digest: str | None) -> str:
    return f"{digest[:12]}..." if digest is not None else "none"


def _transform(
    files: BundleFiles, plan: Plan
) -> tuple[dict[GraphName, bytes], list[Transformation], dict[str, float]]:
    """Every graph transformed, the steps as the manifest records them, and each graph's parity."""
    import onnxruntime
    import onnxscript

    manifest = files.manifest
    graphs: dict[GraphName, bytes] = {}
    parity: dict[str, float] = {}
    operators: dict[str, dict[str, int]] = {"fuse": {}, "quantize": {}}
    fusers: set[str] = set()
    # The fixed step graph's window is filled by the source's step graph, as the runtime fills it:
    # the step graph goes first, and its source is kept for it.
    step: bytes | None = None
    for name, graph in sorted(manifest.graphs.items(), key=lambda item: item[1].role == FIXED_STEP_ROLE):
        source = files.read(graph.file)
        model = onnx.load_from_string(source)  # check_bundle had onnxruntime load it
        step = source if graph.role == STEP_ROLE else step
        prefill = step if graph.role == FIXED_STEP_ROLE else None
        if plan.fuse:
            fused, tool = fuse(model)
            _add(operators["fuse"], introduced(model, fused, lambda op: op.startswith(CONTRIB)))
            fusers.add(tool)
            model = fused
            if plan.precision or plan.quantize:  # held to fusion's bound, not to the next step's
                _parity(name, source, model.SerializeToString(), graph, manifest, Plan(fuse=True), prefill)
        if plan.precision:
            model = to_fp16(model)
        if plan.quantize:
            quantized = (quantize_int8 if plan.quantize == "int8" else quantize_int4)(model)
            added = introduced(model, quantized, lambda op: op.split("::")[-1] in QUANTIZED_OPS)
            if not added:  # the manifest would record a quantization that did nothing
                raise OptimizeError(
                    f"{plan.quantize} quantization found no float weight to quantize in the {name} graph "
                    f"(is it quantized already, whatever its manifest says?): nothing was written"
                )
            _add(operators["quantize"], added)
            model = quantized
        graphs[name] = model.SerializeToString()
        parity[name] = _parity(name, source, graphs[name], graph, manifest, plan, prefill)
    versions = f"onnxruntime {onnxruntime.__version__}, onnxscript {onnxscript.__version__}"
    steps = []
    if plan.fuse:
        steps.append(
            Transformation(
                kind="fuse", tool=f"{' and '.join(sorted(fusers))} ({versions})", operators=operators["fuse"]
            )
        )
    if plan.precision:
        steps.append(
            Transformation(
                kind="precision",
                tool=f"onnxruntime transformers.float16.convert_float_to_float16 ({versions})",
                settings={"precision": plan.precision},
            )
        )
    if plan.quantize == "int8":
        steps.append(
            Transformation(
                kind="quantize",
                tool=f"onnxruntime quantization.quantize_dynamic ({versions})",
                settings={
                    "scheme": "int8",
                    "weights": "int8, per output channel",
                    "activations": "dynamic int8",
                    "ops": "MatMul, Gather",
                },
                operators=operators["quantize"],
            )
        )
    elif plan.quantize == "int4":
        steps.append(
            Transformation(
                kind="quantize",
                tool=f"onnxruntime quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer ({versions})",
                settings={
                    "scheme": "int4",
                    "weights": "int4 asymmetric",
                    "block_size": 32,
                    "accuracy_level": 4,
                },
                operators=operators["quantize"],
            )
        )
    return graphs, steps, parity


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for op, n in counts.items():
        total[op] = total.get(op, 0) + n


def _parity(
    name: str,
    source: bytes,
    transformed: bytes,
    graph: Graph,
    manifest: Manifest,
    done: Plan,
    prefill: bytes | None = None,
) -> float:
    """The parity of the graph that the steps ``done`` made from ``source`` (``prefill``: the
    source's step graph, for the fixed step graph's window). Fusion and fp16 must keep it; a
    quantized graph's difference is the gate's to judge, unless its outputs are NaN or infinite
    where the source's are not (or the reverse)."""
    with onnxruntime_failure(f"run the {done.describe()} {name} graph beside its source"):
        measured = relative_difference(source, transformed, graph, manifest, prefill)
    if not math.isfinite(measured):
        raise OptimizeError(
            f"the {done.describe()} {name} graph gives outputs that are not finite where the source's "
            f"are (or the reverse): nothing was written"
        )
    if done.quantize:
        return measured
    half = done.precision == "fp16" or manifest.precision == "fp16"
    tolerance = FP16_TOLERANCE if half else FUSED_TOLERANCE
    if measured > tolerance:
        raise OptimizeError(
            f"the {done.describe()} {name} graph differs from the source's by {measured:.3g} of the "
            f"outputs' scale, more than {tolerance:g}: nothing was written"
        )
    return measured


def _write_manifest(folder: Path, manifest: Manifest, plan: Plan, optimization: Optimization) -> None:
    half = plan.precision == "fp16"
    graphs = {name: _retyped(g, half) for name, g in manifest.graphs.items()}
    updated = manifest.model_copy(
        update={
            "precision": "fp16" if half else manifest.precision,
            "graphs": graphs,
            "files": {name: sha256_file(folder / name) for name in manifest.files},
            "optimization": [*(manifest.optimization or []), optimization],
        }
    )
    validated = Manifest.model_validate(updated.model_dump())
    (folder / MANIFEST).write_text(validated.model_dump_json(indent=2, exclude_none=True) + "\n")


def _retyped(graph: Graph, half: bool) -> Graph:
    """The graph's entry with float32 tensors declared float16, after a conversion to fp16."""
    if not half:
        return graph

    def retype(tensors: list[Tensor]) -> list[Tensor]:
        return [t.model_copy(update={"dtype": "float16"}) if t.dtype == "float32" else t for t in tensors]

    return graph.model_copy(update={"inputs": retype(graph.inputs), "outputs": retype(graph.outputs)})


def _gate(data: GateData, source: Path, optimized: Path, plan: Plan) -> Gate:
    """The task's held-out metric on both bundles, or OptimizeError when the new one is worse
    than the rule allows."""
    from tfcompile.data.tokenizer import load_tokenizer
    from tfcompile.files import TOKENIZER_FILE
    from tfcompile.runtime import load
    from tfcompile.tasks.task import task_of
    from tfcompile.train.runs import load_run_spec, runs_folder

    spec = load_run_spec(data.run)
    task_class = task_of(spec)
    rule = task_class.gate
    assert rule is not None  # _check_plan
    scheme = plan.quantize or "int8"
    tokenizer_file = data.run / TOKENIZER_FILE
    tokenizer = load_tokenizer(tokenizer_file) if tokenizer_file.exists() else None
    task = task_class(spec, runs_folder(data.run, spec) / ".cache", tokenizer)
    before, where = task.held_out(load(source), data.limit)
    with onnxruntime_failure(f"load the {plan.describe()} bundle"):
        new = load(optimized)
    after, _ = task.held_out(new, data.limit)
    gate = Gate(metric=rule.metric, data=where, source=before, optimized=after, allowed=rule.allowed(scheme))
    if not rule.passes(before, after, scheme):
        raise OptimizeError(
            f"the {plan.describe()} bundle fails its accuracy gate: {rule.metric} {after:.4g} against "
            f"{before:.4g} for the source, on {where}; allowed: {gate.allowed}. Nothing was written"
        )
    return gate
