"""The ``tfcompile`` command: thin subcommands over the package's modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from tfcompile import __version__
from tfcompile.spec import SpecError, SpecIssue, dump_spec, load_spec

EXIT_SPEC_ERROR = 2


def _validate(args: argparse.Namespace) -> int:
    from tfcompile.summary import summarize

    spec = load_spec(args.spec, args.set)
    if args.show:
        print(dump_spec(spec), end="")
    m = spec.model
    params = f"{summarize(m).total_params:,} parameters" if m.vocab_size else "vocab_size from the tokenizer"
    print(f"{args.spec}: ok ({m.family}, {m.n_layers} layers, d_model {m.d_model}, {params})")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from tfcompile.summary import summarize

    spec = load_spec(args.spec, args.set)
    if spec.model.vocab_size is None:
        raise SpecError(
            args.spec,
            [
                SpecIssue(
                    "model.vocab_size", "a summary needs the vocabulary size", "pass --set model.vocab_size=N"
                )
            ],
        )
    s = summarize(spec.model)
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
    console.print(f"input: (batch 1, seq {s.context}) token ids")
    console.print(
        f"FLOPs per token at context {s.context}: forward {_si(s.forward_flops_per_token)}, "
        f"training (forward + backward) {_si(s.train_flops_per_token)}"
    )
    return 0


def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}FLOP"
    return f"{n:.0f} FLOP"


def _add_spec_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="path to a YAML spec")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field, e.g. --set train.steps=100 (repeatable; values are YAML)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    validate.set_defaults(run=_validate)

    summary = commands.add_parser(
        "summary",
        help="table of modules, parameters, shapes and FLOPs",
        description="Each module with its parameter count and output shape, the total, and FLOPs per token.",
    )
    _add_spec_args(summary)
    summary.set_defaults(run=_summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except SpecError as e:
        print(e, file=sys.stderr)
        return EXIT_SPEC_ERROR
