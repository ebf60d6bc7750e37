"""YAML -> validated ``Spec``, keeping the line and column of every key and value so that each
validation error points at the text to fix."""

from __future__ import annotations

import datetime
import difflib
import functools
import math
import re
import stat
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from tfcompile.paths import file_type
from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.presets import PRESETS, merge
from tfcompile.spec.schema import SHORT_FORMS, BooleanNotNumber, Spec, listed

Loc = tuple[str | int, ...]

MAX_BYTES = 1 << 20  # a spec is text a person writes: 1 MiB is far beyond any real one
MAX_VALUES = 10_000  # keys and values once aliases are expanded (a real spec has about 100)
MAX_DEPTH = 32  # nesting of mappings and lists (a real spec nests 4 deep)


@dataclass(frozen=True)
class Mark:
    key_line: int | None  # 1-based; None for a value that a --set override put there
    key_column: int
    line: int | None  # of the value
    column: int
    width: int  # of the value when it is a one-line scalar, else 1
    origin: str | None = None  # "--set FIELD=VALUE" for an override's values
    plain: str | None = None  # an unquoted value YAML 1.1 reads as no text (no, 5, 2024-01-02), as written


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> Spec:
    """Load and validate a spec file; relative data paths resolve against the file's folder.

    ``overrides`` are ``dotted.path=value`` strings (values parsed as YAML), applied last.
    Raises ``SpecError`` listing every problem found.
    """
    path = Path(path)
    return parse_spec(_read_text(path), source=str(path), base_dir=path.parent, overrides=overrides)


def read_yaml(path: Path, what: str = "spec") -> tuple[str, Any, dict[Loc, Mark]]:
    """A YAML file a person writes (a spec, or another ``what`` such as a study) -> its text, its
    contents as plain Python and the position of every key and value; a problem is a SpecError."""
    text = _read_text(path, what)
    data, marks = _compose(text, str(path))
    return text, data, marks


def validation_issues(
    error: ValidationError,
    data: Any,
    marks: dict[Loc, Mark],
    root: type[BaseModel] = Spec,
    preset: str | None = None,
) -> list[SpecIssue]:
    """The problems of validating ``data`` as ``root``, each at its key or value in the file.

    A required field reported missing where an unknown field's hint already names it (``d_modle``:
    did you mean 'd_model'?; a top-level ``d_model``: it belongs under `model:`) is one mistake, so
    it is reported once, at the unknown field; so are the fields a misplaced ``preset:`` would give."""
    errors = error.errors()
    meant: set[Loc] = set()  # the fields that unknown keys stand for
    for e in errors:
        if e["type"] == "extra_forbidden":
            loc = _data_loc(e["loc"], data, root)
            target = _field_hint(e["loc"], loc, root).target
            if target is not None:
                meant.add(target)
            if loc[-1] == "preset" and isinstance(e.get("input"), str) and e["input"] in PRESETS:
                meant.add((*loc[:-1], "*"))
    issues = []
    for e in errors:
        if e["type"] == "missing" and not isinstance(e["loc"][-1], int):
            loc = _data_loc(e["loc"], data, root)
            if loc in meant or (*loc[:-1], "*") in meant:
                continue
        issues += _issues(e, data, marks, preset, root)
    return issues


def _read_text(path: Path, what: str = "spec") -> str:
    """The file as UTF-8 text: a regular file (a FIFO or device would block or never end) of at
    most MAX_BYTES; a byte that is not UTF-8 is reported at its line and column."""

    def fail(
        message: str, hint: str | None = None, line: int | None = None, column: int | None = None
    ) -> SpecError:
        return SpecError(str(path), [SpecIssue("", message, hint, line, column)])

    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise fail(
                f"cannot read the {what}: it is {file_type(path)}, not a regular file",
                "give the path of a .yaml file",
            )
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise fail(f"cannot read the {what}: {e.strerror}") from None
    if len(data) > MAX_BYTES:
        raise fail(
            f"the file is larger than {MAX_BYTES // 1024} KiB, far beyond any {what}", f"is this a {what}?"
        )
    try:
        # A lone CR ends a line in YAML (old Mac files) as LF does: one kind of line end, so that every
        # position and source line quoted counts lines as YAML does.
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        before = data[: e.start].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        line, column = before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1
        raise fail(
            f"the file is not UTF-8 text: byte 0x{data[e.start]:02x} cannot be decoded",
            f"save the {what} as UTF-8",
            line,
            column,
        ) from None


def parse_spec(
    text: str,
    source: str = "<spec>",
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
) -> Spec:
    data, marks = _compose(text, source)
    if not isinstance(data, dict):
        issue = SpecIssue("", "a spec is a mapping with a `model:` section", "start with `model:`", 1, 1)
        raise SpecError(source, [issue], text)
    for override in overrides:
        _apply_override(data, marks, override, source)
    return spec_from_data(data, marks, source, text, base_dir)


def spec_from_data(
    data: dict[str, Any], marks: dict[Loc, Mark], source: str, text: str, base_dir: Path | None = None
) -> Spec:
    """A spec's contents (plain Python with the ``marks`` of their keys and values in ``text``,
    such as a spec a study changed) -> a validated Spec, or a SpecError with every problem."""
    preset_name = data.get("preset")
    preset: dict[str, Any] = {}
    if preset_name is not None:
        if not isinstance(preset_name, str) or preset_name not in PRESETS:
            unknown = _unknown("preset", preset_name, PRESETS)
            one = preset_name[0] if isinstance(preset_name, list) and len(preset_name) == 1 else None
            if isinstance(one, str) and one in PRESETS:
                unknown = _Unknown(unknown.message, f"a spec extends one preset: `preset: {one}`")
            raise SpecError(source, [_issue(("preset",), marks, unknown.message, unknown.hint)], text)
        preset = PRESETS[preset_name]
    try:
        spec = Spec.model_validate(merge(preset, data))
    except ValidationError as e:
        issues = validation_issues(e, data, marks, preset=preset_name)
        raise SpecError(source, _preset_family(issues, data, marks, preset_name), text) from None
    if spec.data is not None and base_dir is not None:
        spec = spec.model_copy(update={"data": spec.data.relative_to(base_dir)})
    return spec


