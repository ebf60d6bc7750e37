"""YAML -> validated ``Spec``, keeping the line and column of every key and value so that each
validation error points at the text to fix."""

from __future__ import annotations

import difflib
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

from tfcompile.paths import file_type
from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.presets import PRESETS, merge
from tfcompile.spec.schema import Spec

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
    """The problems of validating ``data`` as ``root``, each at its key or value in the file."""
    return [issue for e in error.errors() for issue in _issues(e, data, marks, preset, root)]


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
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
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
            raise SpecError(source, [_issue(("preset",), marks, unknown.message, unknown.hint)], text)
        preset = PRESETS[preset_name]
    try:
        spec = Spec.model_validate(merge(preset, data))
    except ValidationError as e:
        raise SpecError(source, validation_issues(e, data, marks, preset=preset_name), text) from None
    if spec.data is not None and base_dir is not None:
        spec = spec.model_copy(update={"data": spec.data.relative_to(base_dir)})
    return spec


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
        position = (mark.line + 1, mark.column + 1) if mark else None
        raise fail(f"invalid YAML: {e.problem or e.context}", _tab_hint(text, e), position) from None
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
            self._tag(node, self.MAP)
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
                    raise _Refused(key_node, f"duplicate key {key!r}", "give each key once")
                key_loc = (*loc, key)
                self.marks[key_loc] = self._mark(key_node, value_node)
                out[key] = self.value(value_node, key_loc, depth + 1, active)
            return out
        if isinstance(node, yaml.SequenceNode):
            self._tag(node, self.SEQ)
            items = []
            for i, item in enumerate(node.value):
                item_loc = (*loc, i)
                self.marks[item_loc] = self._mark(item, item)
                items.append(self.value(item, item_loc, depth + 1, active))
            return items
        try:
            value = self.loader.construct_object(node)
        except (ValueError, TypeError, OverflowError) as e:  # e.g. !!int abc, an int of 5,000 digits
            raise _Refused(node, f"cannot read {node.value!r} as {node.tag}: {e}", loc=loc) from None
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            _refuse_yaml11_number(node, value, loc)
        return value

    def _tag(self, node: yaml.Node, default: str) -> None:
        if node.tag != default:
            raise _Refused(node, f"unknown YAML tag {node.tag!r}", "remove the tag: a spec needs none")

    def _key(self, node: yaml.Node) -> str:
        key = self.loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            shown = repr(key) if isinstance(node, yaml.ScalarNode) else "a mapping or a list"
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

    if not sep or not all(FIELD_NAME.fullmatch(k) for k in keys):
        raise fail(
            f"bad override {override!r}", "write it as section.field=value, e.g. --set train.steps=100"
        )
    if not raw.strip():
        raise fail(
            "the value after '=' is empty",
            f"write FIELD=VALUE, e.g. --set {dotted.strip()}=VALUE (YAML: null for none, '' for empty text)",
        )
    node = data
    for depth, key in enumerate(keys[:-1]):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise fail(
                f"{'.'.join(keys[: depth + 1])} is not a section, so it has no field {keys[depth + 1]!r}"
            )
    loc = tuple(keys)
    for old in [m for m in marks if m[: len(loc)] == loc]:
        del marks[old]  # the file's positions under the override no longer hold its values
    value, value_marks = _compose(raw, source, origin=origin, at=loc)
    marks |= value_marks
    marks.setdefault(loc, Mark(None, 1, None, 1, 1, origin))
    node[keys[-1]] = value


FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a step of a --set path


# ------------------------------------------------------------------- validation -> issues


def _issues(
    error: Any, data: dict[str, Any], marks: dict[Loc, Mark], preset: str | None, root: type[BaseModel]
) -> list[SpecIssue]:
    kind = error["type"]
    if kind == "spec_rule":
        return [
            _issue(_data_loc((*error["loc"], *field), data), marks, message, hint, preset)
            for field, message, hint in error["ctx"]["violations"]
        ]
    loc = _data_loc(error["loc"], data)
    found = error.get("input")
    if kind == "extra_forbidden":
        key = loc[-1]
        fields = _fields_at(error["loc"][:-1], root)
        issue = _unknown("field", key, fields, nested=_nested_fields(error["loc"][:-1], root))
        return [_issue(loc, marks, issue.message, issue.hint, preset, on_key=True)]
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
        issue = _unknown(tag_field, error["ctx"]["tag"], expected)
        if isinstance(_value_at(data, loc), dict):
            loc = (*loc, tag_field)
        return [_issue(loc, marks, issue.message, issue.hint, preset)]
    if kind == "union_tag_not_found":
        tag_field = _tag_field(error["loc"], root)
        tags = [tag for tag in map(_tag, _walk(error["loc"], root)) if tag is not None]
        if isinstance(found, dict):
            hint = f"add `{tag_field}:` with one of {_choices(tags)}"
            return [_issue(loc, marks, f"missing `{tag_field}`", hint, preset)]
        message = (
            f"expected a mapping with `{tag_field}:` ({_choices(tags)}) and the section's fields, "
            f"found {'nothing' if found is None else repr(found)}"
        )
        hint = f"write the fields indented under `{loc[-1]}:`, one a line, e.g. `{tag_field}: {tags[0]}`"
        return [_issue(loc, marks, message, hint, preset)]
    if kind in {"model_type", "model_attributes_type", "dict_type"}:
        return [_issue(loc, marks, f"expected a mapping of fields, found {found!r}", None, preset)]
    if kind == "value_error":  # a field validator's own message says what was found
        return [_issue(loc, marks, str(error["ctx"]["error"]), None, preset)]
    if kind == "spec_bound":  # schema.at_most: the hint says what the bound is for
        return [_issue(loc, marks, error["msg"], error["ctx"]["hint"], preset)]
    message = re.sub(r"^Input should be ", "expected ", error["msg"])
    plain = _plain_at(loc, marks) if kind in TEXT_ERRORS else None
    quote = _quote_hint(plain, found) if plain is not None else None
    return [_issue(loc, marks, f"{message[0].lower()}{message[1:]}, found {found!r}", quote, preset)]


TEXT_ERRORS = {"string_type", "path_type"}  # errors that quoting a value YAML 1.1 read as no text fixes


def _plain_at(loc: Loc, marks: dict[Loc, Mark]) -> str | None:
    mark = marks.get(loc)
    return mark.plain if mark is not None else None


def _data_loc(loc: Loc, data: Any) -> Loc:
    """Pydantic's loc with union tags (e.g. 'rope' in model.positional.rope.theta) dropped."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif isinstance(node, dict) and i == len(loc) - 1:
            node = None  # a missing or unknown key: keep it, it names the field
        else:
            continue
        out.append(part)
    return tuple(out)


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


@dataclass(frozen=True)
class _Unknown:
    message: str
    hint: str | None


def _unknown(what: str, found: Any, choices: Any, nested: dict[str, str] | None = None) -> _Unknown:
    choices = list(choices)
    close = difflib.get_close_matches(str(found), [str(c) for c in choices], n=1, cutoff=0.6)
    if what == "field":
        message = f"unknown field {found!r}"
    else:
        message = f"unknown {what} {found!r}: expected one of {_choices(choices)}"
    if close:
        return _Unknown(message, f"did you mean {close[0]!r}?")
    if nested and found in nested:
        return _Unknown(message, f"{found!r} belongs under `{nested[found]}:`")
    return _Unknown(message, f"expected one of {_choices(choices)}" if what == "field" else None)


def _choices(choices: Sequence[Any]) -> str:
    return ", ".join(repr(c) for c in choices)


def _quoted(expected: str) -> list[str]:
    return re.findall(r"'([^']*)'", expected)


# ----------------------------------------------------------------- schema walk (for hints)


def _fields_at(loc: Loc, root: type[BaseModel]) -> list[str]:
    """Field names of the section at a Pydantic loc, following union tags."""
    candidates = _walk(loc, root)
    return list(dict.fromkeys(name for cls in candidates for name in cls.model_fields))


def _nested_fields(loc: Loc, root: type[BaseModel]) -> dict[str, str]:
    """For a misplaced key: field name -> the subsection (below loc) that owns it."""
    owners: dict[str, str] = {}
    for cls in _walk(loc, root):
        for name, info in cls.model_fields.items():
            for sub in _models_in(info.annotation):
                for field in sub.model_fields:
                    owners.setdefault(field, name)
    return owners


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
