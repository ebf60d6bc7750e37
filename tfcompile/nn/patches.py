"""Images as token sequences (Dosovitskiy et al. 2020): square patches, each flattened and
projected linearly (positions on the patch grid are in nn.positional)."""

from __future__ import annotations

import torch
from torch import nn


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, (H / p) * (W / p), d_model): patches in row-major order, each flattened
    channel-first (C, p, p) and multiplied by one matrix. That is a Conv2d with kernel = stride = p
    whose weight is this one reshaped to (d_model, C, p, p), so pretrained convolution weights load
    as ``proj.weight = conv.weight.flatten(1)``."""

    def __init__(self, channels: int, patch_size: int, d_model: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        B, C, H, W = pixels.shape
        p = self.patch_size
        patches = pixels.reshape(B, C, H // p, p, W // p, p).permute(
            0, 2, 4, 1, 3, 5
        )  # (B, H/p, W/p, C, p, p)
        return self.proj(patches.flatten(3).flatten(1, 2))  # (B, N, d_model)
