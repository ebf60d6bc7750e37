"""The ``tfcompile`` command: thin subcommands over the package's modules."""

from __future__ import annotations

import argparse
import difflib
import io
import math
import os
import select
import signal
import sys
import tempfile
import unicodedata
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tfcompile import __version__
from tfcompile.errors import UserError, first_line
from tfcompile.manifest import MAX_BEAM, MAX_LENGTH_PENALTY, REPETITION_PENALTIES
from tfcompile.paths import FOLDER, LINK_LOOP, Kind, check_arguments, file_type, kind_of, untrained
from tfcompile.signals import handling
from tfcompile.spec import Spec, SpecError, SpecIssue, dump_spec, load_spec
from tfcompile.spec.loader import read_yaml
from tfcompile.spec.schema import GENERATION_OPTIONS, MAX_SEED, MAX_THREADS, CausalLMTask, check_run_name

if TYPE_CHECKING:
    from tfcompile.export import ParityReport
    from tfcompile.optimize import GateData, Plan
    from tfcompile.runtime import Prediction
    from tfcompile.runtime.session import Bundle

EXIT_SPEC_ERROR = 2


def _validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, args.set)  # the spec layer alone: no torch
    for warning in _missing_data(Path(args.spec), spec, args.set):
        print(warning, file=sys.stderr)
    if args.show:
        print(dump_spec(spec), end="")
    m = spec.model
    count = spec.parameter_count()
    params = (
        f"{', '.join(spec.sizes_from_data())} from the data" if count is None else f"{count:,} parameters"
    )
    print(
        f"{args.spec}: ok ({m.family}, {spec.task.type}, {m.n_layers} layer{'s' * (m.n_layers != 1)}, "
        f"d_model {m.d_model}, {params})"
    )
    return 0


def _missing_data(path: Path, spec: Spec, overrides: Sequence[str]) -> list[str]:
    """A warning for each data path that names nothing (or a loop of links), at its line: `train`
    refuses it, while a spec may be validated where its data is not (a path holding a
    {placeholder} is the task's to fill, and left to `train`)."""
    if spec.data is None:
        return []
    marks = read_yaml(path)[2]
    given = {override.partition("=")[0].strip(): override for override in overrides}  # the last wins
    found = []
    for field in ("path", "val_path", "test_path"):
        value = getattr(spec.data, field)
        if value is None or "{" in str(value) or (what := file_type(value)) not in ("nothing", LINK_LOOP):
            continue
        mark = marks.get(("data", field))
        where = (
            f"--set {given[f'data.{field}']}"
            if f"data.{field}" in given
            else f"{path}:{mark.line}:{mark.column}"
            if mark is not None
            else str(path)
        )
        problem = f"no file or folder at {value}" if what == "nothing" else f"{value} is {what}"
        found.append(
            f"{where}: warning: data.{field}: {problem} (a relative path is read from the spec's "
            f"folder, {path.parent.resolve()}): `train` will refuse it"
        )
    return found


