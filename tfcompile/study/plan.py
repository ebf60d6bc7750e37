"""A study's trials: every variant (named, or a combination of the axes' values) at every seed,
each a validated spec: the base spec with the study's fields set as ``--set`` sets them, the
budget's steps, the seed, and, when asked, the width that matches the baseline's parameter count.

A trial spec that does not validate is reported in the study file: at the field the study set, or,
when the field is the base spec's, at the variant, with the spec layer's own message and hint.
No torch here.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tfcompile.manifest import SPEC_FILE
from tfcompile.paths import FOLDER, REGULAR_FILE, Kind, file_type, kind_of, top_level_keys
from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.loader import Loc, Mark, load_spec, read_yaml, set_field, spec_from_data
from tfcompile.spec.schema import Spec
from tfcompile.study.schema import MAX_STEPS, MatchParameters, StudyFile, is_name

BASE_LABEL = "base"  # the one variant of a study without variants or axes


@dataclass(frozen=True)
class Entry:
    """A dotted field the study file sets, and where: ``loc`` of its value in the file, e.g.
    ("variants", "llama", "model.activation") or ("axes", "model.activation", 1)."""

    loc: Loc
    field: str  # in the spec: "model.activation"
    value: Any


@dataclass(frozen=True)
class Variant:
    label: str  # a variant's name, and/or its axis values: "llama", "llama_activation-gelu"
    entries: tuple[Entry, ...]  # the study's fields for it, in the order they apply
    where: Loc  # what names it in the study file: ("variants", name), an axis value, or ("base",)
    spec: Spec  # at the first seed


@dataclass(frozen=True)
class Trial:
    name: str  # its run folder under the study's folder: LABEL-seedN
    variant: str
    seed: int
    spec: Spec


@dataclass(frozen=True)
class Plan:
    study: StudyFile
    folder: Path  # runs_dir/NAME, absolute: the trials' runs, and study.json
    variants: list[Variant]
    baseline: str

    @property
    def name(self) -> str:
        return self.study.name

    def trials(self, steps: dict[str, int] | None = None) -> list[Trial]:
        """Every variant at every seed, seed by seed (so that an early stop leaves whole sets of
        variants); ``steps`` gives each variant's train.steps when the budget is wall time."""
        out = []
        for seed, variant in itertools.product(self.study.study.seeds, self.variants):
            train: dict[str, Any] = {"seed": seed, "name": f"{variant.label}-seed{seed}"}
            if steps is not None:
                train["steps"] = steps[variant.label]
            out.append(Trial(train["name"], variant.label, seed, variant.spec.replace({"train": train})))
        return out


def plan_study(study: StudyFile) -> Plan:
    """The study's variants as validated specs; a SpecError locates every problem in the study file."""
    s = study.study
    base = study.path.parent / s.base
    wrong = _not_a_spec(base, s.base)
    if wrong is not None:
        raise study.error([study.issue(("base",), *wrong)])
    load_spec(base)  # the base spec's own mistakes, reported in its own file
    folder = (s.runs_dir / study.name).resolve()  # absolute: trials run in other processes, maybe machines
    fixed = {"train.seed": s.seeds[0], "train.eval_seed": s.seeds[0], "train.runs_dir": str(folder)}
    if s.budget.steps is not None:
        fixed["train.steps"] = s.budget.steps
    specs = _TrialSpecs(study, base, fixed)
    variants, issues = [], []
    for label, entries, where in _drafts(study):
        run = label + specs.seed_suffix
        if not is_name(run):
            message = (
                f"variant {label!r} names its runs {run!r}: {len(run)} characters, over 100 (or with '..')"
            )
            issues.append(study.issue(where, message, "vary fewer fields in axes, or name the variants"))
            continue
        try:
            variants.append(Variant(label, entries, where, specs.build(label, entries, where)))
        except SpecError as e:
            issues += e.issues
    issues += _collisions(study, variants)
    if issues:
        raise study.error(issues)
    baseline = next(v for v in variants if s.baseline is None or v.where[:2] == ("variants", s.baseline))
    if s.match_parameters is not None:
        variants = specs.match_parameters(s.match_parameters, variants, baseline)
    if s.budget.tokens is not None:
        _check_token_steps(study, variants, s.budget.tokens)
        variants = [replace(v, spec=_steps_for_tokens(v.spec, s.budget.tokens)) for v in variants]
    return Plan(study, folder, variants, baseline.label)