def _preset_family(
    issues: list[SpecIssue], data: dict[str, Any], marks: dict[Loc, Mark], preset: str | None
) -> list[SpecIssue]:
    """A spec that changes its preset's model family (``preset: bert`` with ``family: decoder``)
    gets the preset's fields that the new family lacks: one mistake, reported once, at the family."""
    model = data.get("model")
    if preset is None or not isinstance(model, dict) or not isinstance(model.get("family"), str):
        return issues
    given: dict[str, Any] = PRESETS[preset].get("model", {})
    family, theirs = model["family"], given.get("family", "decoder")
    stray = [
        i
        for i in issues
        if i.path.count(".") == 1
        and i.path.startswith("model.")
        and i.message.startswith("unknown field")
        and i.path[len("model.") :] in given
        and i.path[len("model.") :] not in model
    ]
    if family == theirs or not stray:
        return issues
    fields = [i.path[len("model.") :] for i in stray]
    others = [name for name, p in PRESETS.items() if p.get("model", {}).get("family", "decoder") == family]
    message = (
        f"preset {preset!r} is a model of family {theirs!r}: its {listed(fields)} "
        f"{'is not a field' if len(fields) == 1 else 'are not fields'} of family {family!r}"
    )
    hint = f"leave model.family out to keep {theirs!r}, or " + (
        f"start from a preset of family {family!r}: {listed(others)}"
        if others
        else "write the model out without a preset"
    )
    return [i for i in issues if i not in stray] + [_issue(("model", "family"), marks, message, hint)]


