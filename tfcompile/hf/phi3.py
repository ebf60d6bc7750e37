"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): Mistral's computation (no biases, every layer sliding
when ``sliding_window`` is set) with q, k and v in one ``qkv_proj`` and the gate and up projections
in one ``gate_up_proj``, which are split into the LLaMA layout, and dropout on each sublayer's
output (``resid_pdrop``). Phi-3 computes default RoPE or LongRoPE (Phi-3 128k, Phi-3.5; it
reads ``su`` and ``yarn`` as ``longrope``), on the first ``partial_rotary_factor`` of each head
(Phi-4-mini's 0.75). export-hf writes a Phi-3 spec as Llama, the same computation, which every
transformers version reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from tfcompile.hf.architecture import Config, Imported, State, Tensors, dropout, register
from tfcompile.hf.errors import HFError
from tfcompile.hf.llama import Llama, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

ORIGINAL = "original_max_position_embeddings"


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
        """Llama's, with Phi3Config's defaults (llama.MODEL_TYPES') and RoPE, and dropout on each
        sublayer's output."""
        imported = super().read(config, architecture, tensors)
        config.require(
            config.data.get("sliding_window") != 0,
            "sliding_window",
            "is 0: a window of no tokens attends to nothing",
            "leave it null (no window), or set a positive number",
        )
        imported.model["dropout"]["residual"] = dropout(config.get("resid_pdrop", 0.0))
        return imported

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        """Phi3Config's RoPE: default or LongRoPE, which it reads su and yarn as (su's original
        length from the dict alone in transformers 5, which fails without one), on the first
        partial_rotary_factor of each head; any other kind is refused, as Phi3Config refuses it."""
        name = "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
        params = config.get(name, {})
        kind = params.get("rope_type", params.get("type", "default"))
        if kind in ("su", "yarn"):
            if kind == "su":
                inside, top = params.get("original_max_position_embeddings"), config.get(ORIGINAL)
                config.require(
                    inside is not None and inside == top,
                    f"{name}.{ORIGINAL}",
                    f"is {inside!r} and the top-level {ORIGINAL} {top!r}: transformers 5 reads a su RoPE's "
                    "original length from the dict alone (and fails without one), transformers 4 from the "
                    "top level alone",
                    "give the same length in both, or name the type longrope",
                )
            params = {k: v for k, v in params.items() if k != "type"} | {"rope_type": "longrope"}
            config = config.over(config.data | {name: params})
        section = rope_section(config, head_dim, partial=1.0)
        kind = section.get("scaling", {}).get("type", "default")
        config.require(
            kind in ("default", "longrope"),
            f"{name}.rope_type",
            f"{kind!r}: Phi-3 computes default RoPE, or longrope (as it reads su and yarn)",
            "import a model with default RoPE or LongRoPE",
        )
        return section

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
