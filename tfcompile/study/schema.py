"""The study file: a base spec, what varies between its variants, the seeds, and the budget every
trial gets. It is read by the spec layer's loader, so a mistake is reported at its line, field and
fix exactly as a spec's are (a SpecError: the CLI exits 2).

    base: ../specs/shakespeare-char.yaml     # relative to the study file
    overrides: {model.d_model: 128}          # dotted fields, as --set, that every trial sets
    variants:                                # named variants: sets of dotted fields
      vaswani: {model.norm.position: post}
      pre-ln: {}                             # the base as it is
    axes: {train.optimizer.lr: [1.0e-3, 3.0e-3]}   # or a grid: every combination of the values
    seeds: [1, 2, 3]
    budget: {steps: 2000}                    # or tokens, or seconds
    match_parameters: {field: model.d_ff}    # within 2% of the baseline's count

No torch here: checking a study file, its trials' specs included, takes a fraction of a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.loader import FIELD_NAME, Loc, Mark, read_yaml, validation_issues
from tfcompile.spec.schema import MAX_STEPS, RUN_NAME, PositiveFloat, PositiveInt, Rules, Section, Seed

Fields = dict[str, Any]  # dotted field -> value (YAML), as in --set FIELD=VALUE


# The largest budget a study takes: far past any training run, short of step counts (1.5e18 from
# a token budget of 1e20) that would train until the machine is gone. The steps a token or a
# wall-time budget gives are held to MAX_STEPS (a spec's train.steps limit) as well (plan.py, sweep.py).
MAX_TOKENS = 10**18
MAX_SECONDS = 366 * 24 * 3600  # a year
# The most trials a study plans: every one a training run and a row of results.csv. A grid of
# axes grows as the product of their lengths, and planning takes milliseconds a variant.
MAX_TRIALS = 1000


class Budget(Section):
    """What every trial is given, the same for every variant: exactly one of the three."""

    steps: Annotated[PositiveInt, Field(le=MAX_STEPS)] | None = Field(
        None, description=f"optimizer steps (train.steps), at most {MAX_STEPS:,}"
    )
    tokens: Annotated[PositiveInt, Field(le=MAX_TOKENS)] | None = Field(
        None,
        description="training tokens: train.steps = tokens / (batch_size x grad_accum x context_length), "
        f"rounded up (at most {MAX_STEPS:,} steps)",
    )
    seconds: Annotated[PositiveFloat, Field(le=MAX_SECONDS)] | None = Field(
        None,
        description="training wall time: each variant's train.steps is set from a short timed probe of it, "
        "so that every variant completes its learning-rate schedule in about this time (at most a year)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        given = [name for name in ("steps", "tokens", "seconds") if getattr(self, name) is not None]
        rules = Rules()
        rules.require(
            len(given) == 1,
            (given[1],) if len(given) > 1 else (),
            f"give exactly one of steps, tokens and seconds, found {' and '.join(given) or 'none'}",
            "e.g. budget: {steps: 2000}",
        )
        rules.check()
        return self


class MatchParameters(Section):
    """Hold the parameter count equal: every variant's ``field`` (an integer width) is set so that
    its count is within ``tolerance`` of the baseline's."""

    field: str = Field(description="a dotted integer field of the model, e.g. model.d_ff or model.d_model")
    tolerance: Annotated[float, Field(gt=0, lt=1)] = 0.02

    @model_validator(mode="after")
    def _a_width(self) -> MatchParameters:
        section, _, name = self.field.partition(".")
        rules = Rules()
        rules.require(
            section == "model" and name not in DATA_SIZES,
            ("field",),
            f"match_parameters adjusts a width of the model, found {self.field}"
            + (
                ": the data's size, which a matched variant would no longer fit" if name in DATA_SIZES else ""
            ),
            "e.g. model.d_ff, model.d_model or model.n_layers",
        )
        rules.check()
        return self


# Model fields that the data or the task sizes, not widths a study may adjust.
DATA_SIZES = {"vocab_size", "max_seq_len", "type_vocab_size", "image_size", "patch_size", "num_channels"}