def dump_spec(spec: Spec) -> str:
    """The resolved spec as YAML: every default explicit, so it rebuilds the same model."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


# --------------------------------------------------------------------------- YAML with marks


class _Refused(Exception):
    """A YAML construct a spec never needs, at the node that holds it (and at the field ``loc``,
    for a value)."""

    def __init__(
        self, node: yaml.Node, message: str, hint: str | None = None, loc: Loc | None = None
    ) -> None:
        super().__init__(message)
        self.node, self.message, self.hint, self.loc = node, message, hint, loc


def _compose(text: str, source: str, origin: str | None = None, at: Loc = ()) -> tuple[Any, dict[Loc, Mark]]:
    """YAML text -> plain Python and the position of every key and value under ``at``. Values of
    a --set override carry its ``origin`` instead of a position in the file."""

    def fail(
        message: str, hint: str | None, position: tuple[int, int] | None, loc: Loc | None = None
    ) -> SpecError:
        line, column = position if position and origin is None else (None, None)
        issue = SpecIssue(
            ".".join(map(str, at if loc is None else loc)), message, hint, line, column, origin=origin
        )
        return SpecError(source, [issue], None if origin else text)

    loader = None
    try:
        loader = yaml.SafeLoader(text)  # reads the text through: refuses characters YAML does not allow
        reader = _Reader(loader, origin)
        node = loader.get_single_node()
        data = reader.value(node, at, 0, frozenset()) if node is not None else {}
        if origin is not None and node is not None:  # an override's value is marked at its argument
            reader.marks[at] = reader._mark(node, node)
    except _Refused as e:
        start = e.node.start_mark
        raise fail(e.message, e.hint, (start.line + 1, start.column + 1), e.loc) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context
        if (e.problem, e.context) in AT_CONTEXT and e.context_mark:  # where the key or quote starts
            mark, problem = e.context_mark, AT_CONTEXT[e.problem, e.context]
        problem = REWORDED.get((e.problem, e.context)) or problem
        position = (mark.line + 1, mark.column + 1) if mark else None
        hint = _tab_hint(text, e) or _yaml_hint(text, e)
        raise fail(f"invalid YAML: {problem}", hint, position) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, control characters)
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        message = f"invalid YAML: the character {chr(e.character)!r} is not allowed in YAML text"
        raise fail(message, "remove it", (line, column)) from None
    except RecursionError:
        raise fail(
            "invalid YAML: it nests too deeply to be a spec", f"nest at most {MAX_DEPTH} levels", None
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, reader.marks


# PyYAML errors reported where their context starts, not where the scanner gave up, with what to
# say there: a key without its ':' (at the key, not on the next line), a quote never closed (at the
# quote, not at the end of the file).
UNCLOSED_QUOTE = ("found unexpected end of stream", "while scanning a quoted scalar")
AT_CONTEXT: dict[tuple[str | None, str | None], str] = {
    ("could not find expected ':'", "while scanning a simple key"): "could not find expected ':'",
    UNCLOSED_QUOTE: "this quote is never closed",
}
SECOND_DOCUMENT = ("but found another document", "expected a single document in the stream")
# PyYAML's words for a problem, said plainly.
REWORDED: dict[tuple[str | None, str | None], str] = {SECOND_DOCUMENT: "a second YAML document starts here"}


def _tab_hint(text: str, error: yaml.MarkedYAMLError) -> str | None:
    """A hint when the line of a YAML error is indented with a tab (PyYAML's message for it speaks
    of a character that cannot start a token)."""
    mark = error.problem_mark or error.context_mark
    lines = text.split("\n")
    line = lines[mark.line] if mark and mark.line < len(lines) else ""
    indent = line[: len(line) - len(line.lstrip())]
    if "\t" in indent or "'\\t'" in str(error.problem):
        return "indent with spaces: YAML does not allow tabs in indentation"
    return None


def _yaml_hint(text: str, error: yaml.MarkedYAMLError) -> str | None:
    """A hint for the YAML errors a spec written by hand runs into: `key:value` or `key = value`,
    an unquoted ': ' in a value, a line indented past or between its section's fields, a `{` or
    `[` left open."""
    lines = text.split("\n")
    problem, mark, context = str(error.problem), error.problem_mark, error.context_mark

    def line(n: int) -> str:
        return lines[n] if 0 <= n < len(lines) else ""

    def indent(n: int) -> int:
        return len(line(n)) - len(line(n).lstrip(" "))

    def above(n: int) -> int:  # the nearest line above with content
        return next(
            (i for i in range(n - 1, -1, -1) if line(i).strip() and not line(i).lstrip().startswith("#")), -1
        )

    if (problem, error.context) == UNCLOSED_QUOTE and context is not None:
        quote = line(context.line)[context.column : context.column + 1]
        return f"end the value with the {quote} that starts it on line {context.line + 1}"
    if problem == "could not find expected ':'" and context is not None:
        here = line(context.line)
        if re.match(r"\s*[\w.-]+:\S", here):
            return "put a space after the colon: `key: value`"
        if re.match(r"\s*[\w.-]+\s*=", here):
            return "write `key: value`: YAML separates a key from its value with a colon and a space"
        return None
    if mark is None:
        return None
    one = "a spec is one YAML document, one mapping of its sections"
    if (problem, error.context) == SECOND_DOCUMENT:  # a second `---`
        return f"{one}: remove the `---` on line {mark.line + 1}"
    if problem.startswith("expected '<document start>'") and line(above(mark.line)).strip() == "...":
        return f"{one}: remove the `...` on line {above(mark.line) + 1}, which ends the first"
    if problem == "mapping values are not allowed here":
        here, prev = line(mark.line), above(mark.line)
        pair = re.match(r"\s*(?:- )?([\w.-]+):[ \t]+[^\s#]", line(prev))  # `key: value` above
        if prev >= 0 and indent(mark.line) > indent(prev) and pair:
            key = pair.group(1)
            return (
                f"line {prev + 1} gives `{key}` a value, so this line cannot be indented under it: align "
                f"it with line {prev + 1} for a field beside `{key}`, or write `{key}:` alone with its "
                f"fields indented below"
            )
        value = re.match(r"\s*(?:- )?([\w.-]+):\s+(.*\S)", here)
        if value and ": " in value.group(2) + " ":
            key, rest = value.groups()
            return f"quote the value: `{key}: \"{rest}\"` (unquoted, ': ' starts a mapping)"
        return None
    if problem.startswith("expected <block end>"):
        prev = above(mark.line)
        if prev >= 0 and indent(mark.line) != indent(prev):
            return (
                f"indent it like the other fields of its section (line {prev + 1} has {indent(prev)} "
                f"spaces, this line {indent(mark.line)})"
            )
        return None
    closing = {"flow mapping": ("{", "}"), "flow sequence": ("[", "]")}
    for what, (opened, close) in closing.items():
        if context is not None and what in str(error.context) and f"'{close}'" in problem:
            return (
                f"close the `{opened}` opened on line {context.line + 1} with `{close}`, its items "
                "separated by commas"
            )
    return None


class _Reader:
    """Plain Python from the node graph that PyYAML's SafeLoader composes, with the position of
    every key and value, refusing what a spec never needs: keys that are not text, tags that name
    no known type, aliases that refer to themselves or expand past MAX_VALUES, nesting deeper than
    MAX_DEPTH."""

    MAP, SEQ, MERGE = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:merge"

    def __init__(self, loader: yaml.SafeLoader, origin: str | None) -> None:
        self.loader = loader
        self.origin = origin
        self.marks: dict[Loc, Mark] = {}
        self.count = 0

    def value(self, node: yaml.Node, loc: Loc, depth: int, active: frozenset[int]) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _Refused(
                node, f"the spec expands to more than {MAX_VALUES} values", "check its aliases (*name)"
            )
        if id(node) in active:
            raise _Refused(node, "an alias refers to the value that contains it", "aliases must not recurse")
        if depth > MAX_DEPTH:
            raise _Refused(node, f"nested more than {MAX_DEPTH} levels deep", "a spec nests a few levels")
        active = active | {id(node)}
        if isinstance(node, yaml.MappingNode):
            self._tag(node, {self.MAP}, loc)
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == self.MERGE:
                    raise _Refused(
                        key_node,
                        "merge keys (`<<:`) are not read in a spec",
                        "write the fields out, or reuse a whole section with an alias (`model: *name`)",
                    )
                key = self._key(key_node)
                if key in out:
                    raise _Refused(key_node, f"duplicate key {_shown(key)}", "give each key once")
                key_loc = (*loc, key)
                self.marks[key_loc] = self._mark(key_node, value_node)
                out[key] = self.value(value_node, key_loc, depth + 1, active)
            return out
        if isinstance(node, yaml.SequenceNode):
            self._tag(node, {self.SEQ}, loc)
            items = []
            for i, item in enumerate(node.value):
                item_loc = (*loc, i)
                self.marks[item_loc] = self._mark(item, item)
                items.append(self.value(item, item_loc, depth + 1, active))
            return items
        self._tag(node, SCALARS, loc)
        if node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_DIGITS:
            raise _Refused(
                node, f"a number of {len(node.value):,} digits is past any value a spec takes", loc=loc
            )
        try:
            value = self.loader.construct_object(node)
        except (ValueError, TypeError, OverflowError) as e:  # e.g. !!int abc
            raise _Refused(node, f"cannot read {_shown(node.value)} as {node.tag}: {e}", loc=loc) from None
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            _refuse_yaml11_number(node, value, loc)
        return value

    def _tag(self, node: yaml.Node, allowed: set[str], loc: Loc) -> None:
        if node.tag in allowed:
            return
        if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in YAML_KEYS:
            raise _Refused(
                node,
                f"an unquoted {node.value} is YAML 1.1's {YAML_KEYS[node.tag]}, not a value",
                f"quote it: '{node.value}'",
                loc,
            )
        raise _Refused(node, f"unknown YAML tag {node.tag!r}", "remove the tag: a spec needs none", loc)

    def _key(self, node: yaml.Node) -> str:
        key = self.loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            shown = _shown(key) if isinstance(node, yaml.ScalarNode) else "a mapping or a list"
            plain = _plain(node)
            hint = _quote_hint(plain, key) if plain is not None else "keys are names such as d_model"
            raise _Refused(node, f"a key must be a field name, found {shown}", hint)
        return key

    def _mark(self, key: yaml.Node, value: yaml.Node) -> Mark:
        plain = _plain(value)
        if self.origin is not None:
            return Mark(None, 1, None, 1, 1, self.origin, plain)
        start, end = value.start_mark, value.end_mark
        one_line_scalar = isinstance(value, yaml.ScalarNode) and start.line == end.line
        return Mark(
            key.start_mark.line + 1,
            key.start_mark.column + 1,
            start.line + 1,
            start.column + 1,
            max(end.column - start.column, 1) if one_line_scalar else 1,
            plain=plain,
        )


# The tags YAML 1.1 gives an unquoted scalar that is not text: `no`, `on` and `yes` are booleans,
# `5` a number, `2024-01-02` a date. Where text was meant, the value is to be quoted.
NOT_TEXT = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
# The tags of the scalars YAML 1.1 reads without a tag: a tag that names another type (!!binary,
# !!python/object, a custom !name) is refused at the value, as on a mapping or a list.
SCALARS = NOT_TEXT | {"tag:yaml.org,2002:str", "tag:yaml.org,2002:null"}
# The tags YAML 1.1 gives two unquoted scalars that are no value: `=` and `<<` (merge) as values.
YAML_KEYS = {"tag:yaml.org,2002:value": "'value' key", "tag:yaml.org,2002:merge": "merge key"}
# Every bounded field's bound has fewer digits (seeds, the largest, 19), and a longer number is
# cut off before Python converts it: past 4,300 digits its error is advice to Python programmers.
MAX_DIGITS = 100
OCTAL = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1's octal form (YAML 1.2 writes 0o10)


def _plain(node: yaml.Node) -> str | None:
    """The text of ``node`` when it is an unquoted scalar that YAML 1.1 reads as no text."""
    if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in NOT_TEXT:
        return str(node.value)
    return None


def _quote_hint(plain: str, value: Any) -> str:
    """How to make ``plain``, which YAML 1.1 read as ``value``, the text it looks like."""
    if isinstance(value, bool):
        reading = f"the boolean {str(value).lower()}"
    elif isinstance(value, int | float):
        reading = f"the number {value}"
    else:
        reading = "a date"
    return f"quote it: '{plain}' (unquoted, YAML 1.1 reads it as {reading})"


def _refuse_yaml11_number(node: yaml.ScalarNode, value: Any, loc: Loc) -> None:
    """Refuse the two YAML 1.1 forms that validation would take silently as another number than
    the one written: a leading zero makes octal (010 is 8, where YAML 1.2 reads 10) and colons base
    60 (1:30 is 90, where YAML 1.2 reads text). Neither reading is surely the author's, so guessing
    either would surprise someone: the hint says to write the number meant, or to quote the text."""
    text = str(node.value)
    decimal = int(text.replace("_", "")) if OCTAL.fullmatch(text) else value
    if node.tag == "tag:yaml.org,2002:int" and decimal != value:
        raise _Refused(
            node,
            f"YAML 1.1 reads {text} as the octal number {value}",
            f"write {decimal} if you mean {decimal}, {value} if you mean octal {text}, or quote it "
            f"('{text}') for text",
            loc,
        )
    if node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and ":" in text:
        raise _Refused(
            node,
            f"YAML 1.1 reads {text} as the base-60 number {value}",
            f"write {value} if you mean that number, or quote it ('{text}') for text",
            loc,
        )


def _apply_override(data: dict[str, Any], marks: dict[Loc, Mark], override: str, source: str) -> None:
    """``dotted.path=value``: the value (YAML) replaces what the file says there; its errors are
    reported at the argument, not at the file's line."""
    origin = f"--set {override}"
    dotted, sep, raw = override.partition("=")
    keys = dotted.strip().split(".")

    def fail(message: str, hint: str | None = None) -> SpecError:
        return SpecError(source, [SpecIssue(dotted.strip(), message, hint, origin=origin)])

    index = next((i for i, k in enumerate(keys) if i > 0 and k.isdigit()), None)  # a list's item
    if sep and index is not None:
        field = ".".join(keys[:index])
        raise fail(
            f"--set names fields, not a list's items ({keys[index]}): a list is set whole",
            f"where {field} is a list, write every item, e.g. --set {field}=[{raw.strip()}, ...]",
        )
    if not sep or not all(FIELD_NAME.fullmatch(k) for k in keys):
        raise fail(
            f"bad override {override!r}", "write it as section.field=value, e.g. --set train.steps=100"
        )
    if not raw.strip():
        raise fail(
            "the value after '=' is empty",
            f"write FIELD=VALUE, e.g. --set {dotted.strip()}=VALUE (YAML: null for none, '' for empty text)",
        )
    loc = tuple(keys)
    for old in [m for m in marks if m[: len(loc)] == loc]:
        del marks[old]  # the file's positions under the override no longer hold its values
    value, value_marks = _compose(raw, source, origin=origin, at=loc)
    blocked = set_field(data, keys, value)
    if blocked is not None:
        raise fail(
            f"{'.'.join(keys[: blocked + 1])} is not a section, so it has no field {keys[blocked + 1]!r}"
        )
    marks |= value_marks
    for i in range(1, len(loc) + 1):  # a section the file does not have is the argument's too
        marks.setdefault(loc[:i], Mark(None, 1, None, 1, 1, origin))


