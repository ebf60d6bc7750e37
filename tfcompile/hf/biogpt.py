"""BioGPT (``BioGptForCausalLM``): OPT's pre-LayerNorm blocks (biases on every projection, learned
positions read from row 2 of their table, counted from the mask) with a final norm, token
embeddings multiplied by sqrt(hidden_size) (``scale_embedding``, true by default) and a tied head
(``output_projection``).

Every LayerNorm is nn.LayerNorm's default (epsilon 1e-5): BioGptConfig's ``layer_norm_eps`` is
read by none of them, so the import does not read it either. ``activation_dropout`` (inside the
feed-forward) and ``layerdrop`` act in training only. export-hf writes as BioGPT a decoder LM of
learned positions and GPT-2's norms whose embeddings are scaled (GPT-2 writes the others)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Writable,
    contiguous,
    dropout,
    init_std,
    lm_head,
    pad_within,
    register,
)
from tfcompile.hf.errors import Problem
from tfcompile.hf.gpt2 import gpt2_norms, learned_decoder_lm, multi_query
from tfcompile.hf.opt import (
    EPS,
    OFFSET,
    fairseq_needs,
    read_fairseq_lm,
    warn_of_layerdrop,
    written_fairseq_lm,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

HEAD = "BioGptForCausalLM"
PREFIX = "biogpt."
HEAD_TENSOR = "output_projection.weight"  # the head, where untied


@register("biogpt")
class BioGpt(Writable):
    prefixes = (PREFIX,)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.dropout.embedding": "hidden_dropout_prob",
        "model.dropout.residual": "hidden_dropout_prob",
        "model.dropout.attention": "attention_probs_dropout_prob",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture == HEAD,
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import a {HEAD}",
        )
        warn_of_layerdrop(config)
        vocab = config.get("vocab_size", 42384)
        pad_within(config.filled({}, nullable={"pad_token_id": 1}), vocab)
        hidden = config.get("hidden_dropout_prob", 0.1)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 1024),
            "d_model": config.get("hidden_size", 1024),
            "n_layers": config.get("num_hidden_layers", 24),
            "n_heads": config.get("num_attention_heads", 16),
            "d_ff": config.get("intermediate_size", 4096),
            "activation": config.choice("hidden_act", "gelu", ACTIVATIONS, "activation"),
            "positional": "learned",
            "norm": {"position": "pre", "type": "layernorm", "eps": EPS},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "scale_embeddings": bool(config.get("scale_embedding", True)),
            "tie_embeddings": lm_head(
                config, tensors, architecture, (HEAD_TENSOR, "embed_tokens.weight"), True, HEAD
            ),
            "dropout": {
                "embedding": dropout(hidden),
                "attention": dropout(config.get("attention_probs_dropout_prob", 0.1)),
                "residual": dropout(hidden),
            },
            "init_std": init_std(config),
        }
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        positions = tensors.take("embed_positions.weight")[OFFSET:]
        return read_fairseq_lm(tensors, model, HEAD_TENSOR) | {"positional.table.weight": positions}

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with learned positions, GPT-2's norms, no MQA and no window whose token
        embeddings are scaled (GPT-2 writes the others)."""
        model = learned_decoder_lm(spec)
        return (
            model is not None
            and not multi_query(model)
            and gpt2_norms(model)
            and model.window is None
            and model.scale_embeddings
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        need = Needs("BioGPT")
        fairseq_needs(need, model, "hidden_dropout_prob")
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return {
            "architectures": [HEAD],
            "model_type": "biogpt",
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_seq_len,
            "hidden_size": model.d_model,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "intermediate_size": model.d_ff,
            "hidden_act": EXPORTED_ACTIVATIONS[model.activation],
            "scale_embedding": model.scale_embeddings,
            "hidden_dropout_prob": model.dropout.residual,
            "attention_probs_dropout_prob": model.dropout.attention,
            "activation_dropout": 0.0,
            "layerdrop": 0.0,
            "initializer_range": model.init_std,
            "tie_word_embeddings": model.tie_embeddings,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        table = state["positional.table.weight"]
        positions = torch.cat([table.new_zeros(OFFSET, model.d_model), table])
        out = written_fairseq_lm(state, model, PREFIX, HEAD_TENSOR)
        return contiguous(out | {f"{PREFIX}embed_positions.weight": positions})
