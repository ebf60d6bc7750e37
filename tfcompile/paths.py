"""What a path on the command line is (a spec, a study, a run, a bundle, a Hugging Face folder, or
nothing), and, when a command is given the wrong kind, what it got and the command that would work.

Every subcommand that takes a path asks ``expect(command, path, accepted)`` before it opens
anything, so a run handed to ``generate`` or a bundle handed to ``sample`` is one line that names
the right command, never an error from deep inside a loader. No torch here: recognising a path
reads at most the top-level keys of a YAML file.
"""

from __future__ import annotations

import enum
import errno
import re
import stat
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.files import TOKENIZER_FILE
from tfcompile.manifest import MANIFEST, SPEC_FILE

HF_CONFIG = "config.json"  # what save_pretrained writes first (tfcompile.hf.folder.CONFIG)
# What only a run folder holds, beside its spec.yaml.
RUN_MARKS = ("checkpoints", "metrics.jsonl", TOKENIZER_FILE, "import.json")
# Top-level keys only a study file has (a spec has `model:` and `preset:`).
STUDY_KEYS = {"base", "variants", "axes", "seeds", "budget"}
TOP_LEVEL_KEY = re.compile(r"^([A-Za-z_][\w-]*)[ \t]*:", re.MULTILINE)
SCAN_BYTES = 1 << 20  # a spec's size limit
YAML_SUFFIXES = (".yaml", ".yml")  # how a spec or a study is recognised by its name
REGULAR_FILE, FOLDER = "a regular file", "a folder"
# What is at a path, by stat's test for it.
FILE_TYPES = (
    (stat.S_ISREG, REGULAR_FILE),
    (stat.S_ISDIR, FOLDER),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Kind(enum.Enum):
    SPEC = "a spec"
    STUDY = "a study file"
    RUN = "a run folder"
    BUNDLE = "a bundle"
    HF = "a Hugging Face model folder"
    MISSING = "nothing (no such file or folder)"
    FOLDER = "a folder that is not a tfcompile bundle, run or Hugging Face model"
    FILE = "a file that is not a YAML spec or study"


class PathKindError(UserError):
    """A command was given a path of the wrong kind; the message names the command that takes it."""


def kind_of(path: str | Path) -> Kind:
    """What ``path`` is, from the files it holds (folders) or its name and top-level keys (files)."""
    path = Path(path)
    if not path.exists():
        return Kind.MISSING
    if path.is_dir():
        if (path / MANIFEST).is_file():
            return Kind.BUNDLE
        if (path / SPEC_FILE).is_file() and any((path / mark).exists() for mark in RUN_MARKS):
            return Kind.RUN
        if (path / HF_CONFIG).is_file():
            return Kind.HF
        return Kind.FOLDER
    if path.suffix not in YAML_SUFFIXES or file_type(path) != REGULAR_FILE:
        return Kind.FILE
    keys = top_level_keys(path)
    return Kind.STUDY if keys & STUDY_KEYS and "model" not in keys else Kind.SPEC


LINK_LOOP = "a loop of symbolic links"


def file_type(path: str | Path) -> str:
    """What is at ``path`` (its links followed): REGULAR_FILE, FOLDER, "a named pipe (FIFO)", "a
    character device" (/dev/null), "a block device", "a socket", LINK_LOOP, or
    "nothing". Only a regular file is opened: reading any other would block or never end."""
    try:
        mode = Path(path).stat().st_mode
    except OSError as e:
        return LINK_LOOP if e.errno == errno.ELOOP else "nothing"
    return next((name for test, name in FILE_TYPES if test(mode)), "a special file")


def top_level_keys(path: Path) -> set[str]:
    """The names at the start of a line followed by a colon: a block mapping's top-level keys,
    read without parsing (any file, however malformed, is recognised at once; the spec loader
    then reports where it is wrong). Only a regular file is opened: a FIFO would block."""
    if not path.is_file():
        return set()
    try:
        with open(path, "rb") as f:
            head = f.read(SCAN_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return set()
    return set(TOP_LEVEL_KEY.findall(head))


# What to do with each kind of path, by what the command that was given it meant to do. "*" is
# every other command; {path} is the path as given.
ADVICE: dict[Kind, dict[str, str]] = {
    Kind.SPEC: {
        "sample": "train it first (`tfcompile train {path}`), then `tfcompile sample runs/NAME`",
        "train": "start a new run with `tfcompile train {path}`; --resume takes the run folder it wrote",
        "export": "export a trained run (`tfcompile train {path}`, then `tfcompile export runs/NAME`)",
        "compare": "compare the runs trained from it (runs/NAME), or sweep a study with `base: {path}` "
        "(`tfcompile sweep STUDY`) and compare that",
        "sweep": "a study names it as its `base:` with the variants and seeds to train: "
        "`tfcompile sweep STUDY`; `tfcompile train {path}` trains it alone",
        "plot": "train it with `tfcompile train {path}`, then plot the run it writes (runs/NAME)",
        "export-hf": "train it with `tfcompile train {path}`, then `tfcompile export-hf runs/NAME`",
        "*": "train it with `tfcompile train {path}`, then `tfcompile export runs/NAME` for a bundle",
    },
    Kind.STUDY: {
        "*": "train its trials with `tfcompile sweep {path}`, then compare them with `tfcompile compare`",
    },
    Kind.RUN: {
        "train": "continue it with `tfcompile train --resume {path}` (add --set train.steps=N to extend it)",
        "validate": "check the spec it was trained with: `tfcompile validate {path}/spec.yaml`",
        "summary": "summarise the spec it was trained with: `tfcompile summary {path}/spec.yaml`",
        "generate": "`tfcompile sample {path}` generates from a run; `tfcompile export {path}` makes the "
        "bundle that `generate` serves",
        "sweep": "a study trains variants of a spec: give it `base: {path}/spec.yaml`; "
        "`tfcompile train --resume {path}` continues this run",
        "import": "`tfcompile export-hf {path} --out DIR` writes it as a Hugging Face folder, which "
        "import reads",
        "*": "export it first with `tfcompile export {path}`, then use the bundle it writes",
    },
    Kind.BUNDLE: {
        "sample": "generate from a bundle with `tfcompile generate {path}`",
        "export": "it is already exported: `tfcompile verify {path} --run RUN` rechecks it, "
        "`tfcompile optimize {path} --out DIR` makes a faster one",
        "train": "train its spec again with `tfcompile train {path}/spec.yaml --set train.name=NAME`",
        "validate": "check the spec it carries: `tfcompile validate {path}/spec.yaml`",
        "summary": "summarise the spec it carries: `tfcompile summary {path}/spec.yaml`",
        "compare": "compare the runs it was exported from (runs/NAME)",
        "plot": "plot the run it was exported from (runs/NAME)",
        "*": "a bundle is served: `tfcompile generate`, `classify` or `translate {path}`, or "
        "`tfcompile serve {path}`",
    },
    Kind.HF: {
        "*": "import it first: `tfcompile import {path} --name NAME` writes specs/NAME.yaml and runs/NAME",
    },
}


# Where each kind comes from: the advice for a path that is none of the kinds a command takes.
MADE_BY = {
    Kind.SPEC: "a spec is a YAML file (specs/ holds examples)",
    Kind.STUDY: "a study is a YAML file with `base:` and `variants:` (studies/ holds one)",
    Kind.RUN: "`tfcompile train SPEC` writes a run folder, runs/NAME",
    Kind.BUNDLE: "`tfcompile export RUN` writes a bundle, exported/NAME",
    Kind.HF: "transformers' save_pretrained writes a folder with config.json",
    Kind.FOLDER: "`tfcompile sweep STUDY` writes a study's folder of runs, runs/STUDY",
}
# How a kind is named where a command takes it, when its own name says what it is not.
TAKEN_AS = {Kind.FOLDER: "a folder of runs (a study's)"}


def advice(command: str, path: str | Path, kind: Kind, accepted: tuple[Kind, ...]) -> str:
    """The command that would work for ``path`` of ``kind``, given what ``command`` meant to do."""
    path = Path(path)
    yaml_kinds = {Kind.SPEC, Kind.STUDY} & set(accepted)
    if kind is Kind.FILE and yaml_kinds and path.suffix not in YAML_SUFFIXES:
        keys = top_level_keys(path)
        if "model" in keys or keys & STUDY_KEYS:  # a spec or a study by its keys, refused by its name
            return (
                f"it holds YAML keys, but a spec or study is recognised by its name, which ends in "
                f".yaml or .yml, not {path.suffix or 'nothing'!r}: rename it {path.with_suffix('.yaml')}"
            )
    if kind is Kind.FILE and command == "compare" and path.suffix == ".csv":
        return f"rebuild the report of a results.csv with `tfcompile compare --from-csv {path}`"
    if kind is Kind.SPEC and kind_of(path.parent) is Kind.RUN:  # runs/NAME/spec.yaml
        if Kind.RUN in accepted:
            return f"it is the spec of the run {path.parent}: give the run itself, {path.parent}"
        return f"it is the spec of the run {path.parent}: " + advice(command, path.parent, Kind.RUN, accepted)
    table = ADVICE.get(kind)
    if table is not None and command in table:
        return table[command].format(path=path)
    if table is None or not LEADS_TO.get(kind, set(accepted)) & set(accepted):  # it leads elsewhere
        return "; ".join(MADE_BY[k] for k in accepted)
    return table["*"].format(path=path)


# What a spec's and a run's general advice ("*") makes of them: worth giving to a command that
# takes one of those (the others' says what to do with them, whatever the command).
LEADS_TO = {Kind.SPEC: {Kind.RUN, Kind.BUNDLE}, Kind.RUN: {Kind.BUNDLE}}


def expect(command: str, path: str | Path, accepted: tuple[Kind, ...], role: str = "") -> Kind:
    """``path``'s kind if ``command`` takes it; otherwise a PathKindError saying what it got, what
    the command takes, and what would work."""
    wanted = " or ".join(TAKEN_AS.get(k, k.value) for k in accepted)
    where = f"{role} " if role else ""
    if not str(path):  # Path("") is the current folder: '' is a mistake, not a request for "."
        raise PathKindError(f"{role + ': ' if role else ''}the path is empty, but `{command}` takes {wanted}")
    kind = kind_of(path)
    if kind in accepted:
        return kind
    found = file_type(path)
    got = f"{found}, not a regular file" if kind is Kind.FILE and found != REGULAR_FILE else kind.value
    what_works = advice(command, path, kind, accepted)
    raise PathKindError(f"{where}{path} is {got}, but `{command}` takes {wanted}: {what_works}")


# The path arguments of each command (argparse's dest; an option's with its dashes) and the kinds
# each takes.
TAKES: dict[str, dict[str, tuple[Kind, ...]]] = {
    "validate": {"spec": (Kind.SPEC,)},
    "summary": {"spec": (Kind.SPEC,)},
    "train": {"spec": (Kind.SPEC,), "--resume": (Kind.RUN,)},
    "sweep": {"study": (Kind.STUDY,)},
    # A study's folder and a folder of runs are folders of no kind of their own (compare says
    # when one holds no runs).
    "compare": {"sources": (Kind.RUN, Kind.STUDY, Kind.FOLDER)},
    "plot": {"runs": (Kind.RUN,)},
    "sample": {"run": (Kind.RUN,)},
    "export": {"target": (Kind.RUN, Kind.SPEC)},
    "export-hf": {"run": (Kind.RUN,)},
    "optimize": {"bundle": (Kind.BUNDLE,), "--run": (Kind.RUN,)},
    "verify": {"bundle": (Kind.BUNDLE,), "--run": (Kind.RUN,)},
    "generate": {"bundle": (Kind.BUNDLE,)},
    "classify": {"bundle": (Kind.BUNDLE,)},
    "translate": {"bundle": (Kind.BUNDLE,)},
    "export-triton": {"bundle": (Kind.BUNDLE,)},
    "export-genai": {"bundle": (Kind.BUNDLE,)},
    "serve": {"bundles": (Kind.BUNDLE,)},
    "import": {"folder": (Kind.HF,)},
}


def check_arguments(command: str, arguments: dict[str, object]) -> None:
    """Check every path argument of ``command`` (argparse's namespace as a dict) against ``TAKES``;
    a PathKindError names the first of the wrong kind and what would work. ``serve``'s
    NAME=FOLDER is checked as FOLDER."""
    for argument, accepted in TAKES.get(command, {}).items():
        value = arguments.get(argument.removeprefix("--"))
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str):
                role = argument if argument.startswith("--") else ""
                expect(command, _folder_of(path) if argument == "bundles" else path, accepted, role)


def _folder_of(argument: str) -> str:
    """``serve``'s NAME=FOLDER -> FOLDER (a path that exists as written is taken whole)."""
    name, sep, folder = argument.partition("=")
    return folder if sep and name and not Path(argument).exists() else argument


def untrained(path: str | Path, missing: list[str], run: Path) -> str:
    """What to do when ``export`` is given a spec that takes ``missing`` sizes from its data."""
    sizes = " and ".join(missing)
    if kind_of(run) is Kind.RUN:
        done = f"its run {run} exists: `tfcompile export {run}`"
    else:
        done = f"train it first (`tfcompile train {path}`), then `tfcompile export {run}`"
    return (
        f"{path} takes {sizes} from its data, so it has no model until it is trained: {done} "
        f"(or export random weights with --set {missing[0]}=N)"
    )
