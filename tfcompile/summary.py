"""A model's anatomy: each module's parameters and output shape, the total, and FLOPs per token.

The model is built on the meta device, so summarising GPT-2 or LLaMA-7B allocates no memory; the
output shapes are recorded through the first block of each stack (the others give the same), so
that the forward pass costs one block's time however deep the model.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from tfcompile.nn.moe import MoE
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


# A block's self-attention in any stack (blocks, encoder_blocks, decoder_blocks), its layer's index.
ATTENTION = re.compile(r"\w*blocks\.(\d+)\.attn")


def summarize(spec: Spec) -> Summary:
    with torch.device("meta"):
        model = build_model(spec)
    rows_modules = _row_modules(model)
    shapes: dict[str, tuple[int, ...]] = {}
    hooks = [m.register_forward_hook(_record_shape(shapes, key)) for key, m in _shape_sources(model).items()]
    with torch.no_grad(), _first_blocks(model):
        model(*model.example_inputs())
    for hook in hooks:
        hook.remove()

    window = getattr(spec.model, "window", None)  # a decoder's sliding layers
    sliding: frozenset[int] = getattr(spec.model, "sliding_layers", frozenset())
    nope = set(getattr(spec.model.positional, "nope_layers", None) or ())  # in each stack
    seen: dict[int, str] = {}
    rows = []
    for name, p in model.named_parameters(recurse=False):  # the model's own (ViT's [CLS] token)
        seen[id(p)] = name
        rows.append(ModuleRow(name, "Parameter", p.numel(), tuple(p.shape)))
    for name, module, shape_of in rows_modules:
        own, tied = 0, []
        for p in module.parameters():
            if id(p) in seen:
                tied.append(seen[id(p)])
            else:
                seen[id(p)] = name
                own += p.numel()
        notes = [f"weight tied to {tied[0]}" if tied else ""]
        if layer := ATTENTION.fullmatch(name):  # a block's self-attention: its layer's notes
            i = int(layer[1])
            notes.append(
                f"slides over {window.size:,} positions" if window is not None and i in sliding else ""
            )
            notes.append("turns no RoPE" if i in nope else "")
        if isinstance(module, MoE):
            notes.append(
                f"{module.top_k} of {len(module.experts)} experts per token: "
                f"{module.active_parameters():,} parameters active"
            )
        note = "; ".join(filter(None, notes))
        rows.append(ModuleRow(name, type(module).__name__, own, shapes.get(shape_of), note))
    total = sum(p.numel() for p in model.parameters())
    flops = forward_flops_per_token(model, spec.model, spec.context_length)  # at the context it prints
    return Summary(rows, total, flops, spec.context_length)


def forward_flops_per_token(model: nn.Module, spec: TransformerSpec, context: int | None = None) -> int:
    """2 FLOPs per multiply-add: every Linear once per token, plus the attention scores and the
    weighted sum over a full ``context`` (default max_seq_len; QK^T and AV: 2 * 2 * n_layers *
    context * n_heads * head_dim), as in PaLM's MFU accounting; a sliding layer's over its window
    where that is shorter; a mixture of experts' router, shared expert and the top_k experts a token
    chooses. Embedding lookups and norms are not counted."""
    # each use of a module: a block that several layers share (ALBERT's) is computed in each
    modules = [m for _, m in model.named_modules(remove_duplicate=False)]
    matmul = sum(2 * m.in_features * m.out_features for m in modules if isinstance(m, nn.Linear))
    matmul -= sum(m.idle_flops_per_token() for m in modules if isinstance(m, MoE))  # its chosen experts only
    # An encoder-decoder's decoder attends twice per block (to itself and to the source).
    attending = spec.n_layers + 2 * getattr(spec, "n_decoder_layers", 0)
    assert spec.head_dim is not None  # resolved by the schema
    context = context or spec.max_seq_len or 0
    window = getattr(spec, "window", None)
    sliding = len(getattr(spec, "sliding_layers", ()))
    keys = attending * context - (sliding * max(0, context - window.size) if window is not None else 0)
    return matmul + 4 * keys * spec.n_heads * spec.head_dim


def _row_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """Top-level modules, with each repeated block opened into its sublayers; each with the row
    whose output shape it has (a block's sublayer: the first block's)."""
    rows = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            for i, block in enumerate(child):
                rows += [
                    (f"{name}.{i}.{sub}", m, f"{name}.0.{sub}")
                    for sub, m in block.named_children()
                    if _shown(m)
                ]
        elif _shown(child):
            rows.append((name, child, name))
    return rows


def _shape_sources(model: nn.Module) -> dict[str, nn.Module]:
    """The modules whose output shapes the rows show: the top-level ones, and every sublayer of the
    first block of each stack (a later block's sublayer has the shape of its namesake there, even
    where the first block's is an Identity, as its stochastic depth is)."""
    sources: dict[str, nn.Module] = {}
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            sources |= {f"{name}.0.{sub}": m for block in child[:1] for sub, m in block.named_children()}
        else:
            sources[name] = child
    return sources


@contextlib.contextmanager
def _first_blocks(model: nn.Module) -> Iterator[None]:
    """Every stack of blocks (a ModuleList) in ``model`` cut to its first block inside: blocks of
    a stack give the same shapes, and on the meta device each block's forward costs tens of
    milliseconds of Python, a minute for a thousand layers."""
    stacks = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.ModuleList) and len(child) > 1
    ]
    for parent, name, child in stacks:
        setattr(parent, name, child[:1])
    try:
        yield
    finally:
        for parent, name, child in stacks:
            setattr(parent, name, child)


def _shown(module: nn.Module) -> bool:
    return not isinstance(module, nn.Dropout | nn.Identity) or any(True for _ in module.parameters())


def _record_shape(shapes: dict[str, tuple[int, ...]], name: str) -> Callable[..., None]:
    def hook(module: nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            shapes[name] = tuple(output.shape)

    return hook