def set_field(data: dict[str, Any], keys: Sequence[str], value: Any) -> int | None:
    """Set ``data[k0][k1]...`` to ``value`` as --set does (a study's fields too): sections made on
    the way, one left empty or null (``moe: null``) filled, a variant's short form (``positional:
    rope``) opened to ``{type: rope}``; where a value that is no section is in the way, its depth
    instead, and nothing set."""
    node = data
    for depth, key in enumerate(keys[:-1]):
        parent, node = node, node.setdefault(key, {})
        if node is None and _walk(tuple(keys[: depth + 1]), Spec):  # `moe: null`, or an empty `data:`
            node = parent[key] = {}
        elif isinstance(node, str) and key in SHORT_FORMS:
            node = parent[key] = {"type": node}
        if not isinstance(node, dict):
            return depth
    node[keys[-1]] = value
    return None


FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a step of a --set path


# ------------------------------------------------------------------- validation -> issues


def _issues(
    error: Any, data: dict[str, Any], marks: dict[Loc, Mark], preset: str | None, root: type[BaseModel]
) -> list[SpecIssue]:
    kind = error["type"]
    if kind == "spec_rule":
        return [
            _issue(_data_loc((*error["loc"], *field), data, root), marks, message, hint, preset)
            for field, message, hint in error["ctx"]["violations"]
        ]
    loc = _data_loc(error["loc"], data, root)
    found = error.get("input")
    if kind == "extra_forbidden":
        hint = _field_hint(error["loc"], loc, root).hint
        return [_issue(loc, marks, f"unknown field {_shown(loc[-1])}", hint, preset, on_key=True)]
    if kind == "missing" and isinstance(error["loc"][-1], int):
        return [_issue(loc, marks, f"too few items: nothing at position {error['loc'][-1]}", None, preset)]
    if kind == "missing":
        where = f"under `{'.'.join(str(p) for p in loc[:-1])}`" if len(loc) > 1 else "at the top level"
        hint = f"add `{loc[-1]}: ...` {where}"
        return [_issue(loc, marks, f"missing required field {loc[-1]!r}", hint, preset, missing=True)]
    if kind == "literal_error":
        expected = _quoted(error["ctx"]["expected"])
        issue = _unknown("value", found, expected)
        plain = _plain_at(loc, marks)
        if plain is not None and plain in expected:  # `no` where 'no' is a choice
            issue = _Unknown(issue.message, _quote_hint(plain, found))
        return [_issue(loc, marks, issue.message, issue.hint, preset)]
    if kind == "union_tag_invalid":
        expected = _quoted(error["ctx"]["expected_tags"])
        tag_field = _tag_field(error["loc"], root)
        # Pydantic gives the tag as text ('None' for `type: null`); the section holds it as written.
        tag = found[tag_field] if isinstance(found, dict) and tag_field in found else error["ctx"]["tag"]
        issue = _unknown(tag_field, tag, expected)
        if isinstance(_value_at(data, loc), dict):
            loc = (*loc, tag_field)
        return [_issue(loc, marks, issue.message, issue.hint, preset)]
    if kind == "union_tag_not_found":
        tag_field = _tag_field(error["loc"], root)
        tags = [tag for tag in map(_tag, _walk(error["loc"], root)) if tag is not None]
        if isinstance(found, dict) and tag_field in found:  # `family: null`
            issue = _unknown(tag_field, None, tags)
            return [_issue((*loc, tag_field), marks, issue.message, issue.hint, preset)]
        if isinstance(found, dict):
            hint = f"add `{tag_field}:` with one of {listed(tags)}"
            return [_issue(loc, marks, f"missing `{tag_field}`", hint, preset)]
        message = (
            f"expected a mapping with `{tag_field}:` ({listed(tags)}) and the section's fields, "
            f"found {_shown(found)}"
        )
        hint = f"write the fields indented under `{loc[-1]}:`, one a line, e.g. `{tag_field}: {tags[0]}`"
        return [_issue(loc, marks, message, hint, preset)]
    if kind in {"model_type", "model_attributes_type", "dict_type"}:
        hint = _section_hint(loc, found, _walk(error["loc"], root))
        return [_issue(loc, marks, f"expected a mapping of fields, found {_shown(found)}", hint, preset)]
    if kind == "value_error":  # a field validator's own message says what was found
        return [_issue(loc, marks, str(error["ctx"]["error"]), None, preset)]
    if kind == "spec_bound":  # schema.at_most, at_least: the hint says what the bound is for
        return [_issue(loc, marks, error["msg"], error["ctx"]["hint"], preset)]
    message = (
        PLAIN[kind].format(**error.get("ctx", {}))
        if kind in PLAIN
        else re.sub(r"^Input should be ", "expected ", error["msg"])
    )
    plain = _plain_at(loc, marks) if kind in TEXT_ERRORS else None
    hint = _quote_hint(plain, found) if plain is not None else _type_hint(kind, found, error["loc"], root)
    return [_issue(loc, marks, f"{message[0].lower()}{message[1:]}, found {_shown(found)}", hint, preset)]