def _check_token_steps(study: StudyFile, variants: list[Variant], tokens: int) -> None:
    """A SpecError at budget.tokens when the budget gives a variant more than MAX_STEPS steps."""
    over = [v for v in variants if _token_steps(v.spec, tokens) > MAX_STEPS]
    if not over:
        return
    spec = over[0].spec
    per_step = _tokens_per_step(spec)
    others = f" (and {len(over) - 1} other variant{'s' * (len(over) > 2)})" if len(over) > 1 else ""
    message = (
        f"{tokens:,} tokens are {_token_steps(spec, tokens):,} steps of {per_step:,} tokens (batch_size x "
        f"grad_accum x context_length) for variant {over[0].label!r}{others}, over the limit of "
        f"{MAX_STEPS:,} steps"
    )
    fewest = min(_tokens_per_step(v.spec) for v in variants)
    hint = f"give at most {MAX_STEPS * fewest:,} tokens, or more tokens a step"
    raise study.error([study.issue(("budget", "tokens"), message, hint)])


def _not_a_spec(base: Path, given: Path) -> tuple[str, str] | None:
    """(what it is, what to give instead) when the study's ``base`` is no spec: nothing, a study,
    a folder, a file that is not YAML, or YAML without a spec's sections, whose loader would
    report its every line as the spec's mistakes; None for a spec."""
    kind = kind_of(base)
    if kind is Kind.MISSING:
        return f"no spec at {base}", "base is relative to the study file"
    if kind is Kind.STUDY:
        return f"{base} is a study file, not a spec", "name the spec that study starts from (its `base:`)"
    if kind in (Kind.RUN, Kind.BUNDLE):
        return f"{base} is {kind.value}, not a spec", f"name the spec it holds: base: {given / SPEC_FILE}"
    found = file_type(base)
    if kind is not Kind.SPEC:
        what = kind.value if found in (REGULAR_FILE, FOLDER) else found
        return (
            f"{base} is {what}, not a spec",
            "a spec is a YAML file named .yaml or .yml (specs/ holds examples)",
        )
    keys = top_level_keys(base)
    sections = list(Spec.model_fields)
    if keys and not keys & set(sections):
        return (
            f"{base} is YAML without a spec's sections ({', '.join(sections)}): it has "
            f"{', '.join(sorted(keys))}",
            "name a spec (specs/ holds examples)",
        )
    return None


def _collisions(study: StudyFile, variants: list[Variant]) -> list[SpecIssue]:
    """Variants of one name, of names that differ only in case (one folder where the file system
    ignores case, as macOS's and Windows' do), or that train one spec (the same trials twice)."""
    issues = []
    names: dict[str, Variant] = {}
    specs: list[tuple[dict[str, Any], Variant]] = []
    for variant in variants:
        other = names.setdefault(variant.label.lower(), variant)
        if other.label == variant.label and other is not variant:
            message = f"two variants are named {variant.label!r}"
            issues.append(study.issue(other.where, message, "make the values distinct"))
        elif other is not variant:
            message = (
                f"variants {other.label!r} and {variant.label!r} differ only in case: their runs' "
                f"folders are one on macOS and Windows"
            )
            issues.append(study.issue(variant.where, message, "rename one of them"))
        dump = variant.spec.model_dump()
        del dump["train"]["name"]
        twin = next((v for d, v in specs if d == dump), None)
        if twin is not None and other is variant:
            message = f"variant {variant.label!r} trains the same spec as variant {twin.label!r}"
            issues.append(study.issue(variant.where, message, "change one of them, or remove it"))
        specs.append((dump, variant))
    return issues


def _steps_for_tokens(spec: Spec, tokens: int) -> Spec:
    return spec.replace({"train": {"steps": _token_steps(spec, tokens)}})


