"""Where tfcompile writes a bundle or hands one on: a new or empty folder, or (when asked) one of
its own bundles, never anything else and never inside the bundle it reads; the new folder is
written beside it and renamed into place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tfcompile.errors import ExportError, UserError
from tfcompile.files import make_folder_beside
from tfcompile.manifest import MANIFEST
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError


def check_outside(
    source: Path,
    out: Path,
    error: type[UserError] = ExportError,
    what: str = "bundle",
    flag: str = "--out",
) -> None:
    """Refuse (``error``) an ``out`` (given by ``flag``) that is the ``source`` folder (a bundle, a
    run, a Hugging Face folder) or inside it, symlinks followed: a command never writes into what it
    reads (export, optimize, export-triton, export-genai, export-hf, import)."""
    read, target = source.resolve(), out.resolve()
    if target == read:
        raise error(f"{flag} {out} is the {what} itself: the source is never changed; choose a new folder")
    if target.is_relative_to(read):
        raise error(f"{out} is inside the {what} {source}: choose a {flag} outside it")


def check_not_a_file(out: Path, error: type[UserError] = ExportError) -> None:
    """``out`` is not a file, a link (written through, it would land elsewhere) or anything else
    than a folder; else ``error``, naming what it is."""
    if out.is_symlink():
        raise error(f"{out} is a symbolic link: choose an --out that is not one")
    if out.resolve() == Path.cwd().resolve():  # it would be written beside itself and renamed over the cwd
        raise error(
            f"--out {str(out)!r} is the current folder: name a new folder in it, e.g. --out {out / 'NAME'}"
        )
    if out.exists() and not out.is_dir():
        raise error(f"{out} exists and is not a folder: choose another --out")


def check_new_folder(out: Path, advice: str = "") -> None:
    """``out`` is missing or an empty folder; anything else is refused, untouched (``advice``
    added to the message)."""
    check_not_a_file(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(
            f"{out} already exists and is not empty; it is left untouched: choose a new --out{advice}"
        )


def check_destination(out: Path, force: bool) -> bool:
    """Whether ``out`` holds a bundle that the write will replace. A missing or empty folder is
    fine; an existing bundle needs ``force``; anything else is refused, untouched."""
    check_not_a_file(out)
    if not out.exists() or not any(out.iterdir()):
        return False
    try:
        listed = set(BundleFiles(out).manifest.files) | {MANIFEST}
    except BundleError as e:
        raise ExportError(
            f"{out} exists and is not a bundle tfcompile wrote ({e}); it is left untouched: "
            f"choose another --out"
        ) from None
    others = sorted(p.name for p in out.iterdir() if p.name not in listed)
    if others:
        raise ExportError(
            f"{out} is a bundle but also holds files it did not write ({', '.join(others[:5])}); it is "
            f"left untouched: move them, or choose another --out"
        )
    if not force:
        raise ExportError(
            f"{out} already holds a bundle: pass --force to replace it, or choose another --out"
        )
    return True


def staging_folder(out: Path) -> Path:
    """A new hidden folder beside ``out`` to write into before the rename (one a killed writer of
    this host left there is removed first)."""
    return make_folder_beside(out, ".tmp", staging=True)


def move_into_place(tmp: Path, out: Path, replacing: bool) -> None:
    """Rename the finished bundle to ``out``; an old bundle there is renamed aside first and
    removed only once the new one is in place (renamed back if the swap fails)."""
    if not replacing:
        try:
            if out.exists():
                out.rmdir()  # an empty folder (checked): nothing is lost
            tmp.rename(out)
        except OSError:
            if not (out.is_dir() and any(out.iterdir())):
                raise
            raise ExportError(
                f"{out} was filled by something else while this command wrote it (another export at "
                f"the same time?); it is left as it is: choose another destination, or remove it and "
                f"run the command again"
            ) from None
        return
    aside = make_folder_beside(out, ".old")
    os.replace(out, aside)  # aside is an empty folder: rename replaces it
    try:
        tmp.rename(out)
    except OSError:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)
