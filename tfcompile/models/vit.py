"""The Vision Transformer: patches -> (+ [CLS]) -> + positions -> encoder blocks -> head."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from tfcompile.models.common import Assembly, init_weights
from tfcompile.nn.block import build_blocks, build_final_norm
from tfcompile.nn.patches import PatchEmbedding
from tfcompile.nn.positional import build_positional
from tfcompile.spec.schema import VitSpec


class VisionTransformer(Assembly):
    """pixel_values (B, channels, image_size, image_size) float -> logits (B, num_labels)."""

    heads = ("head",)

    def __init__(self, spec: VitSpec, num_labels: int) -> None:
        super().__init__()
        assert spec.max_seq_len is not None  # resolved by the schema
        self.spec = spec
        d = spec.d_model
        self.patch_embed = PatchEmbedding(spec.channels, spec.patch_size, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.prefix_tokens else None
        # Positions per sequence index ([CLS], then the patches, row-major): learned, or fixed on
        # the 2-D grid. Built outside the model's random stream and initialised after the rest,
        # with the [CLS] token, as in the ViT paper's code.
        with torch.random.fork_rng(devices=[]):
            positional = build_positional(spec, bidirectional=True, grid=spec.grid, prefix=spec.prefix_tokens)
        self.drop = nn.Dropout(spec.dropout.embedding)
        self.blocks = build_blocks(spec, spec.n_layers)
        self.final_norm = build_final_norm(spec)
        self.head = nn.Linear(d, num_labels)
        self.apply(partial(init_weights, std=spec.init_std))
        self.positional = positional
        for parameter in (self.cls_token, *positional.parameters()):
            if parameter is not None:
                nn.init.normal_(parameter, std=spec.init_std)
        self._register_load_state_dict_pre_hook(_rename_position_table)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self._check_pixels(pixel_values)
        x = self.patch_embed(pixel_values)  # (B, N, d)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x), dim=1)  # (B, 1 + N, d)
        x = self.drop(self.positional.embed(x, torch.arange(x.shape[1], device=x.device)))
        for block in self.blocks:
            x = block(x)  # every patch sees every patch: no mask
        x = self.final_norm(x)
        pooled = x[:, 0] if self.cls_token is not None else x.mean(dim=1)  # (B, d)
        return self.head(pooled)  # (B, num_labels)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """A batch of images of the model's size, on its device."""
        s, device = self.spec, self.head.weight.device
        return (torch.zeros(batch, s.channels, s.image_size, s.image_size, device=device),)

    def _check_pixels(self, pixels: torch.Tensor) -> None:
        s = self.spec
        expected = (s.channels, s.image_size, s.image_size)
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != expected or not pixels.is_floating_point():
            raise ValueError(
                f"pixel_values must be a float tensor of shape (batch, {', '.join(map(str, expected))}), "
                f"got {pixels.dtype} of shape {tuple(pixels.shape)}"
            )


def _rename_position_table(state: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
    """Runs written before the positions were a registered module kept the learned table as
    ``position_table``; they load under its name now."""
    old = prefix + "position_table"
    if old in state:
        state[prefix + "positional.table.weight"] = state.pop(old)
