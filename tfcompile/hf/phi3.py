"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): Mistral's computation (no biases, every layer sliding
when ``sliding_window`` is set) with q, k and v in one ``qkv_proj`` and the gate and up projections
in one ``gate_up_proj``, which are split into the LLaMA layout, and dropout on each sublayer's
output (``resid_pdrop``). Phi-3 computes default RoPE or ``longrope`` (which it reads ``su`` and
``yarn`` as), which tfcompile has not. export-hf writes a Phi-3 spec as Llama, the same
computation, which every transformers version reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from tfcompile.hf.architecture import Config, Imported, State, Tensors, dropout, register
from tfcompile.hf.errors import HFError
from tfcompile.hf.llama import Llama
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec


def split(tensors: Tensors, name: str, rows: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The fused tensor's parts of ``rows`` rows each; an HFError when it has other rows."""
    fused = tensors.take(name)
    if fused.ndim != 2 or fused.shape[0] != sum(rows):
        raise HFError(
            f"{tensors.where}: the tensor {name} has shape {tuple(fused.shape)}, not "
            f"{' + '.join(map(str, rows))} rows; is config.json the checkpoint's own?"
        )
    return fused.split(list(rows))


@register("phi3")
class Phi3(Llama):
    sources: ClassVar[dict[str, str]] = Llama.sources | {"model.dropout.residual": "resid_pdrop"}

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        """Llama's, with Phi3Config's defaults (llama.MODEL_TYPES'), RoPE unscaled, and dropout on
        each sublayer's output."""
        imported = super().read(config, architecture, tensors)
        scaling = imported.model["positional"].get("scaling")
        if scaling is not None:
            name = "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
            config.refuse(
                f"{name}.rope_type",
                f"{scaling['type']!r}: Phi-3 computes default RoPE, or longrope (as it reads su and yarn)",
                "import a model with default RoPE",
            )
        config.require(
            config.data.get("sliding_window") != 0,
            "sliding_window",
            "is 0: a window of no tokens attends to nothing",
            "leave it null (no window), or set a positive number",
        )
        imported.model["dropout"]["residual"] = dropout(config.get("resid_pdrop", 0.0))
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """The fused tensors split into LLaMA's names, then read as LLaMA's."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None
        assert model.n_kv_heads is not None and model.d_ff is not None
        qkv_rows = [model.n_heads * model.head_dim] + [model.n_kv_heads * model.head_dim] * 2
        parts: dict[str, torch.Tensor] = {}
        for i in range(model.n_layers):
            a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            q, k, v = split(tensors, f"{a}qkv_proj.weight", qkv_rows)
            gate, up = split(tensors, f"{m}gate_up_proj.weight", [model.d_ff] * 2)
            parts |= {f"{a}q_proj.weight": q, f"{a}k_proj.weight": k, f"{a}v_proj.weight": v}
            parts |= {f"{m}gate_proj.weight": gate, f"{m}up_proj.weight": up}
        unread = {name: t for name, t in tensors.tensors.items() if name not in tensors.used}
        llama = Tensors(unread | parts, tensors.where)
        state = super().to_state(llama, spec)
        tensors.used |= llama.used & set(unread)
        return state

    def candidate(self, spec: Spec) -> bool:
        """Never: Llama writes every spec Phi-3 could, as the same computation."""
        return False
