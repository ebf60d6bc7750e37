"""A model's anatomy: each module's parameters and output shape, the total, and FLOPs per token.

The model is built on the meta device, so summarising GPT-2 or LLaMA-7B allocates no memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tfcompile.spec.schema import Spec, TransformerSpec
from tfcompile.tasks.task import build_model


@dataclass(frozen=True)
class ModuleRow:
    name: str
    kind: str
    params: int  # not counted by an earlier row: a tied LM head shows only its bias
    output_shape: tuple[int, ...] | None
    note: str = ""


@dataclass(frozen=True)
class Summary:
    rows: list[ModuleRow]
    total_params: int
    forward_flops_per_token: int
    context: int

    @property
    def train_flops_per_token(self) -> int:
        """Forward plus backward, which costs about twice the forward (Kaplan et al. 2020)."""
        return 3 * self.forward_flops_per_token


def summarize(spec: Spec) -> Summary:
    with torch.device("meta"):
        model = build_model(spec)
    rows_modules = list(_row_modules(model))
    shapes: dict[str, tuple[int, ...]] = {}
    hooks = [module.register_forward_hook(_record_shape(shapes, name)) for name, module in rows_modules]
    with torch.no_grad():
        model(*model.example_inputs())
    for hook in hooks:
        hook.remove()

    seen: dict[int, str] = {}
    rows = []
    for name, module in rows_modules:
        own, tied = 0, []
        for p in module.parameters():
            if id(p) in seen:
                tied.append(seen[id(p)])
            else:
                seen[id(p)] = name
                own += p.numel()
        note = f"weight tied to {tied[0]}" if tied else ""
        rows.append(ModuleRow(name, type(module).__name__, own, shapes.get(name), note))
    total = sum(p.numel() for p in model.parameters())
    return Summary(rows, total, forward_flops_per_token(model, spec.model), spec.context_length)


def forward_flops_per_token(model: nn.Module, spec: TransformerSpec, context: int | None = None) -> int:
    """2 FLOPs per multiply-add: every Linear once per token, plus the attention scores and the
    weighted sum over a full ``context`` (default max_seq_len; QK^T and AV: 2 * 2 * n_layers *
    context * n_heads * head_dim), as in PaLM's MFU accounting. Embedding lookups and norms are
    not counted."""
    matmul = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    # An encoder-decoder's decoder attends twice per block (to itself and to the source).
    attending = spec.n_layers + 2 * getattr(spec, "n_decoder_layers", 0)
    assert spec.head_dim is not None  # resolved by the schema
    attention = 4 * attending * (context or spec.max_seq_len or 0) * spec.n_heads * spec.head_dim
    return matmul + attention


def _row_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Top-level modules, with each repeated block opened into its sublayers."""
    rows = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            for i, block in enumerate(child):
                rows += [(f"{name}.{i}.{sub}", m) for sub, m in block.named_children() if _shown(m)]
        elif _shown(child):
            rows.append((name, child))
    return rows


def _shown(module: nn.Module) -> bool:
    return not isinstance(module, nn.Dropout | nn.Identity) or any(True for _ in module.parameters())


def _record_shape(shapes: dict[str, tuple[int, ...]], name: str) -> Callable[..., None]:
    def hook(module: nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            shapes[name] = tuple(output.shape)

    return hook
