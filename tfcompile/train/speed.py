"""Model FLOPs utilisation: the training FLOPs a run does per second over what the device could.

MFU = tokens/s x training FLOPs per token / peak FLOP/s (Chowdhery et al. 2022, PaLM appendix B),
with the FLOPs per token of ``tfcompile summary`` and the device's dense (no sparsity) tensor-core
peak from its datasheet: 16-bit for bf16/fp16 training, TF32 for fp32 (TF32 matmuls are on).
"""

from __future__ import annotations

import torch

# Name fragment -> (bf16/fp16, tf32) dense peak FLOP/s. More specific names come first.
PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756e12, 378e12),
    ("H100", 989.4e12, 494.7e12),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989.4e12, 494.7e12),
    ("A100", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("L4", 121e12, 60e12),
    ("A10", 125e12, 62.5e12),
    ("4090", 165.2e12, 82.6e12),
    ("V100", 125e12, 15.7e12),  # no bf16 or TF32: fp16 tensor cores, fp32 otherwise
]


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s for ``precision`` training, or None where it is unknown
    (the CPU, or a GPU missing from PEAK_FLOPS): MFU is then not reported."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, half, tf32 in PEAK_FLOPS:
        if fragment in name:
            return half if precision in ("bf16", "fp16") else tf32
    return None