def _summary(args: argparse.Namespace) -> int:
    from tfcompile.summary import summarize

    spec = load_spec(args.spec, args.set)
    missing = spec.sizes_from_data()
    if missing:
        raise SpecError(
            args.spec,
            [
                SpecIssue(field, "a summary needs this size, which training takes from the data", hint)
                for field, hint in (
                    ("model.vocab_size", "pass --set model.vocab_size=N"),
                    ("task.labels", "pass --set 'task.labels=[negative, positive]'"),
                )
                if field in missing
            ],
        )
    s = summarize(spec)
    table = Table(title=f"{args.spec}: {spec.model.family}", title_justify="left")
    table.add_column("module")
    table.add_column("type")
    table.add_column("parameters", justify="right")
    table.add_column("output shape")
    table.add_column("note")
    for row in s.rows:
        shape = "(" + ", ".join(map(str, row.output_shape)) + ")" if row.output_shape else "-"
        table.add_row(row.name, row.kind, f"{row.params:,}", shape, row.note)
    table.add_section()
    table.add_row("total", "", f"{s.total_params:,}", "", "")
    console = Console(width=max(Console().width, 110))
    console.print(table)
    assert spec.model.max_seq_len is not None  # resolved by the schema
    console.print(f"input: {spec.model.describe_input(spec.model.max_seq_len)}")  # the shapes' below
    console.print(
        f"FLOPs per token at context {s.context}: forward {_si(s.forward_flops_per_token)}, "
        f"training (forward + backward) {_si(s.train_flops_per_token)}"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    from tfcompile.train import Trainer, load_run_spec

    overrides = list(args.set) + (["train.compile=false"] if args.no_compile else [])
    if args.resume:
        run_dir = Path(args.resume)
        # Without a SPEC, resume with the run's own; --set may still extend train.steps and the like.
        spec = load_run_spec(run_dir, overrides) if args.spec is None else load_spec(args.spec, overrides)
    else:
        if args.spec is None:
            raise UsageError("give a SPEC to train, or --resume RUN to continue a run")
        spec = load_spec(args.spec, overrides)
        name = spec.train.name or Path(args.spec).stem
        try:
            check_run_name(name)
        except ValueError as e:
            hint = "the run takes the spec file's name; give one with --set train.name=NAME"
            raise UsageError(f"{e}: {hint}") from None
        run_dir = spec.train.runs_dir / name
    trainer = Trainer(spec, run_dir, resume=bool(args.resume))
    result = trainer.train()
    if trainer.world.is_main:
        metric = result.best_metric.removeprefix("val_").replace("_", " ")
        best = f", best val {metric} {result.best:.4f}" if result.best is not None else ""
        outcome = "stopped" if result.interrupted else "finished"
        print(f"{outcome} at step {result.step}{best}; run: {run_dir}")
    # Stopped by a signal: the shell's status for it (130 after Ctrl-C, 143 after SIGTERM).
    return 128 + result.stopped_by if result.stopped_by is not None else 0


def _sweep(args: argparse.Namespace) -> int:
    from tfcompile.study.plan import plan_study
    from tfcompile.study.schema import load_study
    from tfcompile.study.sweep import LAUNCHERS, Sweep

    if args.address is not None and args.launcher != "ray":
        raise UsageError("--address names a Ray cluster: give it with --launcher ray")
    plan = plan_study(load_study(args.study))  # every problem of the study file, before any training
    command = ["tfcompile", "sweep", args.study, "--launcher", args.launcher]
    command += ["--address", args.address] if args.address else []
    sweep = Sweep(plan, command=command)
    if not sweep.run(LAUNCHERS[args.launcher](args.address)):
        print(f"stopped; run the same command again to resume: runs in {plan.folder}", file=sys.stderr)
        return 128 + sweep.stopped_by  # 130 after Ctrl-C, 143 after SIGTERM
    print(f"finished: runs in {plan.folder}; compare them with: tfcompile compare {plan.folder}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tfcompile.study.report import compare, from_csv

    if args.from_csv is not None:
        if args.sources:
            raise UsageError("give either runs or studies to compare, or --from-csv, not both")
        out = from_csv(Path(args.from_csv), Path(args.out) if args.out else None)
    else:
        if not args.sources:
            raise UsageError("give the runs, study folders or study files to compare")
        out, missing = compare([Path(s) for s in args.sources], Path(args.out or "report"))
        for left in missing:
            print(f"tfcompile compare: warning: {left}", file=sys.stderr)
    print(f"wrote {out / 'report.md'}")
    return 0


def _runs(args: argparse.Namespace) -> int:
    from tfcompile.study.runs import find_runs, read_run

    folder = Path(args.folder)
    # A path of the wrong kind: exit 1, as every command's (tfcompile.paths); a bundle and a Hugging
    # Face folder are folders, of no runs.
    if not args.folder or not folder.is_dir() or kind_of(folder) in (Kind.BUNDLE, Kind.HF):
        found = file_type(folder) if args.folder else "an empty path"
        kind = kind_of(folder).value if found == FOLDER else found
        kind = "nothing (no such file or folder)" if found == "nothing" else kind
        raise UserError(
            f"{args.folder or repr('')} is {kind}, but `runs` takes a folder: a runs folder "
            f"(train.runs_dir), a study's or a run"
        )
    paths = find_runs(folder)
    if not paths:
        print(f"no runs in {folder}")
        return 0
    names = [str(p.relative_to(folder)) if p != folder else str(p) for p in paths]
    table = Table(title=f"runs in {folder}", title_justify="left")
    table.add_column("run", no_wrap=True, min_width=max(map(len, names)))
    for column in ("family", "task", "parameters", "steps", "best", "state"):
        right = column in ("parameters", "steps")
        table.add_column(column, justify="right" if right else "left", no_wrap=True)
    for name, path in zip(names, paths, strict=True):
        try:
            run = read_run(path)
        except (SpecError, UserError, OSError) as e:  # one damaged run: the others are still listed
            table.add_row(name, "-", "-", "-", "-", "-", f"damaged: {first_line(e, 200)}")
            continue
        best = run.best()
        metric = run.best_metric.removeprefix("val_").replace("_", " ")
        table.add_row(
            name,
            run.spec.model.family,
            run.spec.task.type,
            f"{run.spec.parameter_count() or 0:,}",
            f"{run.step:,} / {run.planned:,}",
            "-" if best is None else f"val {metric} {best:.4f}",
            run.state,
        )
    _print_whole(table)
    return 0


def _print_whole(table: Table) -> None:
    """A table with every cell whole: a pipe gets its natural width; a terminal too narrow for it
    gets it without borders, then, if still too narrow, at its natural width (the terminal wraps
    the lines) rather than cells cut to "decod…"."""
    console = Console()
    natural = Console(width=10_000).measure(table).maximum
    if console.is_terminal and natural > console.width:
        table.box = None
        natural = Console(width=10_000).measure(table).maximum
    Console(width=max(console.width, natural)).print(table)


def _plot(args: argparse.Namespace) -> int:
    from tfcompile.study.plots import plot_runs

    plot_runs([Path(r) for r in args.runs], Path(args.out), args.metric, args.x, args.force)
    print(f"wrote {args.out}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    import torch

    from tfcompile.data import encode, load_tokenizer
    from tfcompile.models import DecoderLM
    from tfcompile.tasks.causal_lm import bans, generate
    from tfcompile.train import load_trained_model

    run_dir = Path(args.run)
    spec, model = load_trained_model(run_dir, args.checkpoint)
    if not isinstance(model, DecoderLM):
        raise UserError(f"{run_dir} is a {spec.task.type} run; sample generates text from decoder runs")
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    try:
        prompt = encode(tokenizer, args.prompt, special_tokens=True).tolist()  # as the runtime's
    except ValueError as e:
        raise UsageError(f"--prompt: {e}") from None
    if not prompt:
        raise UsageError(
            f"--prompt {args.prompt!r} is no token of {run_dir}'s tokenizer (the default is a newline): "
            f"give a text it reads"
        )
    # The options left out, and the bans, are the spec's, as the bundle's (sample ends at no stop
    # token: min_new_tokens and min_length ban none).
    task = spec.task if isinstance(spec.task, CausalLMTask) else CausalLMTask()
    options = {
        name: getattr(task, name) if getattr(args, name) is None else getattr(args, name)
        for name in GENERATION_OPTIONS
    }
    ids = generate(
        model,
        torch.tensor([prompt]),
        emitted=tokenizer.get_vocab_size(),
        seed=args.seed,
        bans=bans(task, tokenizer, (), UsageError),
        **options,
    )
    print(tokenizer.decode(ids[0].tolist()))
    return 0


def _export(args: argparse.Namespace) -> int:
    from tfcompile.console import working
    from tfcompile.destination import check_destination, check_outside
    from tfcompile.export import Source, export_bundle
    from tfcompile.optimize import OptimizeError, check_gate_rule
    from tfcompile.train import load_run_spec

    target = Path(args.target)
    # Each of these flags applies to one kind of target; given with the other, it would do nothing.
    given = {"--set": args.set, "--seed": args.seed, "--checkpoint": args.checkpoint}
    for_other = ("--set", "--seed") if target.is_dir() else ("--checkpoint",)
    if unused := [flag for flag in for_other if given[flag] not in (None, [])]:
        what = (
            "a spec (random weights); {target} is a run, exported with its own spec and checkpoint"
            if target.is_dir()
            else "a run; {target} is a spec, exported with random weights (--seed)"
        )
        verb, them = ("apply", "them") if len(unused) > 1 else ("applies", "it")
        raise UsageError(
            f"{' and '.join(unused)} {verb} to exporting {what.format(target=target)}: leave {them} out"
        )
    if target.is_dir():
        spec, source, name = None, Source(run=target, checkpoint=args.checkpoint or "last"), target.name
        exported_spec = load_run_spec(target)
        export_out = exported_spec.export.out
    else:
        spec = load_spec(target, args.set)
        if spec.sizes_from_data():
            run = spec.train.runs_dir / (spec.train.name or target.stem)
            raise UsageError(untrained(target, spec.sizes_from_data(), run))
        source, name, export_out = Source(seed=args.seed or 0), target.stem, spec.export.out
        exported_spec = spec
    out = Path(args.out) if args.out else export_out or Path("exported") / name
    if target.is_dir():
        check_outside(target, out, what="run")
    plan = _plan(args)
    doing = f"exporting {target} to {out}: tracing each graph, then checking it against PyTorch"
    if plan is None:
        if args.no_gate or args.gate_examples is not None:
            raise UsageError(
                "--no-gate and --gate-examples set the gate of an optimized export: add --fuse or "
                "--quantize, or leave them out"
            )
        with working(doing):
            reports = export_bundle(
                spec, source, out, args.opset, args.precision, args.force, args.cuda_graphs or None
            )
        for name, report in reports.items():
            _print_parity(name, report)
        print(f"bundle: {out}")
        return 0
    gate = _gate_data(args, source.run, plan)
    # What optimizing will refuse, refused before the export it would waste.
    check_gate_rule(plan, exported_spec.task.type, gate is not None)
    if plan.quantize and (args.precision or exported_spec.export.precision) == "fp16":
        raise OptimizeError(
            f"--quantize {plan.quantize} takes an fp32 export (onnxruntime's int8 and int4 kernels take "
            f"float32 activations): export with --precision fp32"
        )
    check_destination(out, args.force)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as staging:
        exported = Path(staging) / out.name
        with working(doing):
            reports = export_bundle(
                spec, source, exported, args.opset, args.precision, cuda_graphs=args.cuda_graphs or None
            )
        for name, report in reports.items():
            _print_parity(name, report)
        _optimize_into(exported, out, plan, gate, args.force, f"the export of {target}")
    return 0


def _optimize(args: argparse.Namespace) -> int:
    plan = _plan(args)
    if plan is None:
        raise UsageError("nothing to do: ask for --fuse, --quantize int8|int4 or --precision fp16")
    _optimize_into(
        Path(args.bundle),
        Path(args.out),
        plan,
        _gate_data(args, args.run and Path(args.run), plan),
        args.force,
    )
    return 0


def _plan(args: argparse.Namespace) -> Plan | None:
    from tfcompile.optimize import Plan

    precision = getattr(args, "optimize_precision", None)
    if not (args.fuse or args.quantize or precision):
        return None
    return Plan(fuse=args.fuse, quantize=args.quantize, precision=precision)


def _gate_data(args: argparse.Namespace, run: Path | None, plan: Plan) -> GateData | None:
    """The held-out data of ``run``; a quantization without a run needs --no-gate."""
    from tfcompile.optimize import GateData

    if args.no_gate and args.gate_examples is not None:
        raise UsageError("--gate-examples sets the gate that --no-gate leaves out: give one of them")
    if args.no_gate:
        return None
    if run is None and args.gate_examples is not None:
        raise UsageError(
            "--gate-examples sets the gate, which reads a run's held-out data, and there is no run: "
            "give optimize --run RUN, or export a run"
        )
    if run is None:
        if plan.quantize:
            raise UsageError(
                "a quantized bundle must pass the accuracy gate on held-out data: pass --run RUN (the "
                "run the bundle was exported from), or --no-gate to write it ungated"
            )
        return None
    return GateData(run, args.gate_examples)


def _optimize_into(
    bundle: Path, out: Path, plan: Plan, gate: GateData | None, force: bool, shown: str | None = None
) -> None:
    """Optimize ``bundle`` into ``out``, saying so (of ``shown``: export's bundle is a staging folder)."""
    from tfcompile.console import working
    from tfcompile.optimize import optimize_bundle

    gated = ", then measuring both bundles on held-out data" if gate is not None and plan.quantize else ""
    doing = f"optimizing {shown or bundle} ({plan.describe()}): transforming each graph, checking it{gated}"
    with working(doing):
        optimization = optimize_bundle(bundle, out, plan, gate, force)
    table = Table(title=f"{out}: {plan.describe()}", title_justify="left")
    for column in ("step", "tool", "operators"):
        table.add_column(column)
    for step in optimization.steps:
        operators = ", ".join(f"{op.split('::')[-1]} {n}" for op, n in step.operators.items()) or "-"
        table.add_row(step.kind, step.tool, operators)
    console = Console(width=max(Console().width, 110))
    console.print(table)
    for name, difference in optimization.parity.items():
        console.print(f"{name}: outputs within {difference:.2e} of the source graph's scale")
    passed = optimization.gate
    if passed is not None:
        console.print(  # one line however wide, as a log reads it
            f"accuracy gate: {passed.metric} {passed.optimized:.4f} against {passed.source:.4f} for the "
            f"source (allowed {passed.allowed}) on {passed.data}",
            soft_wrap=True,
        )
    else:
        console.print("accuracy gate: not run (--no-gate, or no --run)")
    source_size = sum(f.stat().st_size for f in bundle.iterdir() if f.is_file())
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    console.print(f"bundle: {out} ({size / 2**20:.1f} MiB, {size / source_size:.0%} of the source's)")


def _verify(args: argparse.Namespace) -> int:
    from tfcompile.console import working
    from tfcompile.export import verify_bundle

    with working(f"verifying {args.bundle}: rerunning its parity check against PyTorch"):
        reports = verify_bundle(Path(args.bundle), Path(args.run) if args.run else None)
    for name, report in reports.items():
        _print_parity(name, report)
    failed = [name for name, report in reports.items() if not report.passed]
    if failed:
        print(
            f"tfcompile verify: error: parity exceeds the tolerance for {', '.join(failed)}", file=sys.stderr
        )
        return 1
    return 0


def _generate(args: argparse.Namespace) -> int:
    from tfcompile.runtime import LanguageModel, load

    model = load(args.bundle)
    if not isinstance(model, LanguageModel):
        raise UserError(f"{args.bundle} is not a language model: use `tfcompile classify` or `translate`")
    _reads_text(model, args.bundle, "generate", "load(bundle).generate(ids)")
    if args.prompt is None:
        args.prompt = ["\n"]
        if not model.encode(args.prompt)[0].ids:
            raise UsageError(
                f"no --prompt given, and its default, a newline, is no token of {args.bundle}'s "
                f"tokenizer: give --prompt TEXT"
            )
    texts = model.generate_text(
        args.prompt if len(args.prompt) > 1 else args.prompt[0],
        seed=args.seed,
        use_cache=not args.no_cache,
        **{name: getattr(args, name) for name in GENERATION_OPTIONS},  # None: the bundle's default
    )
    print("\n\n".join([texts] if isinstance(texts, str) else texts))
    return 0


def _reads_text(model: Bundle, path: str, command: str, instead: str) -> None:
    """A text command's bundle must hold a tokenizer: one exported from a spec, or from a run
    trained on no data, has none, and reads token ids alone."""
    if model.tokenizer is None:
        raise UserError(
            f"{path} has no tokenizer (its run read no text): `tfcompile {command}` takes text; give it "
            f"token ids with tfcompile.runtime, {instead}"
        )


def _import(args: argparse.Namespace) -> int:
    from tfcompile.console import working
    from tfcompile.hf.importer import import_folder

    with working(f"importing {args.folder}: reading its config and weights, writing the spec and run"):
        result = import_folder(Path(args.folder), args.name, Path(args.specs), Path(args.runs))
    print(
        f"imported {result.architecture} ({result.spec.parameter_count():,} parameters): "
        f"spec {result.spec_path}, run {result.run_dir}"
    )
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    from tfcompile.hf.exporter import export_hf

    architecture = export_hf(Path(args.run), Path(args.out), args.checkpoint, args.force)
    print(f"wrote {args.out}: a {architecture} for transformers' from_pretrained")
    return 0


def _export_triton(args: argparse.Namespace) -> int:
    from tfcompile.handoffs.triton import ModelNameError, export_triton

    try:
        folders = export_triton(
            Path(args.bundle),
            Path(args.out),
            args.max_batch_size,
            args.instances,
            args.max_queue_delay_us,
            args.name,
        )
    except ModelNameError as e:
        if args.name is None:  # the bundle folder's name
            raise
        raise UsageError(f"--name: {e}") from None  # a flag's value: exit 2
    print(f"wrote a Triton model repository at {args.out}: {', '.join(f.name for f in folders)}")
    return 0


def _export_genai(args: argparse.Namespace) -> int:
    from tfcompile.handoffs.genai import export_genai

    folder = export_genai(Path(args.bundle), Path(args.out), args.end_token)
    print(f"wrote an ONNX Runtime GenAI folder at {folder}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tfcompile.serve import Settings, listen, load_models, serve

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(
            f"tfcompile serve: warning: serving on {args.host} without --api-key: anyone who can "
            f"reach this address can use the models",
            file=sys.stderr,
        )
    settings = Settings(
        api_key=args.api_key,
        max_batch=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_mb << 20,
        max_tokens=args.max_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        max_n=args.max_n,
        max_beam=args.max_beam,
        max_image_pixels=args.max_image_pixels,
        max_head_bytes=args.max_head_kb << 10,
        head_timeout_s=args.head_timeout,
        keep_alive_s=args.keep_alive,
    )
    from tfcompile.console import working

    with listen(args.host, args.port) as sock:
        with working(f"loading {len(args.bundles)} bundle(s): checking every file, starting onnxruntime"):
            models = load_models(args.bundles, threads=args.threads)
        serve(models, settings, sock, log_level=args.log_level)
    return 0


def _schema(args: argparse.Namespace) -> int:
    import json

    from tfcompile.manifest import manifest_schema

    print(json.dumps(manifest_schema(), indent=2))
    return 0


def _classify(args: argparse.Namespace) -> int:
    from tfcompile.runtime import Classifier, ImageClassifier, load

    model = load(args.bundle)
    if isinstance(model, ImageClassifier):
        if args.pair is not None:
            raise UsageError("--pair is for sentence pairs; an image classifier takes image files")
        return _print_predictions(
            args.bundle, model.labels, args.texts, model.classify_images(args.texts), "image"
        )
    if not isinstance(model, Classifier):
        raise UserError(f"{args.bundle} is not a classifier: use `tfcompile generate` or `translate`")
    _reads_text(model, args.bundle, "classify", "load(bundle).infer(feed)")
    if args.pair is not None and len(args.pair) != len(args.texts):
        raise UsageError(
            f"--pair takes one second sentence per text: {len(args.texts)} texts, {len(args.pair)}"
        )
    inputs = list(zip(args.texts, args.pair, strict=True)) if args.pair else args.texts
    return _print_predictions(args.bundle, model.labels, args.texts, model.classify(inputs), "text")


def _print_predictions(
    bundle: str, labels: list[str], inputs: list[str], predictions: list[Prediction], kind: str
) -> int:
    table = Table(title=shown(f"{bundle}: {', '.join(labels)}"), title_justify="left")
    table.add_column(kind, overflow="fold")  # a long text or path wraps rather than losing its end
    table.add_column("label", justify="left")
    for label in labels:
        table.add_column(shown(f"p({label})"), justify="right")
    for item, prediction in zip(inputs, predictions, strict=True):
        probabilities = (f"{p:.3f}" for p in prediction.probabilities.values())
        table.add_row(shown(item), shown(prediction.label), *probabilities)
    Console(width=max(Console().width, 100)).print(table)
    return 0


def shown(text: str) -> Text:
    """A user's text or a bundle's label as Rich prints it: its brackets as they are (no markup
    read), each control character escaped (a label's escape sequence would clear or recolour the
    terminal)."""
    return Text("".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text))


def _translate(args: argparse.Namespace) -> int:
    from tfcompile.runtime import Translator, load

    model = load(args.bundle)
    if not isinstance(model, Translator):
        raise UserError(f"{args.bundle} is not a translation bundle: use `tfcompile generate` or `classify`")
    _reads_text(model, args.bundle, "translate", "load(bundle).translate_ids(ids)")
    codes = {"source_language": args.source_language, "target_language": args.target_language}
    stopping = {"true": True, "false": False}.get(args.early_stopping, args.early_stopping)
    scoring = {"length_penalty": args.length_penalty, "early_stopping": stopping}
    for translation in model.translate(args.texts, beam=args.beam, max_len=args.max_len, **codes, **scoring):
        print(translation)
    return 0


def _print_parity(graph: str, report: ParityReport) -> None:
    table = Table(title=f"{graph} graph: onnxruntime vs PyTorch outputs", title_justify="left")
    for column in ("batch", "seq", "padded", "max |diff|", "max |diff| / max |output|"):
        table.add_column(column, justify="right")
    for c in report.cases:
        table.add_row(
            str(c.batch),
            str(c.seq),
            "yes" if c.padded else "no",
            f"{c.max_abs_diff:.2e}",
            f"{c.max_rel_diff:.2e}",
        )
    Console(width=max(Console().width, 100)).print(table)
    verdict = "within" if report.passed else "OUTSIDE"
    measure = "max |diff| / max |output|" if report.relative else "max |diff| / max(1, max |output|)"
    print(f"{measure} {report.measured:.2e}, {verdict} tolerance {report.tolerance:g}")


def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}FLOP"
    return f"{n:.0f} FLOP"


def _add_spec_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    if required:
        parser.add_argument("spec", help="path to a YAML spec")
    else:
        parser.add_argument("spec", nargs="?", help="path to a YAML spec (optional with --resume)")
    _add_set_arg(parser)


def _add_set_arg(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"override a spec field{when}, e.g. --set train.steps=100 (repeatable; values are YAML)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which names the command, choice or flag that a misspelt one most
    resembles, and refuses an argument it does not know with its own command's usage (argparse left
    those to the top level, whose usage lists commands, not the flags of the one given); its help
    gives each flag's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = [str(choice) for choice in action.choices or ()]
        if value not in choices and (close := difflib.get_close_matches(str(value), choices, n=1)):
            listed = ", ".join(map(repr, choices))
            message = f"invalid choice: {value!r}: did you mean {close[0]!r}? (choose from {listed})"
            raise argparse.ArgumentError(action, message)
        super()._check_value(action, value)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            flags = [flag for action in self._actions for flag in action.option_strings]
            named = []
            for extra in extras:
                close = difflib.get_close_matches(extra.partition("=")[0], flags, n=1)
                named.append(
                    f"{extra} (did you mean {close[0]}?)" if extra.startswith("-") and close else extra
                )
            self.error(f"unrecognized arguments: {' '.join(named)}")
        return parsed, extras


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, each flag's ending with its default where it has one that its help does
    not state (a help that says "default" states its own: --api-key's never shows the key)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # A value to state: not None, a switch's False, an empty list or argparse's SUPPRESS (0 is one).
        value = action.default not in (None, [], argparse.SUPPRESS) and action.default is not False
        if action.option_strings and value and "default" not in text:
            return f"{text} (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tfcompile",
        description="Compile a YAML Transformer spec into a PyTorch model, train it, export it to ONNX.",
    )
    parser.add_argument("--version", action="version", version=f"tfcompile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate",
        help="check a spec and report every problem",
        description="Check a spec: ok, or every error with its line.",
    )
    _add_spec_args(validate)
    validate.add_argument(
        "--show", action="store_true", help="print the resolved spec (defaults and preset applied)"
    )
    validate.set_defaults(handler=_validate)

    summary = commands.add_parser(
        "summary",
        help="table of modules, parameters, shapes and FLOPs",
        description="Each module with its parameter count and output shape, the total, and FLOPs per token.",
    )
    _add_spec_args(summary)
    summary.set_defaults(handler=_summary)

    train = commands.add_parser(
        "train",
        help="train a model from a spec (or resume a run)",
        description="Train a spec's model, writing runs/NAME/: the resolved spec, tokenizer.json, "
        "metrics.jsonl and checkpoints. Ctrl-C finishes the current step, saves and stops. Under "
        "`torchrun --nproc_per_node N -m tfcompile train SPEC`, N processes share each batch.",
    )
    _add_spec_args(train, required=False)
    train.add_argument("--resume", metavar="RUN", help="continue RUN from its last checkpoint")
    train.add_argument(
        "--no-compile", action="store_true", help="do not torch.compile (on by default on CUDA)"
    )
    train.set_defaults(handler=_train)

    sweep = commands.add_parser(
        "sweep",
        help="train a study's trials: variants x seeds under one budget",
        description="Train every trial of a study file (each variant at each seed, with the same data, "
        "evaluation batches and budget) as runs under runs_dir/STUDY/. Run it again to resume: "
        "finished trials are skipped, interrupted ones continue from their last checkpoint.",
    )
    sweep.add_argument("study", help="a study YAML file")
    sweep.add_argument(
        "--launcher",
        choices=["local", "ray"],
        default="local",
        help="local: one trial after another here (default); ray: each trial a Ray task (tfcompile[ray])",
    )
    sweep.add_argument(
        "--address", help="the Ray cluster (e.g. ray://host:10001; default: start a local one)"
    )
    sweep.set_defaults(handler=_sweep)

    compare = commands.add_parser(
        "compare",
        help="report.md, results.csv and plots comparing runs or studies",
        description="Compare the variants of studies (or runs, grouped by name without -seedN): a table "
        "of parameters, FLOPs per token, final and best validation loss (mean ± std over seeds), "
        "tokens/s, peak memory and wall time, results.csv, and validation-loss plots.",
    )
    compare.add_argument("sources", nargs="*", metavar="RUN_OR_STUDY", help="runs, study folders or files")
    compare.add_argument(
        "--out", metavar="DIR", help="where to write (default: report; with --from-csv: the CSV's folder)"
    )
    compare.add_argument(
        "--from-csv", metavar="CSV", help="rebuild report.md from a results.csv that compare wrote"
    )
    compare.set_defaults(handler=_compare)

    runs = commands.add_parser(
        "runs",
        help="list runs: steps, best validation metric, state",
        description="Every run under FOLDER (default: runs): family, task, parameters, steps done of "
        "planned, best validation metric, and state (running, finished, interrupted or failed).",
    )
    runs.add_argument("folder", nargs="?", default="runs", help="a runs folder, a study's, or a run")
    runs.set_defaults(handler=_runs)

    plot = commands.add_parser(
        "plot", help="draw runs' curves to a PNG", description="Draw the runs' curves of a metric to a PNG."
    )
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    plot.add_argument(
        "--out", required=True, metavar="PNG", help="the image to write (.png, .pdf, .svg, ...)"
    )
    plot.add_argument("--metric", default="val_loss", help="a metrics.jsonl key (default: val_loss)")
    plot.add_argument("--x", choices=["step", "time"], default="step", help="steps or wall time")
    plot.add_argument("--force", action="store_true", help="replace the file at --out if there is one")
    plot.set_defaults(handler=_plot)

    sample = commands.add_parser(
        "sample",
        help="generate text from a trained run",
        description="Generate text from a run's checkpoint.",
    )
    sample.add_argument("run", help="a run folder written by `tfcompile train`")
    _add_sampling_args(sample)
    sample.add_argument("--checkpoint", choices=["last", "best"], default="last", help="which checkpoint")
    sample.set_defaults(handler=_sample)

    export = commands.add_parser(
        "export",
        help="export a run (or a spec) to an ONNX bundle, checked against PyTorch",
        description="Write a bundle (model.onnx, tokenizer.json, spec.yaml, manifest.json) and prove "
        "that onnxruntime gives PyTorch's logits at several shapes.",
    )
    export.add_argument("target", metavar="RUN_OR_SPEC", help="a run folder, or a spec (random weights)")
    export.add_argument("--out", help="bundle folder (default: export.out, else exported/NAME)")
    export.add_argument("--opset", type=_positive_int, help="ONNX opset (default: export.opset)")
    export.add_argument(
        "--precision", choices=["fp32", "fp16"], help="graph precision (default: export.precision)"
    )
    export.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decoders: also write the decode step at fixed shapes, which the runtime replays as CUDA "
        "graphs on a GPU (default: export.cuda_graphs)",
    )
    export.add_argument(
        "--checkpoint", choices=["last", "best"], help="for a run: which checkpoint (default: last)"
    )
    export.add_argument("--seed", type=_seed, help="for a spec: the seed of the random weights (default: 0)")
    export.add_argument("--force", action="store_true", help="replace the bundle at --out if there is one")
    _add_optimize_args(export, precision=False)
    _add_set_arg(export, when=" (exporting a spec)")
    export.set_defaults(handler=_export)

    optimize = commands.add_parser(
        "optimize",
        help="write a faster bundle: fused, int8 or int4 quantized, or fp16",
        description="Write a new bundle from BUNDLE (never changed): onnxruntime's fused operators "
        "(--fuse), dynamic int8 or 4-bit weight-only quantization (--quantize), or fp16 graphs. Fused and "
        "fp16 graphs must keep parity with the source's; a quantized bundle must pass its task's "
        "accuracy gate on the held-out data of the run it came from (--run). The manifest records "
        "every step, the operators it introduced, the parity and the gate.",
    )
    optimize.add_argument("bundle", help="a bundle folder written by `tfcompile export`")
    optimize.add_argument("--out", required=True, help="the new bundle's folder")
    optimize.add_argument("--run", help="the run the bundle was exported from, whose held-out data gates it")
    optimize.add_argument("--force", action="store_true", help="replace the bundle at --out if there is one")
    _add_optimize_args(optimize, precision=True)
    optimize.set_defaults(handler=_optimize)

    verify = commands.add_parser(
        "verify",
        help="rerun a bundle's parity check",
        description="Rerun the parity check from a bundle and the checkpoint it came from.",
    )
    verify.add_argument("bundle", help="a bundle folder written by `tfcompile export`")
    verify.add_argument(
        "--run",
        help="the run the bundle was exported from (needed for a run's bundle: tfcompile opens nothing "
        "outside a bundle on its manifest's word)",
    )
    verify.set_defaults(handler=_verify)

    generate = commands.add_parser(
        "generate",
        help="generate text from a bundle with onnxruntime alone",
        description="Generate text from an exported bundle with onnxruntime (no torch), using the KV cache.",
    )
    generate.add_argument("bundle", help="a bundle folder written by `tfcompile export`")
    _add_sampling_args(generate, batch=True)
    generate.add_argument("--no-cache", action="store_true", help="rerun the full graph every step")
    generate.set_defaults(handler=_generate)

    hf_import = commands.add_parser(
        "import",
        help="a Hugging Face model folder -> a spec and a run",
        description="Read a local save_pretrained folder (config.json, safetensors or pytorch_model.bin, "
        "tokenizer.json; nothing is downloaded) and write specs/NAME.yaml and runs/NAME with its weights "
        "and tokenizer, for summary, train (train.init_from), export and serve.",
    )
    hf_import.add_argument("folder", metavar="HF_DIR", help="a folder written by save_pretrained")
    hf_import.add_argument("--name", required=True, type=_run_name, help="the spec's and the run's name")
    hf_import.add_argument("--specs", default="specs", help="folder of the spec (default: specs)")
    hf_import.add_argument("--runs", default="runs", help="folder of the run (default: runs)")
    hf_import.set_defaults(handler=_import)

    export_hf = commands.add_parser(
        "export-hf",
        help="a run -> a folder transformers loads",
        description="Write a run as a Hugging Face folder (config.json, model.safetensors, tokenizer) "
        "that transformers' AutoModel classes load with no tfcompile code.",
    )
    export_hf.add_argument("run", help="a run folder")
    export_hf.add_argument("--out", required=True, help="the folder to write")
    export_hf.add_argument("--checkpoint", choices=["last", "best"], default="best", help="which checkpoint")
    export_hf.add_argument("--force", action="store_true", help="replace the model folder at --out")
    export_hf.set_defaults(handler=_export_hf)

    schema = commands.add_parser(
        "schema",
        help="print a published JSON Schema (the bundle manifest's)",
        description="Print the JSON Schema of a bundle's manifest.json (format 2), the contract a "
        "client in any language can validate a bundle against; schemas/ holds the same file.",
    )
    schema.add_argument("what", choices=["manifest"], help="which schema")
    schema.set_defaults(handler=_schema)

    classify = commands.add_parser(
        "classify",
        help="label sentences or images with a classifier bundle and onnxruntime alone",
        description="Label texts (or sentence pairs, with --pair) with an exported text classifier, "
        "or image files with an exported ViT.",
    )
    classify.add_argument("bundle", help="a classifier bundle folder written by `tfcompile export`")
    classify.add_argument("texts", nargs="+", metavar="INPUT", help="texts, or image files for a ViT")
    classify.add_argument("--pair", nargs="+", metavar="SECOND", help="the second sentence for each TEXT")
    classify.set_defaults(handler=_classify)

    translate = commands.add_parser(
        "translate",
        help="translate sentences with an encoder-decoder bundle and onnxruntime alone",
        description="Translate texts with an exported encoder-decoder bundle: greedy or beam search.",
    )
    translate.add_argument("bundle", help="a translation bundle folder written by `tfcompile export`")
    translate.add_argument("texts", nargs="+", metavar="TEXT", help="sentences in the source language")
    translate.add_argument(
        "--beam", type=_int_from(1, MAX_BEAM), default=None, help=f"1 to {MAX_BEAM}; default: the task's beam"
    )
    translate.add_argument("--max-len", type=_positive_int, default=None, help="most tokens per translation")
    translate.add_argument(
        "--length-penalty",
        type=_number_from(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY, "a length penalty"),
        default=None,
        help="beam search's length penalty; default: the task's",
    )
    translate.add_argument(
        "--early-stopping",
        choices=["true", "false", "never"],
        default=None,
        help="transformers' beam search's early_stopping; default: the task's",
    )
    translate.add_argument(
        "--source-language", default=None, help="a multilingual translator's source code (NLLB's deu_Latn)"
    )
    translate.add_argument(
        "--target-language",
        default=None,
        help="the code to translate into (NLLB's fra_Latn); default: the spec's",
    )
    translate.set_defaults(handler=_translate)

    triton = commands.add_parser(
        "export-triton",
        help="write a bundle as a Triton Inference Server model repository",
        description="Write REPO/NAME-GRAPH/config.pbtxt and 1/model.onnx for each graph of a bundle "
        "(Triton's onnxruntime_onnx backend, dynamic batching); a decoder's generation loop is the "
        "client's, over the stateless step model (tfcompile/handoffs/triton.py says how).",
    )
    triton.add_argument("bundle", help="a bundle folder written by `tfcompile export`")
    triton.add_argument("--out", required=True, metavar="REPO", help="a new or empty folder")
    triton.add_argument(
        "--max-batch-size", type=_non_negative_int, default=8, help="0 turns Triton's batching off"
    )
    triton.add_argument("--instances", type=_positive_int, default=1, help="instances of each model")
    triton.add_argument(
        "--max-queue-delay-us", type=_non_negative_int, default=100, help="dynamic batcher's wait"
    )
    triton.add_argument("--name", help="the models' name prefix (default: the bundle folder's name)")
    triton.set_defaults(handler=_export_triton)

    genai = commands.add_parser(
        "export-genai",
        help="write a decoder bundle as a folder ONNX Runtime GenAI loads",
        description="Write genai_config.json, the decoder step graph and a tokenizer onnxruntime-genai "
        "reads; greedy search there gives the runtime's tokens.",
    )
    genai.add_argument("bundle", help="a decoder bundle folder written by `tfcompile export`")
    genai.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    genai.add_argument(
        "--end-token", help="for a vocabulary without special tokens: the token genai ends and pads with"
    )
    genai.set_defaults(handler=_export_genai)

    serve = commands.add_parser(
        "serve",
        help="serve bundles over HTTP (OpenAI completions, KServe v2, task routes)",
        description="Serve bundles by name over HTTP: OpenAI-compatible /v1/completions for "
        "decoders, the Open Inference Protocol (/v2) for every bundle, /v1/classify, /v1/translate "
        "and /v1/classify-image, /metrics for Prometheus. Requests are batched dynamically. "
        "SIGTERM drains: new requests get 503, those in flight finish. Needs tfcompile[serve].",
    )
    serve.add_argument("bundles", nargs="+", metavar="BUNDLE", help="a bundle folder, or NAME=FOLDER")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=_port, default=8000, help="0 to 65535 (0: any free port)")
    serve.add_argument(
        "--api-key",
        type=_api_key,
        default=os.environ.get("TFCOMPILE_API_KEY"),
        help="require Authorization: Bearer KEY on every route but health and metrics "
        "(default: the TFCOMPILE_API_KEY environment variable)",
    )
    serve.add_argument(
        "--max-batch-size", type=_positive_int, default=32, help="rows per batch and per request"
    )
    serve.add_argument(
        "--max-wait-ms",
        type=_number_from(0, 60_000, "milliseconds"),
        default=5.0,
        help="how long a batch waits for requests the server has read and not yet queued, 0 to 60,000 "
        "(default 5; a lone request never waits; 0: a batch takes what is queued)",
    )
    serve.add_argument(
        "--max-queue", type=_positive_int, default=256, help="requests waiting per model; more get 503"
    )
    serve.add_argument(
        "--max-body-mb",
        type=_int_from(1, 4096),
        default=16,
        help="largest request body, 1 to 4,096 (default 16; 413 past it)",
    )
    serve.add_argument(
        "--max-tokens", type=_positive_int, default=1024, help="largest max_tokens a request may ask"
    )
    serve.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        default=None,
        help="longest prompt (default: the model's context)",
    )
    serve.add_argument("--max-n", type=_positive_int, default=16, help="completions per prompt (n)")
    serve.add_argument(
        "--max-beam", type=_int_from(1, MAX_BEAM), default=8, help=f"widest translation beam, 1 to {MAX_BEAM}"
    )
    serve.add_argument(
        "--max-image-pixels",
        type=_int_from(1, 1 << 32),
        default=1 << 26,
        help="pixels in all the images of a request, counted from their headers before decoding, "
        "1 to 2^32 (default 67,108,864: 8,192 x 8,192; 400 past it)",
    )
    serve.add_argument(
        "--max-head-kb",
        type=_int_from(1, 1024),
        default=64,
        help="a request's line and headers, 1 to 1,024 (default 64; 431 past it)",
    )
    serve.add_argument(
        "--head-timeout",
        type=_number_from(0.1, 3600, "seconds"),
        default=20.0,
        help="seconds from a request's first byte to its headers' end, and that a body may go without "
        "a byte, 0.1 to 3,600 (default 20; 408 past it)",
    )
    serve.add_argument(
        "--keep-alive",
        type=_int_from(1, 3600),
        default=5,
        help="seconds an idle connection is kept for its next request, 1 to 3,600 (default 5); behind "
        "a load balancer, more than the balancer's idle timeout",
    )
    serve.add_argument(
        "--threads",
        type=_threads,
        default=None,
        help="onnxruntime threads per model (default: one per core; half the cores for step graphs)",
    )
    serve.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="the server log's"
    )
    serve.set_defaults(handler=_serve)
    return parser


