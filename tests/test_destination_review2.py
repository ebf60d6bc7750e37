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


def test_a_staging_folder_a_killed_writer_left_is_removed_by_the_next(tmp_path: Path) -> None:
    """An import or export killed by SIGKILL (or the out-of-memory killer) left its hidden staging
    folder, weights and all, for ever: the next writer beside it removes one whose process, on this
    host, is gone; a live writer's, another host's and a replaced bundle set aside (.old) stay."""
    import os
    import subprocess
    import sys

    from tfcompile.files import _host, make_folder_beside

    host = _host()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other_host = "0" * 8 if host != "0" * 8 else "1" * 8
    abandoned = tmp_path / f".bundle.{host}-{gone.pid}.k3j_x9q.tmp"
    kept = [
        tmp_path / f".bundle.{host}-{os.getppid()}.k3j_x9q.tmp",  # a live process's
        tmp_path / f".bundle.{other_host}-{gone.pid}.k3j_x9q.tmp",  # another host's
        tmp_path / f".bundle.{host}-{gone.pid}.k3j_x9q.old",  # the bundle --force replaced
        tmp_path / f".other.{host}-{gone.pid}.k3j_x9q.tmp",  # beside another destination
    ]
    for folder in [abandoned, *kept]:
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"weights")
    staging = staging_folder(tmp_path / "bundle")
    assert not abandoned.exists() and all((f / "model.onnx").exists() for f in kept)
    assert staging.name.startswith(f".bundle.{host}-{os.getpid()}.") and staging.name.endswith(".tmp")
    assert make_folder_beside(tmp_path / "run", ".import", staging=True).name.endswith(".import")