# Pydantic's messages that speak of Python ("a valid path for <class 'pathlib.Path'>") in a spec's
# words; the value found follows.
PLAIN = {
    "path_type": "expected a path (text)",
    "too_long": "expected at most {max_length} items",  # not "tuple should have ... after validation"
    "too_short": "expected at least {min_length} items",
}
TEXT_ERRORS = {"string_type", "path_type"}  # errors that quoting a value YAML 1.1 read as no text fixes


def _plain_at(loc: Loc, marks: dict[Loc, Mark]) -> str | None:
    mark = marks.get(loc)
    return mark.plain if mark is not None else None


def _data_loc(loc: Loc, data: Any, root: type[BaseModel] = Spec) -> Loc:
    """Pydantic's loc with union tags (e.g. 'rope' in model.positional.rope.theta) dropped. A
    field the file leaves out (a default: ``task.type`` in a spec with no ``task:``) is kept; a
    field of a value written in shorthand (``task: seq2seq``) is the value itself."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif (node is None or isinstance(node, dict)) and not _is_tag(loc[:i], part, root):
            node = None  # a missing or unknown key: keep it, it names the field
        else:
            continue
        out.append(part)
    return tuple(out)


def _is_tag(loc: Loc, part: str | int, root: type[BaseModel]) -> bool:
    """Whether ``part`` of a Pydantic loc names the variant of a union at ``loc``, not a field."""
    candidates = _walk(loc, root)
    return len(candidates) > 1 and any(_tag(c) == part for c in candidates)


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        data = data[part]
    return data


def _issue(
    loc: Loc,
    marks: dict[Loc, Mark],
    message: str,
    hint: str | None = None,
    preset: str | None = None,
    on_key: bool = False,
    missing: bool = False,
) -> SpecIssue:
    path = ".".join(str(p) for p in loc)
    if loc in marks:
        m = marks[loc]
        if on_key:
            return SpecIssue(
                path, message, hint, m.key_line, m.key_column, len(str(loc[-1])), origin=m.origin
            )
        return SpecIssue(path, message, hint, m.line, m.column, m.width, origin=m.origin)
    # Not in the file: the value came from a preset or a default. Point at the nearest parent.
    parent = next((loc[:i] for i in range(len(loc) - 1, 0, -1) if loc[:i] in marks), None)
    origin = f"preset {preset!r}" if preset and _in_preset(loc, preset) else "its default"
    note = None if missing else f"the value comes from {origin}; set `{path}` in the spec to change it"
    if parent is None:
        return SpecIssue(path, message, hint, note=note)
    m = marks[parent]
    return SpecIssue(path, message, hint, m.key_line, m.key_column, len(str(parent[-1])), note, m.origin)


def _in_preset(loc: Loc, preset: str) -> bool:
    node: Any = PRESETS[preset]
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


MAX_SHOWN = 60  # characters of a value that a message quotes


def _shown(value: Any) -> str:
    """A value as a message quotes it: "nothing" for YAML's null (an empty value too), a date as
    written, and a long value cut short, so that a 5,000-digit number makes a one-line message."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()  # as YAML writes it
    text = value.isoformat() if isinstance(value, datetime.date) else repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[: MAX_SHOWN - 1]}…"