def _add_optimize_args(parser: argparse.ArgumentParser, precision: bool) -> None:
    parser.add_argument(
        "--fuse", action="store_true", help="onnxruntime's fused attention and norm operators"
    )
    parser.add_argument(
        "--quantize",
        choices=["int8", "int4"],
        help="int8: dynamic int8 (weights per channel); int4: 4-bit weight-only MatMulNBits (decoders)",
    )
    if precision:
        parser.add_argument("--precision", dest="optimize_precision", choices=["fp16"], help="fp16 graphs")
    parser.add_argument("--no-gate", action="store_true", help="quantize without the accuracy gate")
    parser.add_argument(
        "--gate-examples", type=_positive_int, help="held-out examples the gate reads (default: the task's)"
    )


def _add_sampling_args(parser: argparse.ArgumentParser, batch: bool = False) -> None:
    if batch:
        parser.add_argument(
            "--prompt",
            action="append",
            help="text to continue (default: a newline); repeat it to generate a batch",
        )
        parser.set_defaults(prompt=None)
    else:
        parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    # Each option left out is the spec's (sample) or the bundle's (generate) default.
    parser.add_argument(
        "--max-new-tokens", type=_positive_int, help="tokens to generate (default: the spec's or bundle's)"
    )
    parser.add_argument(
        "--temperature", type=_non_negative_float, help="0 is greedy (default: the spec's or bundle's)"
    )
    parser.add_argument(
        "--top-k",
        type=_positive_int,
        help="sample among the k likeliest tokens (default: the spec's or bundle's)",
    )
    parser.add_argument(
        "--top-p",
        type=_probability,
        help="sample among the likeliest tokens whose probabilities add up to p (default: the spec's or "
        "bundle's)",
    )
    parser.add_argument(
        "--min-p",
        type=_share,
        help="sample among the tokens at least min_p times as likely as the likeliest (default: the "
        "spec's or bundle's)",
    )
    parser.add_argument("--seed", type=_seed, default=0, help="the sampling's seed")
    parser.add_argument(
        "--repetition-penalty",
        type=_repetition_penalty,
        help="divide a repeated token's positive logit by it, multiply a negative one (default: the "
        "spec's or bundle's; 1: none)",
    )


