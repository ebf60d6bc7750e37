"""BERT (``BertForMaskedLM``, ``BertForPreTraining``, ``BertForSequenceClassification``): summed
token, position and segment embeddings with a norm, post-LayerNorm blocks, the pooler (tanh of a
dense layer on [CLS]) under the sentence-level heads, and under a masked LM whose checkpoint holds
it (bert-base-uncased's, pretrained with next-sentence prediction): the masked LM does not read it,
and a classifier fine-tuned from the import starts from it, as transformers'
``BertForSequenceClassification.from_pretrained`` does."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
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
    pad_within,
    register,
    tied,
    zeros_if_none,
)
from tfcompile.hf.errors import HFWarning, Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import (
    ClassificationTask,
    EncoderSpec,
    LearnedPositional,
    MaskedLMTask,
    RopePositional,
)

HEADS: dict[str, tuple[dict[str, Any], bool]] = {  # head class -> (task section, masked LM head)
    "BertForMaskedLM": ({"type": "masked_lm", "next_sentence": False}, True),
    "BertForPreTraining": ({"type": "masked_lm", "next_sentence": True}, True),
    "BertForSequenceClassification": ({"type": "classification"}, False),
}
LAYER = (  # BERT's names within a block -> tfcompile's (post-norm: attn_norm follows attention)
    ("attention.output.dense", "attn.out"),
    ("attention.output.LayerNorm", "attn_norm"),
    ("intermediate.dense", "ffn.w_in"),
    ("output.dense", "ffn.w_out"),
    ("output.LayerNorm", "ffn_norm"),
)
EMBEDDINGS = (
    ("embeddings.word_embeddings.weight", "embed.weight"),
    ("embeddings.position_embeddings.weight", "positional.table.weight"),
    ("embeddings.LayerNorm.weight", "embed_norm.weight"),
    ("embeddings.LayerNorm.bias", "embed_norm.bias"),
)
DECODER = "cls.predictions.decoder.weight"
MLM_HEAD = (
    ("cls.predictions.transform.dense.weight", "mlm_dense.weight"),
    ("cls.predictions.transform.dense.bias", "mlm_dense.bias"),
    ("cls.predictions.transform.LayerNorm.weight", "mlm_norm.weight"),
    ("cls.predictions.transform.LayerNorm.bias", "mlm_norm.bias"),
)


@dataclass(frozen=True)
class MLMBias:
    """A masked-LM head's bias, saved under two names: ``shared`` (the head's own parameter) and
    ``decoder`` (the output projection's, which computes the logits). transformers 5 applies the
    decoder's where the checkpoint holds it, equal to the shared one or not (tie_word_embeddings
    ties the two only where they are equal); where it does not, the shared one if
    tie_word_embeddings is true (tied to it), else zeros (a missing parameter, initialised).
    transformers 4 held one parameter under both names."""

    shared: str
    decoder: str

    def applied(self, config: Config, tensors: Tensors) -> bool:
        """Whether the head adds a bias (``model.bias.lm_head``): not where transformers 5 adds zeros."""
        if self.decoder in tensors or config.get("tie_word_embeddings", True):
            return True
        warnings.warn(
            HFWarning(
                f"{self.decoder} is missing and tie_word_embeddings is false: transformers 5 adds no "
                f"bias to the logits (zeros), as the import does; transformers 4 added {self.shared}"
            ),
            stacklevel=3,
        )
        return False

    def take(self, tensors: Tensors, model: EncoderSpec) -> torch.Tensor | None:
        """The bias transformers 5 applies (None where the head has none); both names are read."""
        own = tensors.maybe(self.decoder)
        tensors.maybe(self.shared)  # read, applied or not
        if not model.bias.lm_head:
            return None
        return own if own is not None else tensors.take(self.shared)


@register("bert")
class Bert(Writable):
    caches = False  # an encoder: transformers generates nothing with it
    prefixes: ClassVar[tuple[str, ...]] = ("bert.",)
    ignored = ("embeddings.position_ids",)  # a buffer in old checkpoints
    # The masked-LM head's names (RoBERTa's and DistilBERT's are their own)
    decoder: ClassVar[str] = DECODER
    mlm_head: ClassVar[tuple[tuple[str, str], ...]] = MLM_HEAD
    mlm_bias: ClassVar[MLMBias] = MLMBias("cls.predictions.bias", "cls.predictions.decoder.bias")
    # Whether a masked LM's checkpoint's pooler is kept (model.pooler: true): BERT's classifier
    # reads the body's pooler, so transformers fine-tunes it from the one saved.
    keeps_pooler: ClassVar[bool] = True
    pooler_dense: ClassVar[str] = "pooler.dense"  # the pooler's layer (ALBERT's: pooler)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.norm.eps": "layer_norm_eps",
        "model.type_vocab_size": "type_vocab_size",
        "model.dropout.embedding": "hidden_dropout_prob",
        "model.dropout.residual": "hidden_dropout_prob",
        "model.dropout.attention": "attention_probs_dropout_prob",
        "model.init_std": "initializer_range",
        "task.labels": "id2label",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        task, mlm = HEADS.get(architecture, HEADS["BertForMaskedLM"])
        # A pooler under the sentence-level heads; BertForMaskedLM builds none, but keeps the one
        # its checkpoint holds where a classifier fine-tuned from it would read it (keeps_pooler).
        held = f"{self.pooler_dense}.weight" in tensors
        pooler = architecture != "BertForMaskedLM" or (self.keeps_pooler and held)
        config.require(
            architecture in HEADS,
            "architectures",
            f"{architecture} is not a BERT head tfcompile has",
            f"import one of {sorted(HEADS)}",
        )
        position = config.get("position_embedding_type", "absolute")
        config.require(
            position == "absolute",
            "position_embedding_type",
            f"{position!r}: relative position scores are not BERT's in tfcompile",
            "import a model with absolute positions",
        )
        config.refuse_true("is_decoder", "add_cross_attention", why="a BERT decoder is not an encoder")
        if architecture == "BertForSequenceClassification":
            task = task | {"labels": labels(config)}
        hidden_dropout = dropout(config.get("hidden_dropout_prob", 0.1))
        vocab = config.get("vocab_size", 30522)
        pad_within(config, vocab)
        model = {
            "family": "encoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 512),
            "d_model": config.get("hidden_size", 768),
            "n_layers": config.get("num_hidden_layers", 12),
            "n_heads": config.get("num_attention_heads", 12),
            "d_ff": config.get("intermediate_size", 3072),
            "activation": config.choice("hidden_act", "gelu", ACTIVATIONS, "BERT activation"),
            "positional": "learned",
            "norm": {"position": "post", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-12)},
            "embedding_norm": True,
            "type_vocab_size": config.get("type_vocab_size", 2),
            "pooler": pooler,
            "bias": {
                "qkv": True,
                "attn_out": True,
                "ffn": True,
                "lm_head": mlm and self.mlm_bias.applied(config, tensors),
            },
            "tie_embeddings": tied(config, tensors, self.decoder, "embeddings.word_embeddings.weight", True),
            "dropout": {
                "embedding": hidden_dropout,
                "residual": hidden_dropout,
                "attention": dropout(config.get("attention_probs_dropout_prob", 0.1)),
            },
            "init_std": init_std(config),
        }
        return Imported(model, task)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = body_state(tensors, model)
        if model.pooler:
            state["pooler.weight"] = tensors.take(f"{self.pooler_dense}.weight")
            state["pooler.bias"] = tensors.take(f"{self.pooler_dense}.bias")
        if isinstance(spec.task, MaskedLMTask):
            state |= self.mlm_state(tensors, model, state["embed.weight"])
            if spec.task.next_sentence:
                state["nsp_head.weight"] = tensors.take("cls.seq_relationship.weight")
                state["nsp_head.bias"] = tensors.take("cls.seq_relationship.bias")
        else:
            state["classifier.weight"] = tensors.take("classifier.weight")
            state["classifier.bias"] = tensors.take("classifier.bias")
        # bert-base-uncased, a BertForMaskedLM, holds the next-sentence head it was pretrained with
        # (its pooler is kept); transformers leaves a head its class does not build unread.
        unread = tensors.skip("cls.")
        if unread:
            warnings.warn(
                HFWarning(f"left out {', '.join(unread)}: heads of another BERT class, unread by this one"),
                stacklevel=2,
            )
        return state

    def mlm_state(self, tensors: Tensors, model: EncoderSpec, embed: torch.Tensor) -> State:
        """The masked-LM head's tensors: its transform, the output projection (``embed``, the
        embeddings, where tied) and the bias transformers applies."""
        state = {tfc: tensors.take(hf) for hf, tfc in self.mlm_head}
        state["lm_head.weight"] = tensors.take(self.decoder) if not model.tie_embeddings else embed
        tensors.maybe(self.decoder)  # a tie saved under both names
        if (bias := self.mlm_bias.take(tensors, model)) is not None:
            state["lm_head.bias"] = bias
        return state

    def candidate(self, spec: Spec) -> bool:
        """An encoder LM or classifier, but for factorized embeddings or a GELU pooler (ELECTRA's),
        shared layers (ALBERT's) and RoPE (ModernBERT's)."""
        model = spec.model
        return (
            isinstance(model, EncoderSpec)
            and isinstance(spec.task, MaskedLMTask | ClassificationTask)
            and not model.projects_embeddings
            and model.pooler_activation != "gelu"
            and not model.share_layers
            and not isinstance(model.positional, RopePositional)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        need = Needs("BERT")
        body_needs(need, model)
        need(
            not model.projects_embeddings,
            "model.embedding_size",
            model.embedding_size,
            "leave it unset (BERT's embeddings are d_model wide)",
        )
        unread = head_class(spec) == "BertForMaskedLM"  # a pooler BertForMaskedLM is written without
        need(
            unread or model.pooler_activation == "tanh",
            "model.pooler_activation",
            model.pooler_activation,
            "tanh (BERT's pooler)",
        )
        return [p for p in need.problems if p.field != "model.bias.lm_head"]  # BERT's head has a bias

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec)
        head = head_class(spec)
        config: dict[str, Any] = {
            "architectures": [head],
            "model_type": "bert",
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "intermediate_size": model.d_ff,
            "hidden_act": EXPORTED_ACTIVATIONS[model.activation],
            "max_position_embeddings": model.max_seq_len,
            "type_vocab_size": max(model.type_vocab_size, 1),
            "layer_norm_eps": model.norm.eps,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": model.tie_embeddings,
            "hidden_dropout_prob": model.dropout.residual,
            "attention_probs_dropout_prob": model.dropout.attention,
            "initializer_range": model.init_std,
        }
        if isinstance(task, ClassificationTask):
            assert task.labels is not None
            config["id2label"] = dict(enumerate(task.labels))
            config["label2id"] = {label: i for i, label in enumerate(task.labels)}
        return config

    def from_state(self, state: State, spec: Spec) -> State:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec)
        out = body_tensors(state, model, "bert.")
        # BertForMaskedLM's body builds no pooler: one the run has (kept from bert-base-uncased) is
        # not written, which transformers would load as an unexpected tensor.
        if head_class(spec) != "BertForMaskedLM":
            out["bert.pooler.dense.weight"] = state["pooler.weight"]
            out["bert.pooler.dense.bias"] = state["pooler.bias"]
        if isinstance(task, MaskedLMTask):
            out |= {hf: state[tfc] for hf, tfc in MLM_HEAD}
            bias = zeros_if_none(state.get("lm_head.bias"), state["lm_head.weight"].shape[0])
            out["cls.predictions.bias"] = bias
            if not model.tie_embeddings:  # transformers 5 reads the decoder's own bias when untied
                out["cls.predictions.decoder.weight"] = state["lm_head.weight"]
                out["cls.predictions.decoder.bias"] = bias.clone()
            if task.next_sentence:
                out["cls.seq_relationship.weight"] = state["nsp_head.weight"]
                out["cls.seq_relationship.bias"] = state["nsp_head.bias"]
        else:
            out["classifier.weight"] = state["classifier.weight"]
            out["classifier.bias"] = state["classifier.bias"]
        return contiguous(out)


@dataclass(frozen=True)
class Body:
    """The names of an encoder body's blocks: where each is (``blocks``, formatted with its index;
    a shared stack's all read the first), their q, k and v projections, and their other layers ->
    tfcompile's."""

    blocks: str
    qkv: tuple[str, str, str]
    layer: tuple[tuple[str, str], ...]


BODY = Body("encoder.layer.{}", ("attention.self.query", "attention.self.key", "attention.self.value"), LAYER)


def body_state(tensors: Tensors, model: EncoderSpec, body: Body = BODY) -> State:
    """The embeddings and blocks, as BERT names them (RoBERTa's and ELECTRA's body too; DistilBERT's
    and ALBERT's with their ``body``), -> the encoder's state."""
    state = {tfc: tensors.take(hf) for hf, tfc in EMBEDDINGS}
    if model.type_vocab_size:
        state["segment_embed.weight"] = tensors.take("embeddings.token_type_embeddings.weight")
    for i in range(model.n_layers):
        h, b = f"{body.blocks.format(0 if model.share_layers else i)}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            state[f"{b}attn.qkv.{kind}"] = tensors.cat(*(f"{h}{x}.{kind}" for x in body.qkv))
            for hf, tfc in body.layer:
                state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
    return state


def body_needs(need: Needs, model: EncoderSpec) -> None:
    """What export-hf requires of an encoder's body written as BERT's (and ELECTRA's)."""
    need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "gelu")
    need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
    need(model.norm.position == "post", "model.norm.position", model.norm.position, "post")
    need(bool(model.norm.bias), "model.norm.bias", False, "true")
    need(model.embedding_norm, "model.embedding_norm", False, "true")
    need(not model.norm.final, "model.norm.final", True, "false (BERT has none after its last block)")
    need(
        isinstance(model.positional, LearnedPositional), "model.positional", model.positional.type, "learned"
    )
    need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
    need(not model.share_layers, "model.share_layers", True, "false (ALBERT's)")
    need.plain_attention(model)