@dataclass(frozen=True)
class _Unknown:
    message: str
    hint: str | None


def _unknown(what: str, found: Any, choices: Any) -> _Unknown:
    choices = [str(c) for c in choices]
    head = f"no {what} given" if found is None else f"unknown {what} {_shown(found)}"
    message = f"{head}: expected one of {listed(choices)}"
    parts = [p for p in re.split(r"\s*(?:\||,|/|\bor\b)\s*", str(found).strip()) if p]
    if len(parts) > 1 and all(_suggest(p, choices) == p for p in parts):  # `relu | gelu`, as in a comment
        return _Unknown(message, f"choose one: {' or '.join(map(repr, parts))}")
    close = _suggest(found, choices, VALUE_ALIASES)
    return _Unknown(message, f"did you mean {close!r}?" if close is not None else None)


# Names other tools give to a spec's choices (PyTorch, Hugging Face configs, papers).
VALUE_ALIASES = {
    "rotary": "rope",
    "swish": "silu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "absolute": "learned",
    "sincos": "sinusoidal",
    "gpu": "cuda",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "gpt": "decoder",
    "bert": "encoder",
    "t5": "encoder_decoder",
    "clm": "causal_lm",
    "mlm": "masked_lm",
    "translation": "seq2seq",
    "character": "char",
}

# Field names from Hugging Face configs, nanoGPT and PyTorch for a spec's fields.
FIELD_ALIASES = {
    "learning_rate": "lr",
    "hidden_size": "d_model",
    "n_embd": "d_model",
    "num_layers": "n_layers",
    "num_hidden_layers": "n_layers",
    "n_layer": "n_layers",
    "num_heads": "n_heads",
    "num_attention_heads": "n_heads",
    "n_head": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "num_kv_heads": "n_kv_heads",
    "intermediate_size": "d_ff",
    "ffn_dim": "d_ff",
    "block_size": "max_seq_len",
    "max_position_embeddings": "max_seq_len",
    "seq_len": "max_seq_len",
    "max_steps": "steps",
    "max_iters": "steps",
    "num_steps": "steps",
    "warmup": "warmup_steps",
    "warmup_iters": "warmup_steps",
    "gradient_accumulation_steps": "grad_accum",
    "max_grad_norm": "grad_clip",
    "gradient_clipping": "grad_clip",
    "dtype": "precision",
    "mixed_precision": "precision",
    "rope_theta": "theta",
    "rope_scaling": "scaling",
    "layer_norm_eps": "eps",
    "layer_norm_epsilon": "eps",
    "rms_norm_eps": "eps",
    "norm_eps": "eps",
    "epsilon": "eps",
    "hidden_act": "activation",
    "tie_word_embeddings": "tie_embeddings",
    "attn_pdrop": "attention",
    "resid_pdrop": "residual",
    "embd_pdrop": "embedding",
    "scheduler": "schedule",
    "lr_scheduler": "schedule",
    "out_dir": "runs_dir",
    "output_dir": "runs_dir",
    "run_name": "name",
    "dataset": "data",
}


