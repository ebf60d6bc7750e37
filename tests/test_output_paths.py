"""An output path that cannot be written (a file where a folder must go, a file system that makes
no folders) or a run folder that cannot be made ends every command with one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcompile.cli import main

UNWRITABLE = {
    "file in the way": lambda tmp: _file(tmp) / "sub" / "out",
    "a file system that makes no folders": lambda tmp: Path("/proc/tfcompile-test/out"),
    "a folder that takes no new entries": lambda tmp: Path("/proc/tfcompile-test-out"),
}
COMMANDS = {
    "export": lambda run, bundle, out: ["export", str(run), "--out", str(out)],
    "optimize": lambda run, bundle, out: ["optimize", str(bundle), "--out", str(out), "--fuse"],
    "export-triton": lambda run, bundle, out: ["export-triton", str(bundle), "--out", str(out)],
    "export-genai": lambda run, bundle, out: ["export-genai", str(bundle), "--out", str(out)],
    "plot": lambda run, bundle, out: ["plot", str(run), "--out", f"{out}.png"],
}


def _file(tmp: Path) -> Path:
    (tmp / "a-file").write_text("mine\n")
    return tmp / "a-file"


@pytest.mark.parametrize("where", UNWRITABLE)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_unwritable_out_is_one_line(
    command: str, where: str, char_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    out = UNWRITABLE[where](tmp_path)
    argv = COMMANDS[command](char_bundle.parent / "run", char_bundle, out)
    assert main(argv) == 1
    err = capsys.readouterr().err  # a spinner's line, then the error
    assert err.splitlines()[-1].startswith(f"tfcompile {command}: error: ") and "Traceback" not in err, err
    assert "/." not in err.splitlines()[-1], err  # named by the path given, not a hidden staging folder
    if where == "file in the way":
        assert (tmp_path / "a-file").read_text() == "mine\n"


def test_a_run_folder_that_cannot_be_made_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from helpers import ONE_STEP, ROOT, TINY

    spec = str(ROOT / "specs" / "shakespeare-char.yaml")
    sets = [arg for o in [*TINY, *ONE_STEP, "train.runs_dir=/proc/tfcompile-runs"] for arg in ("--set", o)]
    assert main(["train", spec, *sets]) == 1  # it spun forever before
    err = capsys.readouterr().err
    assert (
        "cannot make the run folder /proc/tfcompile-runs" in err.splitlines()[-1] and "Traceback" not in err
    )


def test_what_tfcompile_writes_has_the_permissions_the_umask_gives(char_bundle: Path) -> None:
    """Folders staged with mkdtemp (0700) and files with mkstemp (0600) are opened up to what a
    plain mkdir or open would have made, so that a bundle or run is readable where the user's
    other files are."""
    from tfcompile.files import umask

    mask = umask()
    for root in (char_bundle, char_bundle.parent / "run"):
        for path in [root, *root.rglob("*")]:
            expected = (0o777 if path.is_dir() else 0o666) & ~mask
            assert path.stat().st_mode & 0o777 == expected, f"{path}: {oct(path.stat().st_mode & 0o777)}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "plot"])
def test_the_current_folder_as_out_is_refused_by_name(
    command: str,
    char_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An empty current folder as --out was written beside itself (its parent is itself) and then
    "filled by something else while this command wrote it"."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    argv = COMMANDS[command](char_bundle.parent / "run", char_bundle, "x")
    argv[argv.index("x")] = "."
    assert main(argv) == 1
    assert "--out '.' is the current folder: name a new folder in it" in capsys.readouterr().err
    assert not any(here.iterdir()) and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_write_that_fails_names_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A full disk while the token cache was written said "No space left on device", naming no
    file: the failed write of any file tfcompile writes whole names it (here past a size limit)."""
    import subprocess
    import sys

    code = (
        "import resource, signal, sys\nfrom pathlib import Path\n"
        "from tfcompile.files import atomic_write_bytes\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "try:\n    atomic_write_bytes(Path(sys.argv[1]), bytes(5000))\n"
        "except OSError as e:\n    print(e.filename, e.strerror)"
    )
    target = tmp_path / "tokens.npy"
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)], capture_output=True, text=True, check=True
    )
    assert out.stdout == f"{target} File too large\n" and list(tmp_path.iterdir()) == []
