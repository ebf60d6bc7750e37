"""ALBERT (``AlbertForMaskedLM``, ``AlbertForSequenceClassification``): BERT's post-LayerNorm
body with factorized embeddings (``embedding_size`` wide, ``embedding_hidden_mapping_in`` to the
blocks' width: the spec's ``embedding_size``) and one block's weights in every layer
(``num_hidden_groups: 1``: the spec's ``share_layers``; a group per layer is BERT's unshared
stack), BERT's pooler and classifier, and a masked-LM head back to the embeddings' width that
applies ``hidden_act`` (``gelu_new`` by default) as the spec's does. Refused: other group counts
and ``inner_group_num`` above 1 (layers of several blocks), embeddings as wide as the blocks (ALBERT
keeps its projection then, which the spec builds only between different widths), and
``AlbertForPreTraining`` (its sentence-order head is no task of tfcompile's).

export-hf writes an encoder of shared layers as ALBERT, with BERT's requirements on the body."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    contiguous,
    register,
    zeros_if_none,
)
from tfcompile.hf.bert import (
    MLM_HEAD,
    Bert,
    Body,
    MLMBias,
    as_bert,
    body_needs,
    body_state,
    body_tensors,
    head_class,
)
from tfcompile.hf.errors import Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import ClassificationTask, EncoderSpec, MaskedLMTask

AS_BERT = {
    "AlbertForMaskedLM": "BertForMaskedLM",
    "AlbertForSequenceClassification": "BertForSequenceClassification",
}
# AlbertConfig's defaults (ALBERT-xxlarge's sizes) where BertConfig's, which Bert.read falls back on,
# differ.
DEFAULTS = {
    "vocab_size": 30000,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "intermediate_size": 16384,
    "hidden_act": "gelu_new",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "embedding_size": 128,
}
PROJECT = "encoder.embedding_hidden_mapping_in"
# Each group's one block (a shared stack's all read group 0): its q, k and v, and ALBERT's names
# within it -> tfcompile's (post-norm: attn_norm follows attention)
BODY = Body(
    "encoder.albert_layer_groups.{}.albert_layers.0",
    ("attention.query", "attention.key", "attention.value"),
    (
        ("attention.dense", "attn.out"),
        ("attention.LayerNorm", "attn_norm"),
        ("ffn", "ffn.w_in"),
        ("ffn_output", "ffn.w_out"),
        ("full_layer_layer_norm", "ffn_norm"),
    ),
)
# BERT's masked-LM head under ALBERT's names
ALBERT_MLM = tuple((hf.replace("cls.predictions.transform.", "predictions."), tfc) for hf, tfc in MLM_HEAD)


@register("albert")
class Albert(Bert):
    prefixes = ("albert.",)
    decoder: ClassVar[str] = "predictions.decoder.weight"
    mlm_head: ClassVar[tuple[tuple[str, str], ...]] = ALBERT_MLM
    mlm_bias: ClassVar[MLMBias] = MLMBias("predictions.bias", "predictions.decoder.bias")
    # AlbertForMaskedLM builds no pooler, but keeps the one its checkpoint holds (albert-base-v2's), which
    # AlbertForSequenceClassification reads, as BERT does
    pooler_dense: ClassVar[str] = "pooler"
    sources: ClassVar[dict[str, str]] = Bert.sources | {"model.embedding_size": "embedding_size"}

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        why = " (AlbertForPreTraining's sentence-order head is no task of tfcompile's)"
        bert = as_bert(config, architecture, AS_BERT, "an ALBERT", why)
        config = config.filled(DEFAULTS)
        imported = super().read(config, bert, tensors)
        layers, groups = config.get("num_hidden_layers", 12), config.get("num_hidden_groups", 1)
        config.require(
            groups in (1, layers),
            "num_hidden_groups",
            f"{groups!r}: layers in groups of shared weights, of which tfcompile has one (1) or one per "
            f"layer ({layers!r})",
            "import a model of one group",
        )
        inner = config.get("inner_group_num", 1)
        config.require(
            inner == 1, "inner_group_num", f"{inner!r}: layers of several blocks", "import a model of 1"
        )
        width, d = config.get("embedding_size", 128), imported.model["d_model"]
        config.require(
            width != d,
            "embedding_size",
            f"is hidden_size ({d!r}): ALBERT keeps its projection between equal widths, tfcompile's "
            "embeddings are projected only to another width",
            "import a model of narrower embeddings",
        )
        model = imported.model | {"embedding_size": width, "share_layers": groups == 1}
        return Imported(model, imported.task)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = body_state(tensors, model, BODY)
        for kind in ("weight", "bias"):
            state[f"embed_project.{kind}"] = tensors.take(f"{PROJECT}.{kind}")
        if model.pooler:
            state |= {f"pooler.{kind}": tensors.take(f"pooler.{kind}") for kind in ("weight", "bias")}
        if isinstance(spec.task, MaskedLMTask):
            state |= self.mlm_state(tensors, model, state["embed.weight"])
        else:
            state |= {f"classifier.{kind}": tensors.take(f"classifier.{kind}") for kind in ("weight", "bias")}
        return state

    def candidate(self, spec: Spec) -> bool:
        """An encoder of shared layers (BERT, ELECTRA and ModernBERT write the others)."""
        model = spec.model
        return (
            isinstance(model, EncoderSpec)
            and isinstance(spec.task, MaskedLMTask | ClassificationTask)
            and model.share_layers
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec)
        need = Needs("ALBERT")
        body_needs(need, model.model_copy(update={"share_layers": False}))  # written here
        need(
            model.projects_embeddings,
            "model.embedding_size",
            model.embedding_size,
            f"narrower or wider than d_model ({model.d_model}): ALBERT projects its embeddings",
        )
        pooler = model.pooler_activation
        need(
            not model.pooler or pooler == "tanh", "model.pooler_activation", pooler, "tanh (ALBERT's pooler)"
        )
        masked = isinstance(task, MaskedLMTask)
        need(not (masked and task.next_sentence), "task.next_sentence", True, "false (its head is not NSP)")
        return [p for p in need.problems if p.field != "model.bias.lm_head"]  # its head has a bias

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        bert = super().to_config(spec)  # the body's fields are BERT's; ALBERT's heads, width and groups
        written = bert | {
            "architectures": [head_class(spec).replace("Bert", "Albert")],
            "model_type": "albert",
            "embedding_size": model.embedding_width,
            "num_hidden_groups": 1,
            "inner_group_num": 1,
        }
        return {k: v for k, v in written.items() if k != "position_embedding_type"}  # not AlbertConfig's

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        out = body_tensors(state, model, "albert.", BODY)  # a shared stack: group 0's block
        for kind in ("weight", "bias"):
            out[f"albert.{PROJECT}.{kind}"] = state[f"embed_project.{kind}"]
        if head_class(spec) != "BertForMaskedLM":
            out |= {
                "albert.pooler.weight": state["pooler.weight"],
                "albert.pooler.bias": state["pooler.bias"],
            }
        if isinstance(spec.task, MaskedLMTask):
            out |= {hf: state[tfc] for hf, tfc in ALBERT_MLM}
            bias = zeros_if_none(state.get("lm_head.bias"), state["lm_head.weight"].shape[0])
            out["predictions.bias"] = bias
            if not model.tie_embeddings:
                out["predictions.decoder.weight"] = state["lm_head.weight"]
                out["predictions.decoder.bias"] = bias.clone()
        else:
            out |= {
                "classifier.weight": state["classifier.weight"],
                "classifier.bias": state["classifier.bias"],
            }
        return contiguous(out)
