"""A third review of specs: values YAML reads otherwise than written (yes for a number), a
variant's short form beside a preset or under --set, a section left empty, an empty path."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import MODEL_YAML

from tfcompile.spec import SpecError, load_spec, parse_spec
from tfcompile.study.plan import plan_study
from tfcompile.study.schema import load_study


def error_of(text: str, overrides: tuple[str, ...] = ()) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.yaml", overrides=list(overrides))
    return caught.value


def test_a_boolean_where_a_number_is_meant_is_refused_at_each_field() -> None:
    """`lr: yes` trained at a learning rate of 1.0: Pydantic takes a boolean for 1.0 in a float."""
    text = (
        MODEL_YAML + "  init_std: yes\ntrain:\n  grad_clip: on\n  optimizer: {lr: true, weight_decay: no}\n"
    )
    error = error_of(text)
    assert [(i.path, i.line) for i in error.issues] == [
        ("model.init_std", 7),
        ("train.grad_clip", 9),
        ("train.optimizer.lr", 10),
        ("train.optimizer.weight_decay", 10),
    ]
    assert error.issues[0].message == "expected a valid number, found true"
    assert error.issues[3].message == "expected a valid number, found false"
    assert all(
        i.hint == "write a number: YAML reads yes, no, on and off as true and false" for i in error.issues
    )


def test_a_boolean_inside_a_list_of_numbers_is_refused_at_its_item() -> None:
    """`betas: [0.9, no]` trained with a second beta of 0.0."""
    error = error_of(MODEL_YAML + "train:\n  optimizer:\n    betas: [0.9, no]\n")
    assert [(i.path, i.line, i.message) for i in error.issues] == [
        ("train.optimizer.betas.1", 9, "expected a valid number, found false")
    ]
    error = error_of(MODEL_YAML, ("train.optimizer.betas=[on, 0.9]",))
    assert [i.path for i in error.issues] == ["train.optimizer.betas.0"]


def test_a_section_without_its_type_changes_the_default_variant() -> None:
    """--set train.schedule.warmup_steps=10 beside no schedule said "missing `type`", though the
    default schedule (cosine) has the field; a preset's variant is still the one changed, and
    fields of another variant still ask for its type."""
    spec = parse_spec(MODEL_YAML, overrides=["train.schedule.warmup_steps=10"])
    assert (spec.train.schedule.type, spec.train.schedule.warmup_steps) == ("cosine", 10)
    spec = parse_spec(MODEL_YAML + "train:\n  schedule: {min_lr_ratio: 0.5}\n")
    assert spec.train.schedule.type == "cosine" and spec.train.schedule.min_lr_ratio == 0.5
    spec = parse_spec("preset: vaswani\n", overrides=["train.schedule.warmup_steps=10"])
    assert (spec.train.schedule.type, spec.train.schedule.warmup_steps) == ("vaswani", 10)
    error = error_of(MODEL_YAML + "  positional: {theta: 3}\n")
    assert [(i.path, i.message) for i in error.issues] == [("model.positional", "missing `type`")]


def test_booleans_and_numbers_still_go_where_they_belong() -> None:
    spec = parse_spec(
        MODEL_YAML + "  tie_embeddings: yes\n  init_std: 1\ntrain: {grad_clip: 1, precision: fp32, "
        "optimizer: {betas: [0, 0.5]}}\n"
    )
    assert spec.model.tie_embeddings is True and spec.model.init_std == 1.0 and spec.train.grad_clip == 1.0
    assert spec.train.optimizer.betas == (0.0, 0.5)


@pytest.mark.parametrize(
    ("text", "field", "preset_value"),
    [
        ("preset: bert\ntask: masked_lm\n", "task.next_sentence", True),
        ("preset: vaswani\ntask: causal_lm\n", "task.label_smoothing", 0.1),
        ("preset: llama\nmodel:\n  positional: rope\n", "model.positional.theta", 10000.0),
    ],
)
def test_a_variants_short_form_keeps_the_presets_fields_of_that_variant(
    text: str, field: str, preset_value: object
) -> None:
    """`task: masked_lm` replaced the preset's whole task section (BERT without next-sentence
    prediction), though `{type: masked_lm}` kept it: the same variant, written two ways."""
    value: object = parse_spec(text)
    for part in field.split("."):
        value = getattr(value, part)
    assert value == preset_value


def test_a_variant_the_short_form_changes_replaces_the_presets_section() -> None:
    spec = parse_spec("preset: llama\nmodel:\n  positional: alibi\n")
    assert spec.model.positional.type == "alibi"


def test_set_reaches_into_a_short_form_an_empty_section_and_a_null_one() -> None:
    text = MODEL_YAML + "  positional: rope\n  moe: null\ntask: causal_lm\ndata:\n"
    spec = parse_spec(
        text,
        overrides=[
            "model.positional.theta=500000",
            "model.moe.experts=4",
            "model.moe.top_k=2",
            "task.label_smoothing=0.1",
            "data.path=corpus.txt",
        ],
    )
    assert (
        spec.model.positional.theta == 500000 and spec.model.moe is not None and spec.model.moe.experts == 4
    )
    assert spec.task.label_smoothing == 0.1 and spec.data is not None and spec.data.path is not None


def test_set_into_a_short_form_of_another_variant_names_the_variant_that_has_the_field() -> None:
    (issue,) = error_of(MODEL_YAML + "  positional: learned\n", ("model.positional.theta=5",)).issues
    assert issue.path == "model.positional.theta" and issue.hint == "'theta' is a field of type 'rope'"


def test_set_of_a_lists_item_says_lists_are_set_whole() -> None:
    """--set train.optimizer.betas.0=0.5 said only "bad override"."""
    (issue,) = error_of(MODEL_YAML, ("train.optimizer.betas.0=0.5",)).issues
    assert issue.message == "--set names fields, not a list's items (0): a list is set whole"
    betas = "train.optimizer.betas"
    assert issue.hint == f"where {betas} is a list, write every item, e.g. --set {betas}=[0.5, ...]"


def test_set_under_a_field_that_is_no_section_is_still_refused() -> None:
    text = MODEL_YAML + "data: {path: corpus.txt}\n"
    (issue,) = error_of(text, ("data.path.x=1",)).issues
    assert issue.message == "data.path is not a section, so it has no field 'x'"


@pytest.mark.parametrize("path", ['""', "'  '"])
def test_an_empty_data_path_is_refused_not_read_as_the_specs_folder(path: str) -> None:
    (issue,) = error_of(MODEL_YAML + f"data: {{path: {path}}}\n").issues
    assert issue.path == "data.path" and issue.line == 7
    assert issue.message.startswith("expected the path of a file or folder, found ")


def test_a_percentage_is_read_as_a_fraction_only_where_the_field_is_one() -> None:
    text = (
        MODEL_YAML
        + "  dropout: {residual: 10%}\ntask: {type: causal_lm, top_p: 90%}\ntrain: {grad_clip: 10%}\n"
    )
    residual, top_p, clip = error_of(text).issues
    assert residual.hint == "write 0.1: a fraction, not a percentage" and clip.hint is None
    assert top_p.hint == "write 0.9: a fraction, not a percentage"  # an optional field's bound


def test_another_tools_epsilon_is_the_norms_eps() -> None:
    (issue,) = error_of(MODEL_YAML + "  norm: {epsilon: 1.0e-6}\n").issues
    assert issue.path == "model.norm.epsilon" and issue.hint == "did you mean 'eps'?"


def test_an_abbreviated_field_is_suggested_in_full() -> None:
    (issue,) = error_of(MODEL_YAML + "task: {type: causal_lm, temp: 0.8}\n").issues
    assert issue.path == "task.temp" and issue.hint == "did you mean 'temperature'?"


@pytest.mark.parametrize(
    ("text", "overrides"),
    [
        ("preset: gpt2\nmodel: {norm: rmsnorm}\n", ()),  # norm's type is a field, not a variant's name
        (MODEL_YAML + "  norm: rmsnorm\n", ("model.norm.eps=1e-6",)),
        ("preset: bert\ntrain: {optimizer: adam}\n", ()),
    ],
)
def test_a_section_without_a_short_form_is_refused_as_a_name_under_a_preset_or_set(
    text: str, overrides: tuple[str, ...]
) -> None:
    (issue,) = error_of(text, overrides).issues
    expected = "model.norm is not a section" if overrides else "expected a mapping of fields, found "
    assert issue.message.startswith(expected)


def test_a_study_sets_a_field_of_its_bases_short_form(tmp_path: Path) -> None:
    """A study's fields are set as --set sets them: into `positional: rope` too."""
    base = tmp_path / "base.yaml"
    base.write_text(MODEL_YAML + "  positional: rope\n")
    study = tmp_path / "study.yaml"
    study.write_text(
        f"base: {base}\nvariants:\n  slow: {{model.positional.theta: 5000}}\n  fast: {{}}\n"
        f"seeds: [1]\nbudget: {{steps: 2}}\nruns_dir: {tmp_path / 'runs'}\n"
    )
    trials = plan_study(load_study(study)).trials()
    thetas = {trial.name: trial.spec.model.positional.theta for trial in trials}
    assert thetas == {"slow-seed1": 5000.0, "fast-seed1": 10000.0}


@pytest.mark.parametrize("end", ["\r", "\r\n"])
def test_a_file_of_old_mac_or_windows_line_ends_is_reported_at_its_line(tmp_path: Path, end: str) -> None:
    """With lone CRs, a character YAML refuses was reported at 1:35, not 3:14."""
    path = tmp_path / "s.yaml"
    path.write_bytes(f"model:{end}  d_model: 64{end}  n_layers: 2\x01{end}".encode())
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    (issue,) = caught.value.issues
    assert (issue.line, issue.column) == (3, 14)


def test_a_byte_that_is_not_utf8_is_placed_by_lines_as_yaml_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"model:\r  d_model: 64\r  n_layers: 2\xff\r")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    (issue,) = caught.value.issues
    assert (issue.line, issue.column) == (3, 14)


def test_q_k_norms_after_rope_need_rope() -> None:
    (issue,) = error_of(
        MODEL_YAML + "  qk_norm: true\n  qk_norm_after_rope: true\n  positional: alibi\n"
    ).issues
    assert issue.path == "model.qk_norm_after_rope" and "there is no RoPE to come after" in issue.message
