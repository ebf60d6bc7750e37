"""One writer per run folder: RUN/.lock, held with ``flock`` while a process writes the run.

The operating system releases a ``flock`` when its process ends, however it ends (kill -9
included), so a crash never leaves a stale lock. The file holds the owner's pid, host and start
time, which the refused writer's message names. The owner removes the file while it still holds
the lock; a writer that locked a file removed meanwhile notices (another inode at the path) and
tries again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import weakref
from pathlib import Path

from tfcompile.train.runs import TrainError

LOCK_FILE = ".lock"
OWNER_KEYS = ("pid", "host", "started")  # the owner's record in the lock file, a JSON object


class RunLock:
    """Held from construction until ``release()`` (or until the object is garbage collected: a
    safety net). A folder the lock created and nothing else wrote into is removed again."""

    def __init__(self, run_dir: Path, advice: str) -> None:
        created = not run_dir.exists()
        path = run_dir / LOCK_FILE
        fd = _lock(path, advice)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        owner = dict(zip(OWNER_KEYS, (os.getpid(), socket.gethostname(), started), strict=True))
        with contextlib.suppress(OSError):  # a full disk: the lock holds without its owner's name
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(owner) + "\n").encode())
        self._release = weakref.finalize(self, _unlock, path, fd, run_dir if created else None)

    def release(self) -> None:
        self._release()


ATTEMPTS = 100  # a folder removed again and again as we lock it: give up rather than spin


def _lock(path: Path, advice: str) -> int:
    """A descriptor of ``path`` locked by this process, or a TrainError naming the holder."""
    for _ in range(ATTEMPTS):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file in the way, no permission, a file system that makes no folders
            raise TrainError(f"cannot make the run folder {path.parent}: {e.strerror or e}") from e
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder was removed as we opened: make it again
            continue
        except OSError as e:
            raise TrainError(f"cannot write the run folder {path.parent}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise TrainError(f"{path.parent} is being written by {holder}: {advice}") from None
        with contextlib.suppress(FileNotFoundError):
            if _identity(os.stat(path)) == _identity(os.fstat(fd)):
                if not _ours(fd):
                    os.close(fd)
                    raise TrainError(
                        f"{path} is not a run's lock (it holds no process's record), and a run "
                        f"writes and removes that file: move it, or train into another folder"
                    )
                return fd
        os.close(fd)  # its owner removed the file we locked: lock the one at the path now
    raise TrainError(f"cannot lock {path}: the run folder was removed {ATTEMPTS} times as it was locked")


def _ours(fd: int) -> bool:
    """Whether a lock file is empty (new, or its writer stopped before its record) or holds an
    owner's record, as a killed run leaves it, whole or cut short (a full disk): a file of the
    user's named .lock is none of these."""
    held = os.pread(fd, 4096, 0)
    if not held:
        return True
    try:
        owner = json.loads(held)
    except ValueError:  # cut short: it begins as RunLock's record does ('{"pid": ')
        return held.startswith(json.dumps({OWNER_KEYS[0]: 0})[:-2].encode())
    return isinstance(owner, dict) and set(owner) == set(OWNER_KEYS)


def is_locked(run_dir: Path) -> bool:
    """Whether a process holds the run's lock now (without taking it)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would block the open
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _holder(fd: int) -> str:
    """'process 1234 on host h (started 2025-01-01 12:00:00)', from the lock file's contents."""
    try:
        owner = json.loads(os.read(fd, 4096))
        pid, host, started = (owner[key] for key in OWNER_KEYS)
        return f"process {pid} on host {host} (started {started})"
    except (ValueError, TypeError, KeyError):  # the owner is writing it this instant
        return "another process"


def _unlock(path: Path, fd: int, created: Path | None) -> None:
    """Remove the lock file (still holding it), then the folder if this lock made it and it is
    empty, then let go."""
    with contextlib.suppress(OSError):
        path.unlink()
        if created is not None:
            created.rmdir()
    os.close(fd)
