"""The spec layer declares the names of the building blocks without torch; the nn registries map
each name to a block. The two must agree both ways: every name has a block, every block a name."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest
from helpers import ROOT

from tfcompile.nn import ACTIVATIONS, NORMS, POSITIONAL
from tfcompile.spec import choices
from tfcompile.spec.schema import Positional


def _positional_tags() -> set[str]:
    union = typing.get_args(typing.get_args(Positional)[0])
    return {cls.model_fields["type"].default for cls in union}


@pytest.mark.parametrize(
    ("declared", "registry"),
    [
        (set(choices.NORMS), NORMS),
        (set(choices.ACTIVATIONS), ACTIVATIONS),
        (_positional_tags(), POSITIONAL),
    ],
    ids=["norms", "activations", "positional"],
)
def test_every_spec_name_has_a_block_and_every_block_a_name(declared: set[str], registry) -> None:
    assert declared == set(registry.names())


def test_validate_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from tfcompile.cli import main\n"
        f"assert main(['validate', {str(ROOT / 'specs' / 'llama.yaml')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'validate imported torch'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "56,893,952 parameters" in result.stdout