def _normal(name: Any) -> str:
    return re.sub(r"[\s-]+", "_", str(name).strip().lower())


def _suggest(found: Any, choices: Sequence[str], aliases: dict[str, str] | None = None) -> str | None:
    """The choice ``found`` most likely means: the same name in another case or with '-' for '_'
    (SwiGLU, RoPE, causal-lm), the same without '_' (layer_norm), another tool's name for it
    (``aliases``), the one choice it abbreviates (temp), or a close spelling."""
    text = _normal(found)
    for same in (lambda n: n, lambda n: n.replace("_", "")):
        match = next((c for c in choices if same(_normal(c)) == same(text)), None)
        if match is not None:
            return match
    alias = (aliases or {}).get(text)
    if alias in choices:
        return alias
    normal = [_normal(c) for c in choices]
    longer = [c for c, n in zip(choices, normal, strict=True) if len(text) >= 3 and n.startswith(text)]
    if len(longer) == 1:
        return longer[0]
    close = difflib.get_close_matches(text, normal, n=1, cutoff=0.6)
    return choices[normal.index(close[0])] if close else None


@dataclass(frozen=True)
class _FieldHint:
    hint: str | None
    target: Loc | None  # the field the unknown key stands for, as a data loc, when one is clear


def _field_hint(error_loc: Loc, loc: Loc, root: type[BaseModel]) -> _FieldHint:
    """How to fix the unknown key at ``loc`` (``error_loc``, Pydantic's loc of it): the field of
    this section it misspells, the section it belongs in, or the fields this section has."""
    key, section = str(loc[-1]), loc[:-1]
    fields = _fields_at(error_loc[:-1], root)
    same = next((f for f in fields if _normal(f) == _normal(key)), None)
    if same is not None:  # D_model, vocab-size
        return _FieldHint(f"did you mean {same!r}?", (*section, same))
    tag_field = next((f for f in TAG_FIELDS if f in fields), None)
    if key in TAG_FIELDS and tag_field is not None:  # `type:` in a section whose variant is its `family:`
        return _FieldHint(f"did you mean {tag_field!r}?", None)
    homes = _homes(root)
    if key in homes and (key not in TAG_FIELDS or len({h[0] for h in homes[key]}) == 1):  # most have `type:`
        return _belongs(key, key, homes[key], section)
    alias = FIELD_ALIASES.get(_normal(key))
    if alias is not None and alias in fields:
        return _FieldHint(f"did you mean {alias!r}?", (*section, alias))
    if alias is not None and alias in homes:
        return _belongs(key, alias, homes[alias], section)
    close = _suggest(key, fields)
    if close is not None:
        return _FieldHint(f"did you mean {close!r}?", (*section, close))
    return _FieldHint(f"expected one of {listed(fields)}", None)


Home = tuple[tuple[str, ...], str | None, tuple[Any, ...]]  # section, tag field, the variants with it


def _belongs(key: str, name: str, homes: list[Home], section: Loc) -> _FieldHint:
    """Where field ``name`` (which the unknown ``key`` is, or stands for) lives: in another
    variant of this section, below it, or elsewhere in the spec (the nearest first)."""
    meant = "" if key == name else f"did you mean {name!r}? it "
    subject = meant or f"{key!r} "
    here = tuple(str(p) for p in section)
    variants = [h for h in homes if h[0] == here and h[1] is not None]
    if variants:  # theta in positional: {type: learned}
        _, tag_field, tags = variants[0]
        return _FieldHint(f"{subject}is a field of {tag_field} {' or '.join(map(repr, tags))}", None)
    nearest = [h for h in homes if h[0][: len(here)] == here] or homes  # below this section, if any
    depth = min(len(h[0]) for h in nearest)
    chosen = [h for h in nearest if len(h[0]) == depth][:3]
    places = []
    for path, tag_field, tags in chosen:
        where = f"under `{'.'.join(path)}:`" if path else "at the top level"
        if tag_field is not None and len(tags) <= 2:
            where += f" ({tag_field} {' or '.join(map(repr, tags))})"
        places.append(where)
    target = (*chosen[0][0], name) if len(chosen) == 1 else None
    return _FieldHint(f"{subject}belongs {' or '.join(places)}", target)


@functools.cache  # a walk of the whole schema, asked for by every unknown key
def _homes(root: type[BaseModel]) -> dict[str, list[Home]]:
    """Every field of the schema under ``root`` -> the sections that have it (dotted as in the
    file, with the variants that have it where the section has several and not all of them do);
    read-only, being shared."""
    out: dict[str, list[Home]] = {}

    def visit(classes: list[type[BaseModel]], path: tuple[str, ...], depth: int) -> None:
        if depth > MAX_DEPTH:
            return
        tag_field = next((f for f in TAG_FIELDS if all(f in c.model_fields for c in classes)), None)
        names = list(dict.fromkeys(n for c in classes for n in c.model_fields))
        for name in names:
            having = [c for c in classes if name in c.model_fields]
            some = len(having) < len(classes) and tag_field is not None
            out.setdefault(name, []).append((path, tag_field if some else None, tuple(map(_tag, having))))
            subs = list(dict.fromkeys(m for c in having for m in _models_in(c.model_fields[name].annotation)))
            if subs:
                visit(subs, (*path, name), depth + 1)

    visit([root], (), 0)
    return out


