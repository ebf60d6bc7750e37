"""DistilBERT (``DistilBertForMaskedLM``, ``DistilBertForSequenceClassification``): BERT's
post-LayerNorm body without segments, under other names (q_lin, k_lin, v_lin, out_lin;
sa_layer_norm, output_layer_norm; ffn.lin1 and lin2), every LayerNorm's epsilon 1e-12; the
masked-LM head vocab_transform -> activation -> vocab_layer_norm -> vocab_projector, and the
classifier pre_classifier -> ReLU -> classifier on [CLS], which is BERT's pooler (with ReLU for its
tanh: ``model.pooler_activation: relu``) and classifier.

The position table is read as learned positions whatever ``sinusoidal_pos_embds`` says: a
sinusoidal model saves its table too, and transformers reads the one saved. export-hf writes a
masked LM as BERT's ``BertForMaskedLM`` (a zero segment row, no pooler), which computes it exactly;
a classifier it refuses (BERT's pooler is tanh), as it writes no DistilBERT class."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
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
from tfcompile.hf.bert import Bert, Body, MLMBias, body_state, labels
from tfcompile.spec import Spec
from tfcompile.spec.schema import EncoderSpec, MaskedLMTask

EPS = 1e-12  # DistilBERT's LayerNorms, fixed in its code
LAYER = (  # DistilBERT's names within a block -> tfcompile's (post-norm)
    ("attention.out_lin", "attn.out"),
    ("sa_layer_norm", "attn_norm"),
    ("ffn.lin1", "ffn.w_in"),
    ("ffn.lin2", "ffn.w_out"),
    ("output_layer_norm", "ffn_norm"),
)
BODY = Body("transformer.layer.{}", ("attention.q_lin", "attention.k_lin", "attention.v_lin"), LAYER)
DECODER = "vocab_projector.weight"
MLM_HEAD = (
    ("vocab_transform.weight", "mlm_dense.weight"),
    ("vocab_transform.bias", "mlm_dense.bias"),
    ("vocab_layer_norm.weight", "mlm_norm.weight"),
    ("vocab_layer_norm.bias", "mlm_norm.bias"),
)
HEAD = "DistilBertForMaskedLM"
CLASSIFIER = "DistilBertForSequenceClassification"
CLASSIFIER_HEAD = (  # pre_classifier -> ReLU on [CLS] is the pooler (pooler_activation: relu)
    ("pre_classifier.weight", "pooler.weight"),
    ("pre_classifier.bias", "pooler.bias"),
    ("classifier.weight", "classifier.weight"),
    ("classifier.bias", "classifier.bias"),
)


@register("distilbert")
class DistilBert(Bert):
    prefixes = ("distilbert.",)
    # DistilBertConfig's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "hidden_size": "dim",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
    }
    ignored = ("embeddings.position_ids",)
    decoder: ClassVar[str] = DECODER
    mlm_head: ClassVar[tuple[tuple[str, str], ...]] = MLM_HEAD
    # One bias, the projection's, under both of MLMBias's names: it is the one applied.
    mlm_bias: ClassVar[MLMBias] = MLMBias("vocab_projector.bias", "vocab_projector.bias")
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "dim",
        "model.n_layers": "n_layers",
        "model.n_heads": "n_heads",
        "model.d_ff": "hidden_dim",
        "model.activation": "activation",
        "model.dropout.embedding": "dropout",
        "model.dropout.residual": "dropout",
        "model.dropout.attention": "attention_dropout",
        "model.init_std": "initializer_range",
        "task.labels": "id2label",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in (HEAD, CLASSIFIER),
            "architectures",
            f"{architecture} is not a DistilBERT head tfcompile has",
            f"import one of {sorted((HEAD, CLASSIFIER))}",
        )
        classifier = architecture == CLASSIFIER
        task: dict[str, Any] = (
            {"type": "classification", "labels": labels(config)}
            if classifier
            else {"type": "masked_lm", "next_sentence": False}
        )
        hidden_dropout = dropout(config.get("dropout", 0.1))
        vocab = config.get("vocab_size", 30522)
        pad_within(config, vocab)
        model = {
            "family": "encoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 512),
            "d_model": config.get("dim", 768),
            "n_layers": config.get("n_layers", 6),
            "n_heads": config.get("n_heads", 12),
            "d_ff": config.get("hidden_dim", 3072),
            "activation": config.choice("activation", "gelu", ACTIVATIONS, "DistilBERT activation"),
            "positional": "learned",
            "norm": {"position": "post", "type": "layernorm", "eps": EPS},
            "embedding_norm": True,
            "type_vocab_size": 0,
            "pooler": classifier,
            **({"pooler_activation": "relu"} if classifier else {}),
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": not classifier},
            "tie_embeddings": tied(config, tensors, DECODER, "embeddings.word_embeddings.weight", True),
            "dropout": {
                "embedding": hidden_dropout,
                "residual": hidden_dropout,
                "attention": dropout(config.get("attention_dropout", 0.1)),
            },
            "init_std": init_std(config),
        }
        return Imported(model, task)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = body_state(tensors, model, BODY)  # BERT's embeddings, without segments
        if isinstance(spec.task, MaskedLMTask):
            return state | self.mlm_state(tensors, model, state["embed.weight"])
        return state | {tfc: tensors.take(hf) for hf, tfc in CLASSIFIER_HEAD}

    def candidate(self, spec: Spec) -> bool:
        return False  # BERT writes every spec DistilBERT could, computing the same
