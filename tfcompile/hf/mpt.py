"""MPT (``MptForCausalLM``; MosaicML's remote-code ``MPTForCausalLM``: MPT-7B, MPT-7B-Instruct):
ALiBi (``positional: alibi``; transformers adds m_h times each key's index less the last key's to
every score of a row, tfcompile -m_h times the query-to-key distance: the same softmax, padded or
not), pre-LayerNorm blocks in turn whose norms learn no shift, one fused ``Wqkv`` of [q, k, v]
(tfcompile's packed layout), no biases anywhere, a feed-forward 4 x d_model wide with the erf GELU,
and an LM head tied to the embeddings unless the config says otherwise. ``attn_config`` (a JSON
object, its problems named ``attn_config.FIELD``) holds the attention's fields: ``softmax_scale``
is ``attention_scale`` (null: 1/sqrt(head_dim)), ``clip_qkv`` is ``qkv_clip`` (0: none, as
transformers' truth test reads it) and ``attn_pdrop`` drops out the attention weights and each
sublayer's output, as transformers does.

transformers' slopes are 2^(-8h/n) for the power of two n at or above the heads (its alibi_bias_max
of 8), interleaved as BLOOM's for other head counts: tfcompile's ALiBi, the same float32 slopes up
to 64 heads and within a float32 rounding past them. transformers' MPT reads neither
``alibi_bias_max`` nor many other fields that the MosaicML code the checkpoints were trained with
computes from; each that makes that code compute otherwise is refused: ``attn_config`` with
``alibi`` false, ``alibi_bias_max`` other than 8, another ``attn_type`` than multi-head, ``qk_ln``,
``prefix_lm``, ``rope``, ``qk_gn``, a ``sliding_window_size``; ``no_bias`` false, an
``expansion_ratio`` other than 4, a ``logit_scale``, an RMSNorm ``norm_type``, an ``ffn_config`` of
another feed-forward or activation. Those that change no output are not read, as transformers
reads none: ``resid_pdrop``, ``emb_pdrop`` and ``embedding_fraction`` (training alone),
``attn_impl`` (the kernel), ``attn_uses_sequence_id`` (packed training sequences); nor is
``learned_pos_emb`` (a checkpoint that holds a position table is refused by that tensor).
export-hf does not write MPT: an ALiBi decoder is BLOOM's candidate, which refuses its erf GELU and
its missing embedding norm."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    Architecture,
    Config,
    Imported,
    State,
    Tensors,
    dropout,
    init_std,
    json_type,
    lm_head,
    register,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

CODE = "the MosaicML code the checkpoint was trained with"
NORMS = ("low_precision_layernorm", "layernorm")  # a LayerNorm in the MosaicML code, in float32
# The MosaicML code's feed-forward activation, torch's GELU: the erf one unless "approximate" says tanh
GELU = ({"name": "gelu"}, {"name": "gelu", "approximate": "none"})
# MPT's names within a block -> tfcompile's; none has a bias.
LAYER = (
    ("norm_1", "attn_norm"),
    ("attn.Wqkv", "attn.qkv"),
    ("attn.out_proj", "attn.out"),
    ("norm_2", "ffn_norm"),
    ("ffn.up_proj", "ffn.w_in"),
    ("ffn.down_proj", "ffn.w_out"),
)


def attention(config: Config) -> dict[str, Any]:
    """The spec's fields ``attn_config`` gives (``attention_scale``, ``qkv_clip``, ``dropout``);
    each of its fields that the MosaicML code computes otherwise than transformers is a problem
    named ``attn_config.FIELD``."""
    attn = config.within("attn_config")
    attn.require(
        attn.get("alibi", True),
        "alibi",
        f"is false: transformers' MPT adds ALiBi biases whatever it says, and {CODE} none",
        "import a model of ALiBi",
    )
    bias_max = attn.get("alibi_bias_max", 8)
    attn.require(
        bias_max == 8,
        "alibi_bias_max",
        f"is {bias_max!r}: transformers' MPT computes the ALiBi slopes of 8 whatever it says, and "
        f"{CODE} those of {bias_max!r}",
        "import a model of alibi_bias_max 8",
    )
    kind = attn.get("attn_type", "multihead_attention")
    attn.require(
        kind == "multihead_attention",
        "attn_type",
        f"is {kind!r}: transformers' MPT builds a K/V head per head whatever it says",
        "import a model of multihead_attention",
    )
    attn.refuse_true(
        "qk_ln",
        why="transformers' MPT normalises neither q nor k, and drops the checkpoint's norms of them",
    )
    attn.refuse_true("qk_gn", why=f"transformers' MPT normalises no head's q and k, and {CODE} does")
    attn.refuse_true("prefix_lm", why=f"{CODE} attends both ways within a prefix, transformers' MPT causally")
    attn.refuse_true("rope", why=f"{CODE} turns q and k by RoPE, transformers' MPT does not")
    window = attn.get("sliding_window_size", -1)
    attn.require(
        window == -1,
        "sliding_window_size",
        f"is {window!r}: {CODE} slides each query over that many keys, transformers' MPT over all",
        "import a model without a sliding window (-1)",
    )
    scale = attn.data.get("softmax_scale")
    attn.require(
        scale is None or json_type(scale) == "a number",
        "softmax_scale",
        f"{scale!r} is not a number",
        "fix the file",
    )
    clip = attn.get("clip_qkv", 0.0)  # 0 (and null): none, as transformers' truth test reads it
    p = dropout(attn.get("attn_pdrop", 0.0))
    fields: dict[str, Any] = {"dropout": {"attention": p, "residual": p}}
    if scale is not None:
        fields["attention_scale"] = scale  # not above 0: refused by the spec
    if clip:
        fields["qkv_clip"] = clip  # below 0: refused by the spec
    return fields


def feed_forward(config: Config) -> None:
    """Refuse an ``ffn_config`` (MosaicML's, which transformers does not read) of another
    feed-forward than MPT's erf GELU MLP."""
    ffn = config.within("ffn_config")
    kind = ffn.get("ffn_type", "mptmlp")
    ffn.require(
        kind == "mptmlp",
        "ffn_type",
        f"is {kind!r}: {CODE} computes another feed-forward than transformers' MPT",
        "import a model of mptmlp",
    )
    act = ffn.data.get("ffn_act_fn")
    ffn.require(
        act is None or act in GELU,
        "ffn_act_fn",
        f"is {act!r}: {CODE} computes it, transformers' MPT the erf GELU",
        "import a model of the erf GELU",
    )


@register("mpt")
class Mpt(Architecture):
    prefixes = ("transformer.",)
    # MptConfig's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
    }
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_seq_len",
        "model.d_model": "d_model",
        "model.d_ff": "d_model",
        "model.n_layers": "n_layers",
        "model.n_heads": "n_heads",
        "model.norm.eps": "layer_norm_epsilon",
        "model.attention_scale": "attn_config.softmax_scale",
        "model.qkv_clip": "attn_config.clip_qkv",
        "model.dropout.attention": "attn_config.attn_pdrop",
        "model.dropout.residual": "attn_config.attn_pdrop",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("MptForCausalLM", "MPTForCausalLM", "MptModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import an MptForCausalLM (or MosaicML's MPTForCausalLM)",
        )
        tie = lm_head(config, tensors, architecture, ("lm_head.weight", "wte.weight"), True, "MptForCausalLM")
        config.require(
            config.get("no_bias", True),
            "no_bias",
            f"is false: transformers' MPT builds no biases and drops the checkpoint's, which {CODE} adds",
            "import a model without biases",
        )
        ratio = config.get("expansion_ratio", 4)
        config.require(
            ratio == 4,
            "expansion_ratio",
            f"is {ratio!r}: transformers' MPT builds a feed-forward 4 x d_model wide whatever it says",
            "import a model of expansion_ratio 4",
        )
        scale = config.data.get("logit_scale")
        config.require(
            scale is None,
            "logit_scale",
            f"is {scale!r}: {CODE} scales the logits by it, transformers' MPT does not",
            "import a model without it (null)",
        )
        norm = config.get("norm_type", "low_precision_layernorm")
        config.require(
            norm.lower() in NORMS,
            "norm_type",
            f"is {norm!r}: transformers' MPT computes a LayerNorm whatever it says, and {CODE} that",
            f"import a model of one of {list(NORMS)}",
        )
        feed_forward(config)
        d = config.get("d_model", 2048)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 50368),
            "max_seq_len": config.get("max_seq_len", 2048),
            "d_model": d,
            "n_layers": config.get("n_layers", 24),
            "n_heads": config.get("n_heads", 16),
            "d_ff": 4 * d,
            "activation": "gelu",  # nn.GELU(approximate="none")
            "positional": {"type": "alibi"},
            "norm": {
                "position": "pre",
                "type": "layernorm",
                "eps": config.get("layer_norm_epsilon", 1e-5),
                "bias": False,
            },
            "bias": {"qkv": False, "attn_out": False, "ffn": False, "lm_head": False},
            "tie_embeddings": tie,
            "init_std": init_std(config),
        } | attention(config)
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("wte.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("norm_f.weight"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            for hf, tfc in LAYER:
                state[f"blocks.{i}.{tfc}.weight"] = tensors.take(f"blocks.{i}.{hf}.weight")
        return state
