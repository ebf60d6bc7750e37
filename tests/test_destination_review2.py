"""Writing a finished folder into place when something else wrote there meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcompile.destination import move_into_place, staging_folder
from tfcompile.errors import ExportError


def test_a_destination_filled_meanwhile_is_left_as_it_is_and_named(tmp_path: Path) -> None:
    """Two exports to one new folder at once: the second said only 'Directory not empty'."""
    out = tmp_path / "bundle"
    tmp = staging_folder(out)
    (tmp / "manifest.json").write_text("mine")
    out.mkdir()  # the other export's bundle, moved into place after this one's checks
    (out / "manifest.json").write_text("theirs")
    with pytest.raises(ExportError, match=r"bundle was filled by something else while this command wrote it"):
        move_into_place(tmp, out, replacing=False)
    assert (out / "manifest.json").read_text() == "theirs"
    assert (tmp / "manifest.json").read_text() == "mine"  # the caller's to remove
