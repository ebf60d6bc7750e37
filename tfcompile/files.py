"""Writes that a crash or a full disk cannot leave half done."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

# What a run keeps of its data preparation: for text, and for images.
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSING_FILE = "preprocessing.json"


# The most read of a small file tfcompile writes beside a run: a record, a pointer.
SMALL_FILE_BYTES = 1 << 20


class NotWhatWeWrote(ValueError):
    """A small file tfcompile writes whose place holds something else: no regular file, or one
    larger than any it writes there (its message says which)."""


def read_small_text(path: Path, limit: int = SMALL_FILE_BYTES, encoding: str = "utf-8") -> str:
    """The text of a small file tfcompile writes (a run's or a study's record, a checkpoint
    pointer, results.csv), read without waiting on or filling memory from something else put in
    its place: NotWhatWeWrote where it is not a regular file (a FIFO would block the read,
    /dev/zero never end) or holds more than ``limit`` bytes, UnicodeDecodeError (a ValueError too)
    where it is not text; OSError where it cannot be read."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotWhatWeWrote(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotWhatWeWrote(f"{path} is larger than the {limit:,} bytes tfcompile writes there")
    return data.decode(encoding)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries, so that a rename into it survives a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def umask() -> int:
    """The process's file mode creation mask (read by setting it, then putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(path: Path) -> None:
    """Give a file the permissions open() gives a new file under the umask: for the writers that
    make theirs 0600 (safetensors)."""
    path.chmod(0o666 & ~umask())


def make_folder_beside(out: Path, suffix: str, staging: bool = False) -> Path:
    """A new hidden folder ``.OUT.*SUFFIX`` beside ``out``, with the permissions a plain mkdir
    would give it (mkdtemp's are 0700, whatever the umask): a folder later renamed to ``out``
    must be readable by whoever the user's umask lets read their files. ``staging``: a folder
    that holds nothing but what this process writes, named after it (``.OUT.HOST-PID.*SUFFIX``),
    so that one a killed writer on this host left (SIGKILL, out of memory: gigabytes of weights)
    is removed by the next."""
    out.parent.mkdir(parents=True, exist_ok=True)
    owner = ""
    if staging:
        owner = f"{_host()}-{os.getpid()}."
        _remove_abandoned(out, suffix)
    try:
        folder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{owner}", suffix=suffix))
    except OSError as e:  # named by the folder asked for, not by a hidden name the user never gave
        raise OSError(e.errno, e.strerror, str(out)) from None
    folder.chmod(0o777 & ~umask())
    return folder


@functools.cache
def _host() -> str:
    """This host, as a staging folder names it."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _remove_abandoned(out: Path, suffix: str) -> None:
    """Remove the staging folders beside ``out`` that a process of this host, gone now, left."""
    named = re.compile(rf"\.{re.escape(out.name)}\.{_host()}-(\d+)\.\w+{re.escape(suffix)}")
    with contextlib.suppress(OSError), os.scandir(out.parent) as entries:
        for entry in entries:
            found = named.fullmatch(entry.name)
            if found and entry.is_dir(follow_symlinks=False) and not _alive(int(found[1])):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; no such number
        return True
    return True


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a hidden temporary file beside ``path`` (``.NAME.*.tmp``, its own name, so that two
    writers never share one), flush it to disk, then rename it over ``path``: readers see the old
    contents or the new, never a mix. On any failure the temporary file is removed. The file gets
    the permissions the umask gives a new file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # named by the file asked for, not by a temporary name the user never gave
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        os.fchmod(fd, 0o666 & ~umask())  # as open() would make it: mkstemp's are 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a full disk: named by the file asked for
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
