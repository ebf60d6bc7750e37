"""ModernBERT (``ModernBertForMaskedLM``, ``ModernBertForSequenceClassification``: ModernBERT-base
and -large, and the classifiers fine-tuned from them): a pre-norm encoder of LayerNorms without
shifts (``norm_bias``), the first layer's attention reading the normalised embeddings as they are
(``norm.first_attention: false``), RoPE over whole heads in transformers' halves, GeGLU (``Wi``:
the activated half first), no biases, and global attention every ``global_attn_every_n_layers``-th
layer (transformers 5's ``layer_types``) with local attention over ``local_attention`` // 2
positions on either side in the others (``window``), each kind turning RoPE at its own theta
(``positional.local``). The masked LM's head is BERT's (dense, activation, norm, the tied decoder
with its bias); the classifier pools the [CLS] state or the mean of the real tokens'
(``pooling``) through the same dense, activation and norm (``pooler_norm``). Import only: export-hf
writes no ModernBERT."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    Architecture,
    Config,
    Imported,
    State,
    Tensors,
    dropout,
    init_std,
    pad_within,
    register,
    tied,
)
from tfcompile.hf.bert import labels
from tfcompile.hf.llama import listable
from tfcompile.spec import Spec
from tfcompile.spec.schema import EncoderSpec, MaskedLMTask

HEADS: dict[str, tuple[dict[str, Any], bool]] = {  # head class -> (task section, masked LM head)
    "ModernBertForMaskedLM": ({"type": "masked_lm", "next_sentence": False}, True),
    "ModernBertForSequenceClassification": ({"type": "classification"}, False),
}
POOLINGS = {"cls": "cls", "mean": "mean"}  # classifier_pooling: what the head reads
POOLER_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "relu": "relu", "tanh": "tanh"}
FULL, SLIDING = "full_attention", "sliding_attention"
THETAS = {FULL: ("global_rope_theta", 160000.0), SLIDING: ("local_rope_theta", 10000.0)}
LAYER = (  # ModernBERT's names within a layer -> tfcompile's
    ("attn_norm", "attn_norm"),
    ("attn.Wqkv", "attn.qkv"),
    ("attn.Wo", "attn.out"),
    ("mlp_norm", "ffn_norm"),
    ("mlp.Wi", "ffn.w_in"),
    ("mlp.Wo", "ffn.w_out"),
)
EMBEDDINGS = "embeddings.tok_embeddings.weight"


def layer_types(config: Config, n_layers: Any) -> list[str]:
    """Each layer's kind: ``layer_types`` (transformers 5 saves them), else every
    ``global_attn_every_n_layers``-th layer full from layer 0, the others sliding (4 reads only this)."""
    every = config.get("global_attn_every_n_layers", 3)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        config.refuse("global_attn_every_n_layers", f"{every!r} is not a whole number of layers", "1 or more")
        every = 1
    types = config.data.get("layer_types")
    count = n_layers if listable(n_layers) else 0  # another is refused by the spec, by its field
    if types is None:
        return [SLIDING if i % every else FULL for i in range(count)]
    if not (isinstance(types, list) and len(types) == count and all(t in (FULL, SLIDING) for t in types)):
        config.refuse(
            "layer_types",
            f"{types!r} is not {FULL} or {SLIDING} for each of the {n_layers} layers",
            f"list {FULL} or {SLIDING} for each layer, or leave layer_types out",
        )
        return [FULL] * count
    return types


def theta(config: Config, kind: str) -> float:
    """The RoPE base of ``kind``'s layers: ``rope_parameters[kind]`` (transformers 5's), else the
    older field (``global_rope_theta``, ``local_rope_theta``) or ModernBertConfig's default; the
    default kind only (no scaling), as ModernBERT's checkpoints have."""
    field, default = THETAS[kind]
    older = config.data.get(field, default)
    params = config.data.get("rope_parameters")
    inner = params.get(kind) if isinstance(params, dict) else None
    where = f"rope_parameters.{kind}"
    if params is not None and not isinstance(inner, dict | None):
        config.refuse(where, f"{inner!r} is not a JSON object", "fix the file")
    inner = inner if isinstance(inner, dict) else {}
    kind_of_rope = inner.get("rope_type", "default")
    config.require(
        kind_of_rope == "default",
        f"{where}.rope_type",
        f"{kind_of_rope!r}: ModernBERT's scaled RoPE is not imported",
        "import a model of the default RoPE",
    )
    config.require(
        config.data.get("rope_scaling") is None,
        "rope_scaling",
        "scales ModernBERT's RoPE, which is not imported",
        "remove it (null)",
    )
    value = inner.get("rope_theta", older)
    config.require(
        isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
        f"{where}.rope_theta" if "rope_theta" in inner else field,
        f"{value!r} is not a RoPE base above 0 (transformers 4 reads a null {field} otherwise than 5)",
        "a number above 0",
    )
    config.require(
        "rope_theta" not in inner or field not in config.data or older == value,
        field,
        f"is {older!r}, and {where}.rope_theta {value!r}: transformers 5 reads the second, 4 the first",
        f"remove {field}, or set the two alike",
    )
    return float(value) if isinstance(value, int | float) and value > 0 else default