def body_tensors(state: State, model: EncoderSpec, prefix: str, body: Body = BODY) -> State:
    """The encoder's embeddings and blocks under BERT's names after ``prefix`` (ELECTRA's too;
    ALBERT's with its ``body``, a shared stack's one block): biases the run lacks as zeros, a
    missing segment table as one zero row."""
    out = {f"{prefix}{hf}": state[tfc] for hf, tfc in EMBEDDINGS}
    segments = state.get("segment_embed.weight", torch.zeros(1, model.embedding_width))
    out[f"{prefix}embeddings.token_type_embeddings.weight"] = segments
    for i in range(1 if model.share_layers else model.n_layers):
        h, b = f"{prefix}{body.blocks.format(i)}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            packed = zeros_if_none(state.get(f"{b}attn.qkv.{kind}"), 3 * model.d_model)
            for name, part in zip(body.qkv, packed.chunk(3), strict=True):
                out[f"{h}{name}.{kind}"] = part
            for hf, tfc in body.layer:
                rows = state[f"{b}{tfc}.weight"].shape[0]
                out[f"{h}{hf}.{kind}"] = zeros_if_none(state.get(f"{b}{tfc}.{kind}"), rows)
    return out


def as_bert(config: Config, architecture: str, heads: dict[str, str], family: str, why: str = "") -> str:
    """The BERT head class the head class ``architecture`` computes as (``heads``: RoBERTa's,
    ELECTRA's, ALBERT's, each its ``family``'s); another is a problem at architectures (``why``
    added to its hint), read as BertForMaskedLM."""
    config.require(
        architecture in heads,
        "architectures",
        f"{architecture} is not {family} head tfcompile has",
        f"import one of {sorted(heads)}{why}",
    )
    return heads.get(architecture, "BertForMaskedLM")


