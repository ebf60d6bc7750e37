"""The spec layer declares the names of the building blocks without torch; the nn registries map
each name to a block. The two must agree both ways: every name has a block, every block a name."""

from __future__ import annotations

import re
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


def test_every_architecture_module_registers_with_the_importer_and_the_readme_names_each() -> None:
    """A new tfcompile/hf module that registers a model_type must be listed in families.py (else
    `tfcompile import` says it has no converter), and the README's import table names every
    model_type that imports. Run in a fresh process, so that no test's own import registers it."""
    code = "from tfcompile.hf.importer import ARCHITECTURES; print(' '.join(sorted(ARCHITECTURES)))"
    registered = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    sources = sorted((ROOT / "tfcompile" / "hf").glob("*.py"))
    declared = {
        name
        for path in sources
        for call in re.findall(r"^@register\(([^)]*)\)", path.read_text(), re.MULTILINE)
        for name in re.findall(r'"([^"]+)"', call)
    }
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([a-z0-9_-]+)`", row.split("|")[1])}
    assert declared == registered
    assert registered <= documented, f"the README's import table leaves out {sorted(registered - documented)}"
