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