class Study(Section):
    name: str | None = Field(None, description="the study's folder under runs_dir; default: the file's stem")
    base: Path = Field(description="the spec every trial starts from, relative to the study file")
    overrides: Fields = Field(default_factory=dict, description="dotted fields every trial sets")
    variants: dict[str, Fields] = Field(
        default_factory=dict,
        description="named variants, each a set of dotted fields (an empty one: the base)",
    )
    axes: dict[str, list[Any]] = Field(
        default_factory=dict, description="dotted field -> values; every combination is a variant"
    )
    baseline: str | None = Field(None, description="the variant others are compared with; default: the first")
    seeds: list[Seed] = Field(
        [1337], min_length=1, description="every variant trains once per seed (train.seed)"
    )
    budget: Budget
    match_parameters: MatchParameters | None = None
    runs_dir: Path = Field(Path("runs"), description="trials are runs under runs_dir/NAME/")

    @field_validator("variants", mode="before")
    @classmethod
    def _empty_variant(cls, variants: Any) -> Any:
        """``name:`` with nothing after it is the base as it is."""
        return (
            {k: {} if v is None else v for k, v in variants.items()}
            if isinstance(variants, dict)
            else variants
        )

    @model_validator(mode="after")
    def _rules(self) -> Study:
        rules = Rules()
        if self.name is not None:
            rules.require(
                is_name(self.name),
                ("name",),
                f"a study's name is a folder name of ASCII letters, digits, '.', '_' and '-', found "
                f"{self.name!r}",
                "e.g. name: norms-study",
            )
        for name in self.variants:
            rules.require(
                is_name(name) and len(name) <= 60,
                ("variants", name),
                f"a variant's name is part of its runs' folder names: ASCII letters, digits, '.', '_' "
                f"and '-' (at most 60), found {name!r}",
                "e.g. pre-rmsnorm",
            )
        sections: list[tuple[tuple[str, ...], dict[str, Any]]] = [
            (("overrides",), self.overrides),
            (("axes",), self.axes),
        ]
        sections += [(("variants", name), fields) for name, fields in self.variants.items()]
        for loc, fields in sections:
            for key in fields:
                rules.require(
                    all(FIELD_NAME.fullmatch(part) for part in key.split(".")),
                    (*loc, key),
                    f"{key!r} is not a dotted field of a spec",
                    "write it as section.field, e.g. model.norm.position",
                )
                rules.require(
                    key not in STUDY_FIELDS,
                    (*loc, key),
                    f"{key} is set by the study: {STUDY_FIELDS.get(key)}",
                    "remove it",
                )
        for key, values in self.axes.items():
            rules.require(
                len(values) > 0, ("axes", key), "an axis needs at least one value", "list its values"
            )
        rules.require(
            self.baseline is None or self.baseline in self.variants,
            ("baseline",),
            f"the baseline must be one of the variants ({', '.join(map(repr, self.variants)) or 'none'}), "
            f"found {self.baseline!r}",
            "name a variant, or leave it out for the first",
        )
        trials = max(len(self.variants), 1) * math.prod(map(len, self.axes.values())) * len(self.seeds)
        rules.require(
            trials <= MAX_TRIALS,
            ("axes",) if self.axes else ("seeds",),
            f"{trials:,} trials ({' x '.join(self._factors())}), over the limit of {MAX_TRIALS:,}",
            "compare fewer values at once: split the study, or drop values from the axes",
        )
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        rules.require(
            not repeated,
            ("seeds",),
            f"each seed once: {', '.join(map(str, repeated))} repeated",
            "list distinct seeds",
        )
        rules.check()
        return self

    def _factors(self) -> list[str]:
        """What the number of trials is the product of: "2 variants", "10 values of model.d_ff"."""
        named = [f"{len(self.variants)} variants"] if self.variants else []
        axes = [f"{len(values)} values of {key}" for key, values in self.axes.items()]
        return [*named, *axes, f"{len(self.seeds)} seed{'s' * (len(self.seeds) > 1)}"]

    def study_name(self, path: Path) -> str:
        return self.name or path.stem


# Fields a study sets in every trial's spec, and where they come from.
STUDY_FIELDS = {
    "train.seed": "each trial takes one of `seeds:`",
    "train.eval_seed": "every trial draws the validation batches of the first seed",
    "train.steps": "`budget:` gives the steps",
    "train.name": "each trial is named after its variant and seed",
    "train.runs_dir": "trials are runs under `runs_dir:`/NAME",
}


def is_name(name: str) -> bool:
    return RUN_NAME.fullmatch(name) is not None and ".." not in name


@dataclass(frozen=True)
class StudyFile:
    """A validated study and what locates its problems: the file's text and the marks of its keys."""

    path: Path
    study: Study
    text: str
    marks: dict[Loc, Mark]

    @property
    def name(self) -> str:
        return self.study.study_name(self.path)

    def error(self, issues: list[SpecIssue]) -> SpecError:
        return SpecError(str(self.path), list(dict.fromkeys(issues)), self.text)

    def issue(self, loc: Loc, message: str, hint: str | None = None, on_key: bool = False) -> SpecIssue:
        """A problem at a key (``on_key``) or value of the file, or at the nearest section holding it."""
        while loc and loc not in self.marks:
            loc = loc[:-1]
        path = ".".join(map(str, loc))
        if not loc:
            return SpecIssue(path, message, hint)
        m = self.marks[loc]
        if on_key:
            return SpecIssue(path, message, hint, m.key_line, m.key_column, len(str(loc[-1])))
        return SpecIssue(path, message, hint, m.line, m.column, m.width)


def load_study(path: str | Path) -> StudyFile:
    """Read and validate a study file; a SpecError lists every problem at its line."""
    path = Path(path)
    text, data, marks = read_yaml(path, what="study")
    if not isinstance(data, dict):
        issue = SpecIssue(
            "", "a study is a mapping with `base:`, `seeds:` and `budget:`", "start with `base:`", 1, 1
        )
        raise SpecError(str(path), [issue], text)
    try:
        study = Study.model_validate(data)
    except ValidationError as e:
        raise SpecError(str(path), validation_issues(e, data, marks, root=Study), text) from None
    return StudyFile(path, study, text, marks)