def _int(text: str, expected: str) -> int:
    """``text`` as a whole number; a word is refused as a number out of range is, with what was
    expected (argparse's own message would name this module's function)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, found {text}") from None


def _float(text: str, expected: str) -> float:
    """``text`` as a number, refused as ``_int`` refuses a word."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, found {text}") from None


def _run_name(text: str) -> str:
    """A run's name (import --name), refused before any work as a flag's value: exit 2."""
    try:
        check_run_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _positive_int(text: str) -> int:
    value = _int(text, "a positive integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text}")
    return value


def _int_from(low: int, high: int) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``: a server limit past which it would bound nothing
    (tfcompile.serve.app.BOUNDS holds the same ranges in the server's units)."""

    def parse(text: str) -> int:
        value = _int(text, f"an integer from {low:,} to {high:,}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low:,} to {high:,}, found {text}")
        return value

    return parse


def _number_from(low: float, high: float, unit: str) -> Callable[[str], float]:
    """A number of ``unit`` from ``low`` to ``high``, fractions allowed: a server limit, as
    ``_int_from``'s (tfcompile.serve.app.BOUNDS holds the same ranges in the server's units), or a
    length penalty (the manifest's range)."""

    def parse(text: str) -> float:
        value = _float(text, f"{unit} from {low:g} to {high:,g}")
        if not low <= value <= high:  # NaN too
            raise argparse.ArgumentTypeError(f"expected {unit} from {low:g} to {high:,g}, found {text}")
        return value

    return parse


def _non_negative_int(text: str) -> int:
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = _float(text, "a finite number >= 0")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, found {text}")
    return value


def _seed(text: str) -> int:
    """A seed as the spec's train.seed and the runtime take: a whole number from 0 to 2^63 - 1."""
    value = _int(text, "a seed from 0 to 2^63 - 1")
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to 2^63 - 1, found {text}")
    return value


def _threads(text: str) -> int:
    """Threads as the spec's train.threads takes them: 1 to MAX_THREADS, whatever the machine."""
    value = _int(text, f"threads from 1 to {MAX_THREADS:,}")
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected threads from 1 to {MAX_THREADS:,}, found {text}")
    return value


def _api_key(text: str) -> str:
    """A Bearer key as an Authorization header carries it: visible ASCII, no spaces (any other
    character could never match what a client sends), and not empty (which would serve without)."""
    if not text:
        raise argparse.ArgumentTypeError(
            "expected a key, found an empty one (from --api-key or TFCOMPILE_API_KEY): give a key, or "
            "leave both unset to serve without one"
        )
    odd = sorted({c for c in text if not "!" <= c <= "~"})
    if odd:
        raise argparse.ArgumentTypeError(
            f"expected visible ASCII without spaces (a header carries the key as it is), found "
            f"{odd[:5]!r} (in --api-key, or in TFCOMPILE_API_KEY when the flag is not given)"
        )
    return text


def _port(text: str) -> int:
    value = _int(text, "a TCP port from 0 to 65535")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 0 to 65535, found {text}")
    return value


def _probability(text: str) -> float:
    value = _float(text, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], found {text}")
    return value


def _share(text: str) -> float:
    value = _float(text, "a number in [0, 1]")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], found {text}")
    return value


