"""What the benchmark scripts share: the name of the device they measured."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name with the number of threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return platform.processor() or "cpu"


def write_results(name: str, table: str, device: str) -> Path:
    """Print ``table`` and write it to benchmarks/results/NAME.md under a header saying how it was
    made: the command, the commit (and whether the tree had changes), the device and the date."""
    import datetime
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    command = " ".join(["python", os.path.relpath(Path(sys.argv[0]).resolve(), root), *sys.argv[1:]])
    header = [
        f"command: `{command}`",
        f"commit: {commit}",
        f"device: {device}",
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]
    text = "\n".join(header) + "\n\n" + table + "\n"
    print(text)
    out = root / "benchmarks" / "results" / f"{name}.md"
    out.write_text(text)
    print(f"written to {out.relative_to(root)}")
    return out
