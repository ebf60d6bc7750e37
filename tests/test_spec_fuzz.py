"""Property tests: whatever a spec file or a --set argument holds, `tfcompile validate` answers
with exit 0 (valid) or exit 2 and located errors: never a traceback, never a hang."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import yaml
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcompile.cli import main

SPECS = sorted((ROOT / "specs").glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text()) for p in SPECS]
# About a second per property in the default suite; `pytest --hypothesis-profile=deep` searches
# far longer (tests/conftest.py).
FUZZ = settings(deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["rope", "rmsnorm", "swiglu", "pre", "bf16", "causal_lm", "vit", "digits", "char", "../x", ""]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [prefix] + [p for k, v in node.items() for p in _paths(v, (*prefix, k))]
    return [prefix]


def _set(node: Any, path: tuple, value: Any, rename: str | None = None, delete: bool = False) -> Any:
    if not path:
        return value
    head, *rest = path
    out = dict(node)
    if not rest and delete:
        out.pop(head, None)
    elif not rest and rename is not None:
        out[rename] = out.pop(head)
    else:
        out[head] = _set(node[head], tuple(rest), value, rename, delete)
    return out


@st.composite
def mutated_specs(draw: st.DrawFn) -> str:
    spec = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(spec) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["delete", "rename", "value"]))
        if kind == "delete":
            spec = _set(spec, path, None, delete=True)
        elif kind == "rename":
            spec = _set(spec, path, None, rename=draw(st.text(min_size=1, max_size=12)))
        else:
            spec = _set(spec, path, draw(values))
    return yaml.safe_dump(spec, allow_unicode=True)


def _validate(path: Path, *args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", str(path), *args])
    return code, err.getvalue()


def _assert_located(code: int, err: str, path: Path) -> None:
    assert code in (0, 2), err
    if code == 2:
        assert "error:" in err and (str(path) in err or "--set" in err), err


@FUZZ
@given(text=mutated_specs())
def test_mutated_specs_validate_or_fail_with_a_location(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    _assert_located(*_validate(path), path)


@FUZZ
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_random_bytes_fail_with_a_location(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(data)
    _assert_located(*_validate(path), path)


@FUZZ
@given(
    base=st.sampled_from(SPECS),
    overrides=st.lists(
        st.text(max_size=20)
        | st.builds(
            lambda k, v: f"{k}={v}",
            st.sampled_from(["model.d_model", "train.steps", "model", "a.b.c", "model.norm"]),
            st.text(max_size=20),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_random_overrides_fail_at_the_argument(base: Path, overrides: list[str]) -> None:
    code, err = _validate(base, *[f"--set={o}" for o in overrides])
    _assert_located(code, err, base)