def _section_hint(loc: Loc, found: Any, classes: list[type[BaseModel]]) -> str | None:
    """How to write a section given as something other than a mapping of its fields."""
    name = loc[-1] if loc else "the section"
    if found is None:
        return f"indent the section's fields under `{name}:`, or remove the line to keep its defaults"
    if isinstance(found, list) and found and all(isinstance(i, dict) and len(i) == 1 for i in found):
        return f"write its fields without `- `: `{name}:` holds a mapping, not a list"
    tag_field = next((f for f in TAG_FIELDS if any(f in c.model_fields for c in classes)), None)
    if tag_field is not None and isinstance(found, str):  # norm: rmsnorm
        names = [c.model_fields[tag_field].annotation for c in classes if tag_field in c.model_fields]
        tags = list(dict.fromkeys(str(t) for a in names for t in _literals(a)))
        tag = _suggest(found, tags, VALUE_ALIASES)
        if tag is not None:
            return f"write `{name}: {{{tag_field}: {tag}}}`"
    if isinstance(found, bool | float | int):
        kind = bool if isinstance(found, bool) else type(found)
        same = [
            n
            for c in classes[:1]
            for n, info in c.model_fields.items()
            if type(info.default) is kind or (kind is int and type(info.default) is float)
        ]
        if same:  # dropout: 0.1, bias: false
            shown = yaml.safe_dump(found).split("\n")[0]
            return f"set each field: `{name}: {{{', '.join(f'{n}: {shown}' for n in same)}}}`"
    return None


NONE_WORDS = {"none", "null", "nil", "~"}


def _type_hint(kind: str, found: Any, error_loc: Loc, root: type[BaseModel]) -> str | None:
    """How to write ``found`` as the type the field takes, where that is clear."""
    info = _field_info(error_loc, root)
    optional = info is not None and _accepts_none(info.annotation)
    if isinstance(found, str) and found.strip().lower() in NONE_WORDS and optional:
        return "write null (YAML's word for no value), or leave the field out for its default"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        number = _whole_number(found)
        if number is None:
            return None
        if isinstance(found, float):
            return f"write {number}: the field takes a whole number, without a decimal point or exponent"
        if str(number) == found.strip():
            return f"write {number} without quotes: quoted, it is text"
        if re.fullmatch(r"[-+]?[\d.]+[eE][-+]?\d+", found.strip()):
            return f"write {number}: YAML 1.1 reads {found.strip()} as text, not as a number"
        return f"write {number}"
    if kind == "float_parsing" and isinstance(found, str):
        percent = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*%\s*", found)
        fraction = info is not None and 1 in _upper_bounds(info.annotation, info.metadata)  # not grad_clip
        if percent and fraction:
            return f"write {float(percent.group(1)) / 100:g}: a fraction, not a percentage"
        return None
    if isinstance(found, BooleanNotNumber):
        return "write a number: YAML reads yes, no, on and off as true and false"
    if kind in {"bool_parsing", "bool_type"}:
        return "write true or false" + (", or null for the default" if optional else "")
    if kind in {"list_type", "tuple_type"}:
        if isinstance(found, str):
            items = [i.strip() for i in found.strip().strip("[]()").split(",") if i.strip()]
            return f"write a list: [{', '.join(items)}]"
        if isinstance(found, dict) and all(not isinstance(v, dict | list) for v in found.values()):
            shown = ", ".join(yaml.safe_dump(v).split("\n")[0] for v in found.values())
            return f"write a list: [{shown}]"
    return None


def _upper_bounds(annotation: Any, metadata: Sequence[Any] = ()) -> list[Any]:
    """The lt and le bounds of a field's ``metadata`` and of the Annotated types its annotation
    holds (an optional field's bounds are inside its union)."""
    bounds = [getattr(m, "lt", getattr(m, "le", None)) for m in metadata]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        found = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return bounds + _upper_bounds(inner, found)
    if origin in (typing.Union, types.UnionType):
        return bounds + [b for arg in typing.get_args(annotation) for b in _upper_bounds(arg)]
    return bounds


def _whole_number(found: Any) -> int | None:
    """The whole number that ``found`` (32.0, '1e4', '10,000', '10k') writes another way."""
    if isinstance(found, float):
        return int(found) if found.is_integer() else None
    if not isinstance(found, str):
        return None
    text = found.strip().replace(",", "").replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    text = text[:-1] if scale > 1 else text
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value.is_integer() and abs(value) < 2**63 else None


def _field_info(loc: Loc, root: type[BaseModel]) -> Any:
    classes = [c for c in _walk(loc[:-1], root) if loc and loc[-1] in c.model_fields]
    return classes[0].model_fields[str(loc[-1])] if classes else None


def _literals(annotation: Any) -> list[Any]:
    """The values a ``Literal`` annotation (inside Optional or Annotated too) allows."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [v for arg in typing.get_args(annotation) for v in _literals(arg)]
    return []


def _accepts_none(annotation: Any) -> bool:
    if annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_accepts_none(arg) for arg in typing.get_args(annotation))
    return False


def _quoted(expected: str) -> list[str]:
    return re.findall(r"'([^']*)'", expected)


# ----------------------------------------------------------------- schema walk (for hints)


def _fields_at(loc: Loc, root: type[BaseModel]) -> list[str]:
    """Field names of the section at a Pydantic loc, following union tags."""
    candidates = _walk(loc, root)
    return list(dict.fromkeys(name for cls in candidates for name in cls.model_fields))


def _walk(loc: Loc, root: type[BaseModel]) -> list[type[BaseModel]]:
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        fields = [cls.model_fields[part] for cls in candidates if part in cls.model_fields]
        if fields:
            candidates = [m for f in fields for m in _models_in(f.annotation)]
            continue
        tagged = [c for c in candidates if _tag(c) == part]
        if tagged:
            candidates = tagged
    return candidates


TAG_FIELDS = ("type", "family")  # the fields whose value picks a variant of a section


def _tag(cls: type[BaseModel]) -> Any:
    return next((cls.model_fields[f].default for f in TAG_FIELDS if f in cls.model_fields), None)


def _tag_field(loc: Loc, root: type[BaseModel]) -> str:
    return next((f for cls in _walk(loc, root) for f in TAG_FIELDS if f in cls.model_fields), "type")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated) or origin is list:
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []
