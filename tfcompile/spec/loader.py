"""YAML -> validated ``Spec``, keeping the line and column of every key and value so that each
validation error points at the text to fix."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.presets import PRESETS, merge
from tfcompile.spec.schema import Spec

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    key_line: int  # 1-based
    key_column: int
    line: int  # of the value
    column: int
    width: int  # of the value when it is a one-line scalar, else 1


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> Spec:
    """Load and validate a spec file; relative data paths resolve against the file's folder.

    ``overrides`` are ``dotted.path=value`` strings (values parsed as YAML), applied last.
    Raises ``SpecError`` listing every problem found.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(str(path), [SpecIssue("", f"cannot read the spec: {e.strerror}")]) from None
    return parse_spec(text, source=str(path), base_dir=path.parent, overrides=overrides)


def parse_spec(
    text: str,
    source: str = "<spec>",
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
) -> Spec:
    data, marks = _compose(text, source)
    for override in overrides:
        _apply_override(data, override, source)
    preset_name = data.get("preset")
    preset: dict[str, Any] = {}
    if preset_name is not None:
        if preset_name not in PRESETS:
            unknown = _unknown("preset", preset_name, PRESETS)
            raise SpecError(source, [_issue(("preset",), marks, unknown.message, unknown.hint)], text)
        preset = PRESETS[preset_name]
    try:
        spec = Spec.model_validate(merge(preset, data))
    except ValidationError as e:
        issues = [issue for error in e.errors() for issue in _issues(error, data, marks, preset_name)]
        raise SpecError(source, issues, text) from None
    if spec.data is not None and base_dir is not None:
        spec = spec.model_copy(update={"data": spec.data.relative_to(base_dir)})
    return spec


def dump_spec(spec: Spec) -> str:
    """The resolved spec as YAML: every default explicit, so it rebuilds the same model."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


# --------------------------------------------------------------------------- YAML with marks


def _compose(text: str, source: str) -> tuple[dict[str, Any], dict[Loc, Mark]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        marks: dict[Loc, Mark] = {}
        data = _to_python(node, (), marks, loader) if node is not None else {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        message = f"invalid YAML: {e.problem or e.context}"
        raise SpecError(source, [SpecIssue("", message, None, line, col)], text) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [SpecIssue("", "a spec is a mapping with a `model:` section", "start with `model:`", 1, 1)],
            text,
        )
    return data, marks


def _to_python(node: yaml.Node, loc: Loc, marks: dict[Loc, Mark], loader: yaml.SafeLoader) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            if key in out:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
            key_loc = (*loc, key)
            marks[key_loc] = _mark(key_node, value_node)
            out[key] = _to_python(value_node, key_loc, marks, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            item_loc = (*loc, i)
            marks[item_loc] = _mark(item, item)
            items.append(_to_python(item, item_loc, marks, loader))
        return items
    return loader.construct_object(node)


def _mark(key: yaml.Node, value: yaml.Node) -> Mark:
    start, end = value.start_mark, value.end_mark
    one_line_scalar = isinstance(value, yaml.ScalarNode) and start.line == end.line
    return Mark(
        key.start_mark.line + 1,
        key.start_mark.column + 1,
        start.line + 1,
        start.column + 1,
        max(end.column - start.column, 1) if one_line_scalar else 1,
    )


def _apply_override(data: dict[str, Any], override: str, source: str) -> None:
    dotted, sep, raw = override.partition("=")
    keys = dotted.strip().split(".")
    if not sep or not all(keys):
        raise SpecError(
            source,
            [
                SpecIssue(
                    "", f"bad override {override!r}", "write it as section.field=value, e.g. train.steps=100"
                )
            ],
        )
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise SpecError(source, [SpecIssue(dotted, f"override {override!r} goes through a non-mapping")])
    node[keys[-1]] = yaml.safe_load(raw)


# ------------------------------------------------------------------- validation -> issues


def _issues(error: Any, data: dict[str, Any], marks: dict[Loc, Mark], preset: str | None) -> list[SpecIssue]:
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
        fields = _fields_at(error["loc"][:-1])
        issue = _unknown("field", key, fields, nested=_nested_fields(error["loc"][:-1]))
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
        return [_issue(loc, marks, issue.message, issue.hint, preset)]
    if kind == "union_tag_invalid":
        expected = _quoted(error["ctx"]["expected_tags"])
        tag_field = _tag_field(error["loc"])
        issue = _unknown(tag_field, error["ctx"]["tag"], expected)
        if isinstance(_value_at(data, loc), dict):
            loc = (*loc, tag_field)
        return [_issue(loc, marks, issue.message, issue.hint, preset)]
    if kind == "union_tag_not_found":
        tags = [cls.model_fields["type"].default for cls in _walk(error["loc"]) if "type" in cls.model_fields]
        return [_issue(loc, marks, "missing `type`", f"add `type:` with one of {_choices(tags)}", preset)]
    if kind in {"model_type", "model_attributes_type", "dict_type"}:
        return [_issue(loc, marks, f"expected a mapping of fields, found {found!r}", None, preset)]
    message = re.sub(r"^Input should be ", "expected ", error["msg"])
    return [_issue(loc, marks, f"{message[0].lower()}{message[1:]}, found {found!r}", None, preset)]


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
            return SpecIssue(path, message, hint, m.key_line, m.key_column, len(str(loc[-1])))
        return SpecIssue(path, message, hint, m.line, m.column, m.width)
    # Not in the file: the value came from a preset or a default. Point at the nearest parent.
    parent = next((loc[:i] for i in range(len(loc) - 1, 0, -1) if loc[:i] in marks), None)
    origin = f"preset {preset!r}" if preset and _in_preset(loc, preset) else "its default"
    note = None if missing else f"the value comes from {origin}; set `{path}` in the spec to change it"
    if parent is None:
        return SpecIssue(path, message, hint, note=note)
    m = marks[parent]
    return SpecIssue(path, message, hint, m.key_line, m.key_column, len(str(parent[-1])), note)


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


def _fields_at(loc: Loc) -> list[str]:
    """Field names of the section at a Pydantic loc, following union tags."""
    candidates = _walk(loc)
    return list(dict.fromkeys(name for cls in candidates for name in cls.model_fields))


def _nested_fields(loc: Loc) -> dict[str, str]:
    """For a misplaced key: field name -> the subsection (below loc) that owns it."""
    owners: dict[str, str] = {}
    for cls in _walk(loc):
        for name, info in cls.model_fields.items():
            for sub in _models_in(info.annotation):
                for field in sub.model_fields:
                    owners.setdefault(field, name)
    return owners


def _walk(loc: Loc) -> list[type[BaseModel]]:
    candidates: list[type[BaseModel]] = [Spec]
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


def _tag_field(loc: Loc) -> str:
    return next((f for cls in _walk(loc) for f in TAG_FIELDS if f in cls.model_fields), "type")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated) or origin is list:
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []
