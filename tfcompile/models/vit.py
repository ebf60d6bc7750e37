"""The Vision Transformer: patches -> (+ [CLS]) -> + positions -> encoder blocks -> head."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from tfcompile.models.common import init_weights
from tfcompile.nn.block import TransformerBlock, build_final_norm
from tfcompile.nn.patches import PatchEmbedding, sinusoidal_2d_table
from tfcompile.spec.schema import VitSpec


class VisionTransformer(nn.Module):
    """pixel_values (B, channels, image_size, image_size) float -> logits (B, num_labels)."""

    def __init__(self, spec: VitSpec, num_labels: int) -> None:
        super().__init__()
        assert spec.max_seq_len is not None  # resolved by the schema
        self.spec = spec
        d = spec.d_model
        self.patch_embed = PatchEmbedding(spec.channels, spec.patch_size, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.pooling == "cls" else None
        positions = spec.positional.type
        if positions == "learned":  # one vector per sequence index: [CLS], then the patches
            self.position_table: torch.Tensor | None = nn.Parameter(torch.zeros(spec.max_seq_len, d))
        elif positions == "sinusoidal":  # fixed, on the 2-D grid; [CLS] has no place on it
            table = sinusoidal_2d_table(spec.grid, d)
            if self.cls_token is not None:
                table = torch.cat((torch.zeros(1, d), table))
            self.register_buffer("position_table", table, persistent=False)
        else:
            self.position_table = None
        self.drop = nn.Dropout(spec.dropout.embedding)
        self.blocks = nn.ModuleList(TransformerBlock(spec) for _ in range(spec.n_layers))
        self.final_norm = build_final_norm(spec)
        self.head = nn.Linear(d, num_labels)
        self.apply(partial(init_weights, std=spec.init_std))
        for parameter in (self.cls_token, self.position_table):
            if isinstance(parameter, nn.Parameter):
                nn.init.normal_(parameter, std=spec.init_std)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self._check_pixels(pixel_values)
        x = self.patch_embed(pixel_values)  # (B, N, d)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x), dim=1)  # (B, 1 + N, d)
        if self.position_table is not None:
            x = x + self.position_table.to(x.dtype)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)  # every patch sees every patch: no mask
        x = self.final_norm(x)
        pooled = x[:, 0] if self.cls_token is not None else x.mean(dim=1)  # (B, d)
        return self.head(pooled)  # (B, num_labels)

    def _check_pixels(self, pixels: torch.Tensor) -> None:
        s = self.spec
        expected = (s.channels, s.image_size, s.image_size)
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != expected or not pixels.is_floating_point():
            raise ValueError(
                f"pixel_values must be a float tensor of shape (batch, {', '.join(map(str, expected))}), "
                f"got {pixels.dtype} of shape {tuple(pixels.shape)}"
            )
