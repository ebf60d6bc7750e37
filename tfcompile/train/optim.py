"""Optimizers with weight decay on matrices only: norms' gains and all biases are not decayed."""

from __future__ import annotations

import torch
from torch import nn

from tfcompile.spec.schema import OptimizerSpec


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, spec: OptimizerSpec, device: torch.device) -> torch.optim.Optimizer:
    groups = parameter_groups(model, spec.weight_decay)
    cls = torch.optim.AdamW if spec.type == "adamw" else torch.optim.Adam
    # Adam's weight_decay is L2 in the gradient; AdamW's is decoupled (Loshchilov and Hutter).
    return cls(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, fused=device.type == "cuda")