@register("modernbert")
class ModernBert(Architecture):
    prefixes = ("model.",)
    reads_window = True  # local_attention over layer_types' sliding layers (an encoder: no generation cache)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_activation",
        "model.norm.eps": "norm_eps",
        "model.window.size": "local_attention",
        "model.positional.theta": "global_rope_theta",
        "model.positional.local.theta": "local_rope_theta",
        "model.dropout.embedding": "embedding_dropout",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "mlp_dropout",
        "model.init_std": "initializer_range",
        "task.labels": "id2label",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in HEADS,
            "architectures",
            f"{architecture} is not a ModernBERT head tfcompile has",
            f"import one of {sorted(HEADS)}",
        )
        task, mlm = HEADS.get(architecture, HEADS["ModernBertForMaskedLM"])
        if not mlm:
            task = task | {"labels": labels(config)}
        n_layers, context = config.get("num_hidden_layers", 22), config.get("max_position_embeddings", 8192)
        kinds = layer_types(config, n_layers)
        sliding = [i for i, kind in enumerate(kinds) if kind == SLIDING]
        thetas = {kind: theta(config, kind) for kind in THETAS}
        local = config.get("local_attention", 128)
        config.require(
            isinstance(local, int) and not isinstance(local, bool) and local >= 0,
            "local_attention",
            f"{local!r} is not a whole number of positions",
            "0 or more",
        )
        half = local // 2 if isinstance(local, int) and local >= 0 else 0
        # a window of every position of the context is none
        reaches = isinstance(context, int) and half < context - 1
        act = config.get("hidden_activation", "gelu")
        gated = config.choice("hidden_activation", "gelu", GATED_ACTIVATIONS, "ModernBERT activation")
        head_act = config.get("classifier_activation", "gelu")
        if mlm:  # the spec's masked-LM head applies the body's activation, ungated
            config.require(
                ACTIVATIONS.get(head_act, head_act) == ACTIVATIONS.get(act, act),
                "classifier_activation",
                f"{head_act!r}: the masked-LM head's activation, and the body's is {act!r}: tfcompile's head "
                "applies the body's",
                f"import a masked LM whose classifier_activation is {act!r}",
            )
        tie = mlm and tied(config, tensors, "decoder.weight", EMBEDDINGS, True)
        config.require(
            not mlm or tie or "decoder.weight" in tensors,
            "architectures",
            f"{architecture} holds no decoder.weight and does not tie one to its embeddings",
            "import the ModernBertForMaskedLM checkpoint",
        )
        vocab = config.get("vocab_size", 50368)
        pad_within(config, vocab)
        norm_bias = bool(config.get("norm_bias", False))
        attention_bias, mlp_bias = (
            bool(config.get("attention_bias", False)),
            bool(config.get("mlp_bias", False)),
        )
        model: dict[str, Any] = {
            "family": "encoder",
            "vocab_size": vocab,
            "max_seq_len": context,
            "d_model": config.get("hidden_size", 768),
            "n_layers": n_layers,
            "n_heads": config.get("num_attention_heads", 12),
            "d_ff": config.get("intermediate_size", 1152),
            "activation": gated,
            "positional": {
                "type": "rope",
                "layout": "halves",
                "theta": thetas[FULL],
                **({"local": {"theta": thetas[SLIDING], "layers": sliding}} if sliding else {}),
            },
            "window": {"size": 2 * half + 1, "layers": sliding} if sliding and reaches else None,
            "norm": {
                "position": "pre",
                "type": "layernorm",
                "eps": config.get("norm_eps", 1e-5),
                "bias": norm_bias,
                "first_attention": False,
            },
            "embedding_norm": True,
            "type_vocab_size": 0,
            "pooler": not mlm,
            "bias": {
                "qkv": attention_bias,
                "attn_out": attention_bias,
                "ffn": mlp_bias,
                "lm_head": mlm and bool(config.get("decoder_bias", True)),
            },
            "tie_embeddings": tie,
            "dropout": {
                "embedding": dropout(config.get("embedding_dropout", 0.0)),
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": dropout(config.get("mlp_dropout", 0.0)),
            },
            "init_std": init_std(config),
        }
        if not mlm:
            model |= {
                "pooling": config.choice(
                    "classifier_pooling", "cls", {"cls": "cls", "mean": "mean"}, "pooling"
                ),
                "pooler_activation": config.choice(
                    "classifier_activation", "gelu", POOLER_ACTIVATIONS, "ModernBERT head activation"
                ),
                "pooler_norm": True,
            }
        return Imported(model, task)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = {"embed.weight": tensors.take(EMBEDDINGS)}
        state |= norm_state(tensors, "embeddings.norm", "embed_norm", model)
        for i in range(model.n_layers):
            for hf, tfc in LAYER:
                if hf == "attn_norm" and i == 0:  # the first layer's attention reads no norm
                    continue
                if hf.endswith("norm"):
                    state |= norm_state(tensors, f"layers.{i}.{hf}", f"blocks.{i}.{tfc}", model)
                    continue
                state[f"blocks.{i}.{tfc}.weight"] = tensors.take(f"layers.{i}.{hf}.weight")
                biased = model.bias.ffn if tfc.startswith("ffn") else model.bias.qkv
                if biased:
                    state[f"blocks.{i}.{tfc}.bias"] = tensors.take(f"layers.{i}.{hf}.bias")
        state |= norm_state(tensors, "final_norm", "final_norm", model)
        mlm = isinstance(spec.task, MaskedLMTask)
        dense, norm = ("mlm_dense", "mlm_norm") if mlm else ("pooler", "pooler_norm")
        weight = tensors.take("head.dense.weight")
        state[f"{dense}.weight"] = weight
        bias = tensors.maybe("head.dense.bias")  # classifier_bias; none: zeros, which is exact
        state[f"{dense}.bias"] = bias if bias is not None else weight.new_zeros(weight.shape[0])
        state |= norm_state(tensors, "head.norm", norm, model)
        if mlm:
            head = tensors.maybe("decoder.weight")  # a tie saved under both names, or the untied head
            state["lm_head.weight"] = state["embed.weight"] if model.tie_embeddings or head is None else head
            if model.bias.lm_head:
                state["lm_head.bias"] = tensors.take("decoder.bias")
        else:
            state["classifier.weight"] = tensors.take("classifier.weight")
            state["classifier.bias"] = tensors.take("classifier.bias")
        return state


def norm_state(tensors: Tensors, hf: str, tfc: str, model: EncoderSpec) -> State:
    """A LayerNorm's scale, and its shift where the model's norms have one (``norm_bias``)."""
    state = {f"{tfc}.weight": tensors.take(f"{hf}.weight")}
    if model.norm.bias:
        state[f"{tfc}.bias"] = tensors.take(f"{hf}.bias")
    return state