def _token_steps(spec: Spec, tokens: int) -> int:
    return -(-tokens // _tokens_per_step(spec))  # exact, rounded up


def _tokens_per_step(spec: Spec) -> int:
    return spec.train.batch_size * spec.train.grad_accum * spec.context_length


def _drafts(study: StudyFile) -> list[tuple[str, tuple[Entry, ...], Loc]]:
    """(label, entries, where) of each named variant at each combination of the axes' values."""
    s = study.study
    common = tuple(Entry(("overrides", key), key, value) for key, value in s.overrides.items())
    named: list[tuple[str | None, tuple[Entry, ...], Loc]] = [
        (name, tuple(Entry(("variants", name, k), k, v) for k, v in fields.items()), ("variants", name))
        for name, fields in s.variants.items()
    ] or [(None, (), ("base",))]
    axes = [[Entry(("axes", key, i), key, v) for i, v in enumerate(values)] for key, values in s.axes.items()]
    out = []
    for (name, entries, where), values in itertools.product(named, itertools.product(*axes)):
        parts = [name] if name else []
        parts += [f"{e.field.rsplit('.', 1)[-1]}-{_slug(e.value)}" for e in values]
        # An axis value names a variant of a study without named ones.
        out.append(
            (
                "_".join(parts) or BASE_LABEL,
                common + entries + values,
                values[-1].loc if values and not name else where,
            )
        )
    return out


def _slug(value: Any) -> str:
    """An axis value as part of a folder name: 0.001, gelu, rope-500 for {type: rope, theta: 500}."""
    parts = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
    text = "-".join(str(p).lower() if isinstance(p, bool) else str(p) for p in parts)
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or "value"


class _TrialSpecs:
    """Trial specs from the base spec's contents and the study's entries, with the study file's
    marks moved to the spec fields they set, so that the spec layer's errors land in the study."""

    def __init__(self, study: StudyFile, base: Path, fixed: dict[str, Any]) -> None:
        self.study = study
        self.base = base
        _, self.base_data, _ = read_yaml(base)
        self.fixed = fixed
        # The longest of a variant's trial names, so that a name too long for a folder shows here.
        self.seed_suffix = f"-seed{max(study.study.seeds, key=lambda seed: len(str(seed)))}"

    def build(
        self, label: str, entries: tuple[Entry, ...], where: Loc, extra: dict[str, Any] | None = None
    ) -> Spec:
        data = copy.deepcopy(self.base_data)
        marks: dict[Loc, Mark] = {}
        setters: dict[str, str] = {}  # spec field -> the study's dotted path that sets it
        issues = []
        for entry in entries:
            keys = tuple(entry.field.split("."))
            blocked = set_field(data, keys, copy.deepcopy(entry.value))
            if blocked is not None:
                section, field = ".".join(keys[: blocked + 1]), keys[blocked + 1]
                message = f"{section} is not a section in the base spec, so it has no field {field!r}"
                hint = f"set {section} as a whole, e.g. {section}: {{type: ..., {field}: ...}}"
                issues.append(self.study.issue(entry.loc, message, hint, on_key=True))
                continue
            for old in [loc for loc in marks if loc[: len(keys)] == keys]:
                del marks[old]  # an earlier entry's positions under this field hold its values no more
            marks |= self._marks(entry, keys)
            setters[entry.field] = ".".join(map(str, entry.loc))
        if issues:
            raise self.study.error(issues)
        for field, value in {**self.fixed, "train.name": label + self.seed_suffix, **(extra or {})}.items():
            set_field(data, tuple(field.split(".")), value)
        try:
            return spec_from_data(data, marks, str(self.study.path), self.study.text, self.base.parent)
        except SpecError as e:
            raise self.study.error(
                [self._moved(issue, label, where, setters) for issue in e.issues]
            ) from None

    def _marks(self, entry: Entry, keys: tuple[str, ...]) -> dict[Loc, Mark]:
        """The study's marks of ``entry`` and of the values below it, at the spec fields they set;
        a dotted key's mark points at its last part (``activation`` of ``model.activation``)."""
        own = self.study.marks[entry.loc]
        shift = len(entry.field) - len(keys[-1]) if isinstance(entry.loc[-1], str) else 0
        depth = len(entry.loc)
        below = {
            (*keys, *loc[depth:]): mark
            for loc, mark in self.study.marks.items()
            if len(loc) > depth and loc[:depth] == entry.loc
        }
        return {keys: replace(own, key_column=own.key_column + shift), **below}

    def _moved(self, issue: SpecIssue, label: str, where: Loc, setters: dict[str, str]) -> SpecIssue:
        """A trial spec's issue as the study's: named by the study's path to the field, or, when
        the field is the base spec's, placed at the variant with a note that says so."""
        setter = next((f for f in setters if issue.path == f or issue.path.startswith(f"{f}.")), None)
        if setter is not None:
            return replace(issue, path=setters[setter] + issue.path[len(setter) :])
        at = self.study.issue(where, "")
        note = f"in variant {label!r}: `{issue.path}` is the base spec's ({self.base}) or its default"
        return replace(issue, line=at.line, column=at.column, width=at.width, note=note)

    def match_parameters(
        self, match: MatchParameters, variants: list[Variant], baseline: Variant
    ) -> list[Variant]:
        """Each variant with ``match.field`` set where its parameter count comes closest to the
        baseline's; a SpecError at match_parameters when that is not within the tolerance."""
        target = baseline.spec.parameter_count()
        if target is None:
            missing = ", ".join(baseline.spec.sizes_from_data())
            message = f"counting parameters needs {missing}, which the base spec leaves to the data"
            hint = "set it in `overrides:` (training says so when the data's differs)"
            raise self.study.error([self.study.issue(("match_parameters",), message, hint)])
        width = _value_at(baseline.spec.model_dump(), match.field.split("."))
        if not isinstance(width, int) or isinstance(width, bool):
            message = f"{match.field} is not an integer field of the spec, found {width!r}"
            hint = "name a width such as model.d_ff or model.d_model"
            raise self.study.error([self.study.issue(("match_parameters", "field"), message, hint)])
        out, issues = [], []
        for variant in variants:
            own = [e for e in variant.entries if e.loc[0] != "overrides" and _covers(e.field, match.field)]
            if variant is baseline:
                out.append(variant)
            elif own:
                message = f"match_parameters sets {match.field} in every variant but the baseline"
                hint = "remove it here, or match another field"
                issues.append(
                    self.study.issue(own[0].loc, message, hint, on_key=isinstance(own[0].loc[-1], str))
                )
            else:
                closest = _closest(functools.partial(self._count, variant, match.field), width, target)
                if closest is None:
                    message = f"no value of {match.field} gives variant {variant.label!r} a valid spec"
                    issues.append(
                        self.study.issue(("match_parameters", "field"), message, "match another field")
                    )
                    continue
                value, count = closest
                if abs(count - target) > match.tolerance * target:
                    issues.append(
                        self.study.issue(
                            ("match_parameters", "tolerance"),
                            f"variant {variant.label!r} comes no closer than {count:,} parameters "
                            f"({(count - target) / target:+.1%}) to the baseline's {target:,} "
                            f"({match.field} {value})",
                            "match a finer width, such as model.d_ff, or raise the tolerance",
                        )
                    )
                spec = self.build(variant.label, variant.entries, variant.where, {match.field: value})
                out.append(replace(variant, spec=spec))
        if issues:
            raise self.study.error(issues)
        return out

    def _count(self, variant: Variant, field: str, value: int) -> int | None:
        """The variant's parameters with ``field`` at ``value``; None where that does not validate."""
        try:
            return self.build(variant.label, variant.entries, variant.where, {field: value}).parameter_count()
        except SpecError:
            return None


def _closest(count: Callable[[int], int | None], start: int, target: int) -> tuple[int, int] | None:
    """(value, count) with the count closest to ``target``, for a count that grows with the value
    and is undefined (None) at some values (a d_model that n_heads does not divide); None when no
    value near ``start`` or the target is defined."""
    reach = 256  # how far from a value to look for a defined count

    def defined(values: range) -> tuple[int, int] | None:
        return next(((v, c) for v in values if (c := count(v)) is not None), None)

    low, high = 1, max(start, 1)
    while (found := defined(range(high, high + reach))) is not None and found[1] < target and high < 1 << 30:
        low, high = high, 2 * high
    while low < high:  # the least value from which the next defined count reaches the target
        middle = (low + high) // 2
        found = defined(range(middle, middle + reach))
        if found is not None and found[1] >= target:
            high = middle
        else:
            low = middle + 1
    candidates = [defined(range(high, high + reach)), defined(range(high - 1, max(high - reach, 0), -1))]
    return min(
        (c for c in candidates if c is not None), key=lambda vc: (abs(vc[1] - target), vc[0]), default=None
    )


def _covers(entry: str, field: str) -> bool:
    """Whether setting ``entry`` sets ``field`` (itself, or a section that holds it)."""
    return field == entry or field.startswith(f"{entry}.")


def _value_at(data: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data
