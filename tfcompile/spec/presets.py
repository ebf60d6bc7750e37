"""Named presets: partial specs that a spec extends with ``preset: NAME`` and overrides key by key.

Like litgpt's named configs, one table; each entry is what the paper or release describes.
"""

from __future__ import annotations

from typing import Any

from tfcompile.spec.schema import SHORT_FORMS

PRESETS: dict[str, dict[str, Any]] = {
    # Radford et al. 2019, GPT-2 small: 124,439,808 parameters with the tied LM head.
    "gpt2": {
        "model": {
            "vocab_size": 50257,
            "d_model": 768,
            "n_layers": 12,
            "n_heads": 12,
            "max_seq_len": 1024,
            "norm": {"position": "pre", "type": "layernorm", "eps": 1e-5},
            "activation": "gelu_tanh",
            "positional": {"type": "learned"},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": True,
            "dropout": {"embedding": 0.1, "attention": 0.1, "residual": 0.1},
            "init_std": 0.02,
        },
    },
    # Touvron et al. 2023, LLaMA 7B: pre-norm RMSNorm, SwiGLU (d_ff 11008), RoPE, no biases.
    "llama": {
        "model": {
            "vocab_size": 32000,
            "d_model": 4096,
            "n_layers": 32,
            "n_heads": 32,
            "max_seq_len": 2048,
            "norm": {"position": "pre", "type": "rmsnorm", "eps": 1e-6},
            "activation": "swiglu",
            "d_ff_multiple_of": 256,
            "positional": {"type": "rope", "theta": 10000.0},
            "bias": {"qkv": False, "attn_out": False, "ffn": False, "lm_head": False},
            "tie_embeddings": False,
            "dropout": {"embedding": 0.0, "attention": 0.0, "residual": 0.0},
        },
    },
    # Vaswani et al. 2017, the base model's choices as a decoder: post-norm LayerNorm, ReLU,
    # sinusoidal positions, embeddings scaled by sqrt(d_model), Adam with the warmup schedule.
    "vaswani": {
        "model": {
            "vocab_size": 37000,
            "d_model": 512,
            "n_layers": 6,
            "n_heads": 8,
            "d_ff": 2048,
            "max_seq_len": 512,
            "norm": {"position": "post", "type": "layernorm", "eps": 1e-6},
            "activation": "relu",
            "positional": {"type": "sinusoidal"},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": True,
            "scale_embeddings": True,
            "dropout": {"embedding": 0.1, "attention": 0.0, "residual": 0.1},
        },
        "task": {"type": "causal_lm", "label_smoothing": 0.1},
        "train": {
            "optimizer": {"type": "adam", "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.0},
            "schedule": {"type": "vaswani", "warmup_steps": 4000},
        },
    },
    # Vaswani et al. 2017, the base model: 6 + 6 post-norm layers, ReLU, sinusoidal positions, one
    # embedding table shared by source, target and output (a joint 37,000-token BPE vocabulary),
    # label smoothing 0.1, Adam with the warmup schedule.
    "vaswani-base": {
        "model": {
            "family": "encoder_decoder",
            "vocab_size": 37000,
            "d_model": 512,
            "n_layers": 6,
            "n_decoder_layers": 6,
            "n_heads": 8,
            "d_ff": 2048,
            "max_seq_len": 256,
            "norm": {"position": "post", "type": "layernorm", "eps": 1e-6},
            "activation": "relu",
            "positional": {"type": "sinusoidal"},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "share_embeddings": True,
            "tie_embeddings": True,
            "scale_embeddings": True,
            "dropout": {"embedding": 0.1, "attention": 0.0, "residual": 0.1},
        },
        "task": {"type": "seq2seq", "label_smoothing": 0.1},
        "train": {
            "optimizer": {"type": "adam", "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.0},
            "schedule": {"type": "vaswani", "warmup_steps": 4000},
        },
    },
    # Raffel et al. 2020, T5-small's layer: pre-norm RMSNorm without biases, relative position
    # buckets in place of embeddings, ReLU (T5 1.1 uses GeGLU), shared embeddings.
    "t5-small": {
        "model": {
            "family": "encoder_decoder",
            "vocab_size": 32128,
            "d_model": 512,
            "n_layers": 6,
            "n_decoder_layers": 6,
            "n_heads": 8,
            "d_ff": 2048,
            "max_seq_len": 512,
            "norm": {"position": "pre", "type": "rmsnorm", "eps": 1e-6},
            "activation": "relu",
            "positional": {"type": "relative", "num_buckets": 32, "max_distance": 128},
            "bias": {"qkv": False, "attn_out": False, "ffn": False, "lm_head": False},
            "share_embeddings": True,
            "tie_embeddings": True,
            "dropout": {"embedding": 0.1, "attention": 0.0, "residual": 0.1},
        },
        "task": {"type": "seq2seq", "label_smoothing": 0.0},
    },
    # Devlin et al. 2019, BERT-base: a post-norm encoder with GELU, learned positions, segment
    # embeddings and a LayerNorm over the summed embeddings; pretrained with MLM + NSP.
    "bert": {
        "model": {
            "family": "encoder",
            "vocab_size": 30522,
            "d_model": 768,
            "n_layers": 12,
            "n_heads": 12,
            "max_seq_len": 512,
            "type_vocab_size": 2,
            "embedding_norm": True,
            "norm": {"position": "post", "type": "layernorm", "eps": 1e-12},
            "activation": "gelu",
            "positional": {"type": "learned"},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": True},
            "tie_embeddings": True,
            "dropout": {"embedding": 0.1, "attention": 0.1, "residual": 0.1},
            "init_std": 0.02,
        },
        "task": {"type": "masked_lm", "next_sentence": True},
        "train": {
            "optimizer": {
                "type": "adamw",
                "lr": 1e-4,
                "betas": [0.9, 0.999],
                "eps": 1e-6,
                "weight_decay": 0.01,
            },
            "schedule": {"type": "cosine", "warmup_steps": 10000, "min_lr_ratio": 0.0},
        },
    },
    # Dosovitskiy et al. 2021, ViT-B/16: 224 x 224 RGB in 16 x 16 patches (196 + [CLS]), a
    # pre-norm GELU encoder with learned positions; 86,567,656 parameters with 1,000 classes.
    "vit-base": {
        "model": {
            "family": "vit",
            "image_size": 224,
            "channels": 3,
            "patch_size": 16,
            "d_model": 768,
            "n_layers": 12,
            "n_heads": 12,
            "norm": {"position": "pre", "type": "layernorm", "eps": 1e-6},
            "activation": "gelu",
            "positional": {"type": "learned"},
            "pooling": "cls",
            "bias": {"qkv": True, "attn_out": True, "ffn": True},
            "dropout": {"embedding": 0.0, "attention": 0.0, "residual": 0.1},
        },
        "task": {"type": "image_classification", "augment": {"shift": 16, "flip": True}},
        "train": {
            "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "weight_decay": 0.05},
            "schedule": {"type": "cosine", "warmup_steps": 10000, "min_lr_ratio": 0.0},
        },
    },
}


def merge(base: Any, override: Any, key: str | None = None) -> Any:
    """Deep-merge ``override`` onto ``base`` (at field ``key``). A mapping whose ``type`` changes is
    replaced whole, since the old variant's fields would not fit the new one; a variant's short
    form (``positional: rope``) is its ``{type: rope}``, which keeps the preset's other fields of
    the same variant."""
    if key in SHORT_FORMS and isinstance(base, dict) and isinstance(override, str):
        override = {"type": override}
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "type" in override and override.get("type") != base.get("type"):
        return override
    merged = dict(base)
    for name, value in override.items():
        merged[name] = merge(base[name], value, name) if name in base else value
    return merged