def erf_gelu_head(config: Config, mlm: bool, head: str) -> None:
    """A masked-LM head that applies the erf GELU whatever ``hidden_act`` says (RoBERTa's,
    ELECTRA's): the spec's applies the body's activation, so another is a problem (a name
    tfcompile has not is Bert.read's)."""
    act = config.get("hidden_act", "gelu")
    config.require(
        not mlm or act in ("gelu", "gelu_python") or act not in ACTIVATIONS,
        "hidden_act",
        f"{act!r}: {head} applies GELU whatever hidden_act says, tfcompile's the body's activation",
        "import a masked LM with hidden_act gelu",
    )


def head_class(spec: Spec) -> str:
    if isinstance(spec.task, ClassificationTask):
        return "BertForSequenceClassification"
    assert isinstance(spec.task, MaskedLMTask)
    return "BertForPreTraining" if spec.task.next_sentence else "BertForMaskedLM"


MAX_LABELS = 1 << 20  # ImageNet-21k has 21,843 classes


def labels(config: Config) -> list[str]:
    """``task.labels`` from ``id2label``, in id order; single-label classification only."""
    problem = config.get("problem_type", "single_label_classification")
    config.require(
        problem == "single_label_classification",
        "problem_type",
        f"{problem!r}: tfcompile's classifiers pick one label with a softmax",
        "import a single-label classifier",
    )
    id2label = {}
    for key, name in config.get("id2label", {}).items():  # as transformers keys them: int(key)
        try:
            id2label[int(key)] = name
        except ValueError:
            config.refuse(
                "id2label", f"the key {key!r} is not an id", 'key each label by its id: "0", "1", ...'
            )
    count = config.get("num_labels", len(id2label) or 2)
    if not isinstance(count, int):  # 1.5 passes as a number
        config.refuse("num_labels", f"{count!r} is not a whole number of labels", "fix the file")
        count = 2
    if count > MAX_LABELS:  # each would be named before the checkpoint's head is compared
        config.refuse("num_labels", f"is {count:,}, more than {MAX_LABELS:,} labels", "fix the file")
        count = 2
    if count != len(id2label):  # transformers then names every label LABEL_i
        id2label = {}
    names = [str(id2label.get(i, f"LABEL_{i}")) for i in range(count)]
    config.require(count >= 2, "num_labels", f"is {count}: regression is not classification", "use 2 or more")
    return distinct(names)


def distinct(names: list[str]) -> list[str]:
    """Label names, each repeat of an earlier one followed by its id (google/vit-base-patch16-224
    names two ImageNet classes "crane"), again while that is another label's name: transformers
    keeps both outputs under one name, the spec needs a name per output; the outputs are the same,
    the renaming is warned of."""
    seen: set[str] = set()
    taken = set(names)  # a renamed label takes no name that another label has
    out = []
    for i, name in enumerate(names):
        new = name
        while new in seen or (new != name and new in taken):
            new = f"{new} ({i})"
        out.append(new)
        seen.add(new)
        taken.add(new)
    renamed = [f"{name!r} -> {new!r}" for name, new in zip(names, out, strict=True) if name != new]
    if renamed:
        warnings.warn(
            HFWarning(f"id2label names a label more than once; renamed: {', '.join(renamed)}"),
            stacklevel=3,
        )
    return out
