"""One trial of a study: an ordinary run, trained (or resumed) by the Trainer, with its peak memory
written next to it (RUN/trial.json). Its arguments and result are plain data, so that a Ray worker
can run it as well as this process."""

from __future__ import annotations

import contextlib
import json
import re
import resource
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tfcompile.files import atomic_write_text, read_small_text
from tfcompile.spec import parse_spec
from tfcompile.study.runs import MEMORY_KINDS, TRIAL_FILE
from tfcompile.train import Trainer, TrainingFailed
from tfcompile.train.checkpoint import checkpoint_folders, remove_temporaries
from tfcompile.train.lock import is_locked
from tfcompile.train.loop import RUN_FILES


def run_trial(spec_text: str, run_dir: str, show_progress: bool = True) -> dict[str, Any]:
    """Train the trial whose resolved spec is ``spec_text`` into ``run_dir``: resume it from its
    checkpoint, or start it (again, when a killed sweep left it without one) ->
    {"step": ..., "interrupted": ..., "stopped_by": the signal that stopped it or None, "failed": None,
    or why its training stopped with an error}.
    A trial that fails once training has begun (its loss diverged, its model does not fit in
    memory) is a result of the study, recorded in RUN/trial.json, not the end of the sweep."""
    folder = Path(run_dir)
    spec = parse_spec(spec_text, source=str(folder / "spec.yaml"))
    resume = bool(checkpoint_folders(folder))
    if not resume and folder.is_dir() and not is_locked(folder):
        _clear_start(folder)
    failed, trainer = None, None
    with peak_memory(spec.train.device) as peak:
        try:  # a model that does not fit fails as the Trainer is made
            trainer = Trainer(spec, folder, resume=resume, show_progress=show_progress)
            stopped_by = trainer.train().stopped_by
        except TrainingFailed as e:
            stopped_by, failed = None, str(e)
    device = str(trainer.device) if trainer is not None else spec.train.device
    _record_peak(folder, peak, device, failed)
    step = trainer.step if trainer is not None else 0
    stopped = None if stopped_by is None else int(stopped_by)
    return {"step": step, "interrupted": stopped is not None, "stopped_by": stopped, "failed": failed}


def _clear_start(folder: Path) -> None:
    """Remove what a start killed before its first checkpoint wrote (nothing to keep), so that the
    trial starts again; any other file in the folder is the user's, and stays."""
    remove_temporaries(folder, (*RUN_FILES, TRIAL_FILE))
    for name in (*RUN_FILES, TRIAL_FILE):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


class Peak:
    """The largest memory use seen: bytes, and of what (the process's resident memory, or CUDA's)."""

    bytes: int = 0
    kind: str = MEMORY_KINDS[0]


@contextlib.contextmanager
def peak_memory(device: str) -> Iterator[Peak]:
    """Measure the peak memory of the block: on CUDA, of the tensors the allocator held; else the
    process's resident set (reset first where Linux allows, so that earlier trials don't count)."""
    peak = Peak()
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        _reset_rss_peak()
    try:
        yield peak
    finally:
        if cuda:
            peak.bytes, peak.kind = torch.cuda.max_memory_allocated(), MEMORY_KINDS[1]
        else:
            peak.bytes = _rss_peak()


def _reset_rss_peak() -> None:
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (Linux)


def _rss_peak() -> int:
    with contextlib.suppress(OSError):
        found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        if found:
            return int(found[1]) * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def _record_peak(folder: Path, peak: Peak, device: str, failed: str | None) -> None:
    """RUN/trial.json: the largest peak over the processes that trained the run, and why the last
    one's training failed, if it did."""
    path = folder / TRIAL_FILE
    folder.mkdir(parents=True, exist_ok=True)  # a trial that failed as it was set up may have none
    before = 0
    with contextlib.suppress(OSError, ValueError, TypeError):
        before = int(json.loads(read_small_text(path))["peak_memory_bytes"])
    found = {"peak_memory_bytes": max(before, peak.bytes), "memory": peak.kind, "device": device}
    atomic_write_text(path, json.dumps(found | ({"failed": failed} if failed else {})) + "\n")
