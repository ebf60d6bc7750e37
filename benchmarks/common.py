"""What the benchmark scripts share: the repository's root, a quiet training run, the name of the
device they measured, and the results file they write."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def trained(spec: str, runs: Path, overrides: list[str], name: str = "run") -> Path:
    """specs/SPEC with ``overrides``, trained without a progress bar into RUNS/NAME -> the run."""
    from tfcompile.spec import load_spec
    from tfcompile.train import Trainer

    loaded = load_spec(ROOT / "specs" / spec, [*overrides, f"train.runs_dir={runs}"])
    Trainer(loaded, runs / name, show_progress=False).train()
    return runs / name


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name with the number of threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return platform.processor() or "cpu"


def device_slug(name: str) -> str:
    """A device's name as results files name it: lower case, each other character a dash."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def write_results(name: str, table: str, device: str) -> Path:
    """Print ``table`` and write it to benchmarks/results/NAME.md under a header saying how it was
    made: the command, the commit (and whether the tree had changes), the device and the date."""
    import datetime
    import os
    import subprocess
    import sys

    def git(*args: str) -> str:
        try:
            result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        except FileNotFoundError:  # no git on the machine
            return ""
        return result.stdout.strip()

    # A copy of the tree away from its repository (a lent GPU machine) is told its commit.
    commit = os.environ.get("TFCOMPILE_COMMIT") or git("rev-parse", "--short", "HEAD") or "unknown"
    # Results files written and not yet committed change nothing that is measured.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    if changed and "TFCOMPILE_COMMIT" not in os.environ:
        commit += " (with uncommitted changes)"
    command = " ".join(["python", os.path.relpath(Path(sys.argv[0]).resolve(), ROOT), *sys.argv[1:]])
    header = [
        f"command: `{command}`",
        f"commit: {commit}",
        f"device: {device}",
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]
    text = "\n".join(header) + "\n\n" + table + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / f"{name}.md"
    out.write_text(text)
    print(f"written to {out.relative_to(ROOT)}")
    return out