def _repetition_penalty(text: str) -> float:
    low, high = REPETITION_PENALTIES
    value = _float(text, f"a number in [{low:g}, {high:g}]")
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {high:g}], found {text}")
    return value


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its end;
    where poll is missing, as on Windows, no)."""
    if not hasattr(select, "poll"):
        return False
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # stdout closed or replaced by an object without a file
        return False


class UsageError(Exception):
    """A command-line mistake; the message says what to do instead."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a container's stop), raised where Ctrl-C raises KeyboardInterrupt:
    what a command removes when interrupted (its staging folders) it removes when stopped."""


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM during a command (handling() sets it for the command's length): Terminated, where
    the default action would end the process without any cleanup; a second SIGTERM ends it at
    once. Training and serving set their own handlers while they run."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path the output's encoding cannot spell (ASCII)
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    # A warning meant for the user (a skipped damaged checkpoint) is one line, like an error.
    show = warnings.showwarning

    def show_one_line(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        if issubclass(category, UserWarning) and type(message).__module__.startswith("tfcompile"):
            print(f"tfcompile {args.command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kw)

    warnings.showwarning = show_one_line
    # FSDP warns on every rank that the decoder's logits (a Linear over (B, T, d)) are a view, on
    # which an in-place op would skip its hooks; no loss writes into them.
    warnings.filterwarnings("ignore", r"FSDP2-wrapped module \(\w+\) returned a view tensor", UserWarning)
    try:
        check_arguments(args.command, vars(args))  # a path of the wrong kind: say what would work
        with handling([signal.SIGTERM], _terminate):
            return handler(args)
    except SpecError as e:
        print(e, file=sys.stderr)
        return EXIT_SPEC_ERROR
    except Terminated:
        print(f"tfcompile {args.command}: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"tfcompile {args.command}: interrupted", file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"tfcompile {args.command}: error: {e}", file=sys.stderr)
        return EXIT_SPEC_ERROR
    except UserError as e:
        print(f"tfcompile {args.command}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError as e:
        if not _stdout_gone():  # another pipe than stdout's (a socket, a worker's): a failure
            print(f"tfcompile {args.command}: error: {_os_error(e)}", file=sys.stderr)
            return 1
        # The reader of stdout left (`| head`): it read all it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE  # as a shell reports a writer stopped by a closed pipe
    except OSError as e:  # a path given that cannot be read or written, a full disk, a port in use
        print(f"tfcompile {args.command}: error: {_os_error(e)}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = show


def _os_error(e: OSError) -> str:
    """'PATH: No space left on device' (the paths the call named, then the system's reason)."""
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    reason = e.strerror or str(e) or type(e).__name__
    return ": ".join([" -> ".join(paths), reason] if paths else [reason])
