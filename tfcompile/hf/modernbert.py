"""ModernBERT (``ModernBertForMaskedLM``, ``ModernBertForSequenceClassification``: ModernBERT-base
and -large, and the classifiers fine-tuned from them): a pre-norm encoder of LayerNorms without
shifts (``norm_bias``), the first layer's attention reading the normalised embeddings as they are
(``norm.first_attention: false``), RoPE over whole heads in transformers' halves, GeGLU (``Wi``:
the activated half first), no biases, and global attention every ``global_attn_every_n_layers``-th
layer (transformers 5's ``layer_types``) with local attention over ``local_attention`` // 2
positions on either side in the others (``window``), each kind turning RoPE at its own theta
(``positional.local``). The masked LM's head is BERT's (dense, activation, norm, the tied decoder
with its bias); the classifier pools the [CLS] state or the mean of the real tokens'
(``pooling``) through the same dense, activation and norm (``pooler_norm``).

export-hf writes every encoder of RoPE as ModernBERT (BERT, ELECTRA and ALBERT have learned
positions): its local layers those of a window or a local theta, following the pattern
global_attn_every_n_layers can say (transformers 4 reads no layer_types), each head's dense layer
with its bias (zeros where the run has none, which is exact)."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    GATED_ACTIVATIONS,
    GATES,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Writable,
    contiguous,
    dropout,
    init_std,
    pad_within,
    register,
    tied,
    zeros_if_none,
)
from tfcompile.hf.bert import labels
from tfcompile.hf.errors import Problem
from tfcompile.hf.llama import listable
from tfcompile.spec import Spec
from tfcompile.spec.schema import (
    ClassificationTask,
    EncoderSpec,
    MaskedLMTask,
    RopePositional,
    sliding_layers,
)

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
    pattern = [SLIDING if i % every else FULL for i in range(count)]
    if types is None:
        return pattern
    config.require(
        "global_attn_every_n_layers" not in config.data or types == pattern,
        "layer_types",
        f"are not every {every}th layer full (global_attn_every_n_layers): transformers 5 reads layer_types, "
        "4 the pattern",
        "remove global_attn_every_n_layers, or set the two alike",
    )
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
    kind_of_rope = inner.get("rope_type", inner.get("type", "default"))  # "type": the older key
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
class ModernBert(Writable):
    prefixes = ("model.",)
    caches = False  # an encoder: its window is local_attention's over layer_types' sliding layers
    windows = "any"  # layer_types; exportable holds the layers to global_attn_every_n_layers' pattern
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
        # transformers 5 sets local_attention to twice a sliding_window in config.json; 4 reads none
        window = config.data.get("sliding_window", half)
        config.require(
            window == half,
            "sliding_window",
            f"is {window!r}, and local_attention // 2 {half}: transformers 5 attends over the first on "
            "either side, 4 over the second",
            "remove sliding_window",
        )
        d, heads = config.get("hidden_size", 768), config.get("num_attention_heads", 12)
        head_dim = config.data.get("head_dim")
        config.require(
            head_dim is None or (isinstance(d, int) and isinstance(heads, int) and heads * head_dim == d),
            "head_dim",
            f"is {head_dim!r}: ModernBERT's heads are hidden_size / num_attention_heads wide, and its RoPE "
            "reads head_dim (transformers fails on another)",
            "remove it",
        )
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
        pad_within(config.filled({}, nullable={"pad_token_id": 50283}), vocab)  # ModernBertConfig's pad
        norm_bias = bool(config.get("norm_bias", False))
        attention_bias, mlp_bias = (
            bool(config.get("attention_bias", False)),
            bool(config.get("mlp_bias", False)),
        )
        model: dict[str, Any] = {
            "family": "encoder",
            "vocab_size": vocab,
            "max_seq_len": context,
            "d_model": d,
            "n_layers": n_layers,
            "n_heads": heads,
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
                "pooling": config.choice("classifier_pooling", "cls", POOLINGS, "pooling"),
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

    def candidate(self, spec: Spec) -> bool:
        """An encoder LM or classifier of RoPE (BERT's, ELECTRA's and ALBERT's positions are learned)."""
        model = spec.model
        return (
            isinstance(model, EncoderSpec)
            and isinstance(spec.task, MaskedLMTask | ClassificationTask)
            and isinstance(model.positional, RopePositional)
            and not model.share_layers
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs("ModernBERT")
        need.plain_attention(model)  # but for what ModernBERT has: the first norm, its head's, a decoder bias
        need.problems = [p for p in need.problems if p.field not in HAS]
        act = model.activation
        need(act in HIDDEN_ACTIVATIONS, "model.activation", act, "geglu, geglu_tanh or swiglu (gated)")
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need(not model.norm.first_attention, "model.norm.first_attention", True, "false (ModernBERT's)")
        need(model.embedding_norm, "model.embedding_norm", False, "true")
        need(model.type_vocab_size == 0, "model.type_vocab_size", model.type_vocab_size, "0 (no segments)")
        need(not model.projects_embeddings, "model.embedding_size", model.embedding_size, "d_model")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need(
            model.bias.qkv == model.bias.attn_out,
            "model.bias.attn_out",
            model.bias.attn_out,
            f"{model.bias.qkv}, as bias.qkv (ModernBERT's attention_bias is both)",
        )
        rope = model.positional
        need(rope.layout == "halves", "model.positional.layout", rope.layout, "halves")
        need(rope.scaling is None, "model.positional.scaling", rope.scaling, "leave it unset")
        need(rope.local is None or rope.local.scaling is None, "model.positional.local.scaling", True, "none")
        need(rope.nope_layers is None, "model.positional.nope_layers", rope.nope_layers, "leave it unset")
        need(
            rope.rotary_dims == model.head_dim,
            "model.positional.rotary_dims",
            rope.rotary_dims,
            "leave it unset (all of head_dim)",
        )
        local = sorted(local_layers(model))
        if model.window is not None and rope.local is not None:
            need(
                sorted(rope.local.layers) == sorted(sliding_layers(model.window, model.n_layers)),
                "model.positional.local.layers",
                rope.local.layers,
                "the window's layers (ModernBERT's local layers have both)",
            )
        need(
            every_nth(local, model.n_layers) is not None,
            "model.window.layers" if model.window is not None else "model.positional.local.layers",
            local,
            "every layer but each n-th from layer 0 (global_attn_every_n_layers: transformers 4 reads no "
            "layer_types)",
        )
        if isinstance(task, MaskedLMTask):
            need(not task.next_sentence, "task.next_sentence", True, "false")
            need(not model.pooler, "model.pooler", True, "false (ModernBertForMaskedLM has none)")
        else:
            need(model.pooler_norm, "model.pooler_norm", False, "true (ModernBERT's head has a LayerNorm)")
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec) and isinstance(model.positional, RopePositional)
        rope = model.positional
        local = local_layers(model)
        every = every_nth(sorted(local), model.n_layers)
        local_theta = rope.local.theta if rope.local is not None else rope.theta
        mlm = isinstance(task, MaskedLMTask)
        window = model.window
        config: dict[str, Any] = {
            "architectures": ["ModernBertForMaskedLM" if mlm else "ModernBertForSequenceClassification"],
            "model_type": "modernbert",
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "intermediate_size": model.d_ff,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "hidden_activation": HIDDEN_ACTIVATIONS[model.activation],
            "max_position_embeddings": model.max_seq_len,
            "norm_eps": model.norm.eps,
            "norm_bias": bool(model.norm.bias),
            "attention_bias": model.bias.qkv,
            "mlp_bias": model.bias.ffn,
            "layer_types": [SLIDING if i in local else FULL for i in range(model.n_layers)],
            "global_attn_every_n_layers": every,
            # a window over every position where the local layers only turn at their own theta
            "local_attention": window.size - 1 if window is not None else 2 * model.max_seq_len,
            "rope_parameters": {
                FULL: {"rope_type": "default", "rope_theta": rope.theta},
                SLIDING: {"rope_type": "default", "rope_theta": local_theta},
            },
            "global_rope_theta": rope.theta,
            "local_rope_theta": local_theta,
            "classifier_bias": True,  # the head's dense layer's bias, zeros where the run has none
            "classifier_activation": (
                HIDDEN_ACTIVATIONS[model.activation] if mlm else POOLER_NAMES[model.pooler_activation]
            ),
            "classifier_pooling": model.pooling,
            "decoder_bias": model.bias.lm_head,
            "tie_word_embeddings": model.tie_embeddings if mlm else False,
            "embedding_dropout": model.dropout.embedding,
            "attention_dropout": model.dropout.attention,
            "mlp_dropout": model.dropout.residual,
            "initializer_range": model.init_std,
            "cls_token_id": None,  # the run's, as export-hf writes every role's id
            "sep_token_id": None,
        }
        if isinstance(task, ClassificationTask):
            assert task.labels is not None
            config["id2label"] = dict(enumerate(task.labels))
            config["label2id"] = {label: i for i, label in enumerate(task.labels)}
        return config

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        mlm = isinstance(spec.task, MaskedLMTask)
        out = {f"model.{EMBEDDINGS}": state["embed.weight"]}
        out |= norm_tensors(state, "embed_norm", "model.embeddings.norm")
        for i in range(model.n_layers):
            for hf, tfc in LAYER:
                if hf == "attn_norm" and i == 0:
                    continue
                name, ours = f"model.layers.{i}.{hf}", f"blocks.{i}.{tfc}"
                if hf.endswith("norm"):
                    out |= norm_tensors(state, ours, name)
                    continue
                out[f"{name}.weight"] = state[f"{ours}.weight"]
                if f"{ours}.bias" in state:
                    out[f"{name}.bias"] = state[f"{ours}.bias"]
        out |= norm_tensors(state, "final_norm", "model.final_norm")
        dense, norm = ("mlm_dense", "mlm_norm") if mlm else ("pooler", "pooler_norm")
        out["head.dense.weight"] = state[f"{dense}.weight"]
        out["head.dense.bias"] = zeros_if_none(state.get(f"{dense}.bias"), model.d_model)
        out |= norm_tensors(state, norm, "head.norm")
        if mlm:
            if not model.tie_embeddings:
                out["decoder.weight"] = state["lm_head.weight"]
            if "lm_head.bias" in state:
                out["decoder.bias"] = state["lm_head.bias"]
        else:
            out["classifier.weight"] = state["classifier.weight"]
            out["classifier.bias"] = state["classifier.bias"]
        return contiguous(out)


# The gated activations -> ModernBERT's hidden_activation (its f); the pooler's -> ACT2FN's names.
HIDDEN_ACTIVATIONS = {gated: EXPORTED_ACTIVATIONS[plain] for plain, gated in GATES.items()}
POOLER_NAMES = {"gelu": "gelu", "relu": "relu", "tanh": "tanh"}
# What the plain writers refuse and ModernBERT has (its own needs say how).
HAS = {"model.norm.first_attention", "model.pooling", "model.pooler_norm", "model.bias.lm_head"}


def local_layers(model: EncoderSpec) -> frozenset[int]:
    """The layers ModernBERT calls sliding: the window's, else those turning at a local theta."""
    if model.window is not None:
        return sliding_layers(model.window, model.n_layers)
    rope = model.positional
    local = rope.local if isinstance(rope, RopePositional) else None
    return frozenset(local.layers) if local is not None else frozenset()


def every_nth(local: list[int], n_layers: int) -> int | None:
    """The global_attn_every_n_layers whose pattern (layer i global where i % n == 0) has exactly
    the ``local`` layers, or None where none has."""
    for n in range(1, n_layers + 1):
        if [i for i in range(n_layers) if i % n] == local:
            return n
    return None


def norm_tensors(state: State, tfc: str, hf: str) -> State:
    """A norm's scale, and its shift where it has one."""
    out = {f"{hf}.weight": state[f"{tfc}.weight"]}
    if f"{tfc}.bias" in state:
        out[f"{hf}.bias"] = state[f"{tfc}.bias"]
    return out


def norm_state(tensors: Tensors, hf: str, tfc: str, model: EncoderSpec) -> State:
    """A LayerNorm's scale, and its shift where the model's norms have one (``norm_bias``)."""
    state = {f"{tfc}.weight": tensors.take(f"{hf}.weight")}
    if model.norm.bias:
        state[f"{tfc}.bias"] = tensors.take(f"{hf}.bias")
    return state
