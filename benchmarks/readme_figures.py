"""Regenerate the README's tables of measured figures from the results files that recorded them.

A generated region of the README reads

    <!-- figures: benchmarks/results/NAME.md -->
    ...the file's tables, and the command, commit and date that made them...
    <!-- /figures -->

and `<!-- figures: train_throughput -->` stands for every `train_throughput-*.md`, merged into one
table. `python benchmarks/readme_figures.py` rewrites every region from its files;
`--check` only reports the regions that differ (exit 1), which `tests/test_readme_figures.py`
does in the suite: a README figure that no results file holds, or that disagrees with one, fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REGION = re.compile(r"(<!-- figures: (?P<source>[^>]+?) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


def header(text: str) -> dict[str, str]:
    """A results file's header lines (command, commit, device, date) by name."""
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(": ")
        fields[name] = value
    return fields


def tables(text: str) -> list[str]:
    """The Markdown tables of a results file, each as its lines."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    return found


def provenance(path: Path) -> str:
    fields = header(path.read_text())
    made = ", ".join(f"{key} {fields.get(key, 'not recorded')}" for key in ("commit", "date"))
    return f"`{path.relative_to(ROOT)}`: {fields.get('command', 'command not recorded')}, {made}"


def verbatim(source: str) -> str:
    """A results file's tables as they are, and where they came from."""
    path = ROOT / source
    return "\n\n".join([*tables(path.read_text()), f"(from {provenance(path)})"])


def train_throughput(source: str) -> str:
    """Every training-throughput file as one row: spec, device, mode, batch, tokens/s against the
    baseline measured in the same run."""
    rows = []
    for path in sorted(RESULTS.glob("train_throughput-*.md"), key=_throughput_order):
        text = path.read_text()
        # The settings: on the header's device line (older files) or the body's first line.
        parts = "; ".join([header(text)["device"], text.split("\n\n")[1].splitlines()[0]]).split("; ")
        mode = ", ".join(p for p in parts if p in ("eager", "torch.compile", "bf16"))
        batch = next(p for p in parts if p.startswith("batch ")).removeprefix("batch ").replace(" tokens", "")
        cells = {
            row.split("|")[1].strip(): [c.strip() for c in row.split("|")[2:-1]]
            for row in tables(text)[0].splitlines()[2:]
        }
        baseline = cells.pop("nanoGPT-style baseline")
        spec = path.name.removeprefix("train_throughput-").split("-b")[0]
        for name, ours in cells.items():  # "tfcompile", or "tfcompile, FIELD=VALUE" per variant
            variant = name.removeprefix("tfcompile").removeprefix(", ")
            mfu = len(ours) == 3  # tokens/s, MFU, ratio (GPU) or tokens/s, ratio (CPU)
            rows.append(
                f"| {spec} | {parts[0]} | {', '.join(filter(None, [mode, variant]))} | {batch} | "
                + (f"{ours[0]} (MFU {ours[1]})" if mfu else ours[0])
                + " | "
                + (f"{baseline[0]} ({baseline[1]})" if mfu else baseline[0])
                + f" | {ours[-1]} |"
            )
    return "\n".join(
        [
            "| spec | device | mode | batch | tfcompile tokens/s | baseline tokens/s | ratio |",
            "| --- | --- | --- | --- | ---: | ---: | ---: |",
            *rows,
            "",
            "(from benchmarks/results/train_throughput-*.md, whose headers say which command, commit and "
            "date made each row)",
        ]
    )


def _throughput_order(path: Path) -> tuple[bool, bool, int]:
    """CPU before GPU, the char model before GPT-2, smaller batches first."""
    batch = int(re.search(r"-b(\d+)-", path.name)[1])  # type: ignore[index]
    return "nvidia" in path.name, "gpt2" in path.name, batch


def whole(source: str) -> str:
    """A results file's whole body (a training run's table and the text it wrote), and where it
    came from."""
    path = ROOT / source
    return path.read_text().split("\n\n", 1)[1].rstrip("\n") + f"\n\n(from {provenance(path)})"


def best_of_runs(source: str) -> str:
    """Training runs matching the pattern ``source`` (``train_run-...*...``) as one table: the spec,
    its overrides (the results file's --tag), the best validation loss and the step it came at."""
    rows = []
    for path in sorted(RESULTS.glob(f"{source}.md")):
        text = path.read_text()
        command = header(text)["command"].strip("`").split()
        spec = Path(next(a for a in command if a.endswith(".yaml"))).stem
        tag = command[command.index("--tag") + 1] if "--tag" in command else ""
        measures = {
            row.split("|")[1].strip(): row.split("|")[2].strip() for row in tables(text)[0].splitlines()[2:]
        }
        steps, _, losses = (row.split("|")[2:-1] for row in tables(text)[1].splitlines())
        best = min(range(len(losses)), key=lambda i: float(losses[i]))
        rows.append(
            f"| {spec} | {tag} | {measures['best validation loss']} | {steps[best].strip()} | "
            f"{measures['wall time (the whole `Trainer.train()`)']} |"
        )
    return "\n".join(
        [
            "| spec | run (--tag) | best validation loss | at step | wall time |",
            "| --- | --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"(from benchmarks/results/{source}.md, whose headers say which command, commit and date "
            "made each row)",
        ]
    )


# By the source's name: the merged throughput table, several training runs' best losses (a
# pattern), a training run's whole record, else the tables.
RENDERERS: dict[str, Callable[[str], str]] = {
    "train_throughput": train_throughput,
    "train_run-*": best_of_runs,
    "train_run-": whole,
}


def render(source: str) -> str:
    name = Path(source).name
    kind = "train_run-*" if name.startswith("train_run-") and "*" in name else name
    return next((r for key, r in RENDERERS.items() if kind.startswith(key)), verbatim)(source)


def regenerate(readme: str) -> str:
    """The README with every figures region rendered from its results files (a region whose file
    is missing is left as it is; ``stale`` reports it)."""

    def rendered(m: re.Match[str]) -> str:
        try:
            return f"{m[1]}{render(m['source'])}\n{m[4]}"
        except FileNotFoundError:
            return m[0]

    return REGION.sub(rendered, readme)


def stale(readme: str) -> list[str]:
    """The sources of the regions whose text differs from their results files, or whose file is
    missing."""
    differing = []
    for m in REGION.finditer(readme):
        try:
            current = m["body"] == render(m["source"]) + "\n"
        except FileNotFoundError:
            current = False
        if not current:
            differing.append(m["source"])
    return differing


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="report stale regions, change nothing")
    args = parser.parse_args()
    path = ROOT / "README.md"
    readme = path.read_text()
    if args.check:
        differing = stale(readme)
        for source in differing:
            print(f"README.md: the figures from {source} differ from the file", file=sys.stderr)
        return 1 if differing else 0
    path.write_text(regenerate(readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
