"""ELECTRA (``ElectraForSequenceClassification``; ``ElectraForMaskedLM``, the generator): BERT's
body, with factorized embeddings where ``embedding_size`` differs from ``hidden_size`` (the token,
position and segment tables and their norm that wide, ``embeddings_project`` to the blocks' width:
the spec's ``embedding_size``), and heads of their own: the classifier is a dense layer and GELU on
the first token (``pooler_activation: gelu``), then ``out_proj``; the generator's head maps back to
the embeddings' width, GELU, a norm, and the tied output projection. Both heads apply the erf GELU
whatever ``hidden_act`` says, so a masked LM of another activation is refused (the spec's masked-LM
head applies the body's). ``ElectraForPreTraining``, the discriminator the published checkpoints
are saved as, is refused: its replaced-token head is no task of tfcompile's (fine-tuned
classifiers import).

export-hf writes an encoder BERT cannot hold (factorized embeddings, or a classifier of a GELU
pooler) as ELECTRA, with BERT's requirements on the body; the summary heads' fields are left to
ElectraConfig's defaults (multiple choice alone reads them)."""

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
from tfcompile.hf.bert import Bert, MLMBias, as_bert, body_needs, body_state, body_tensors, erf_gelu_head
from tfcompile.hf.errors import Problem
from tfcompile.hf.roberta import CLASSIFIER
from tfcompile.spec import Spec
from tfcompile.spec.schema import ClassificationTask, EncoderSpec, MaskedLMTask, RopePositional

# The head classes -> BERT's with the same task section (read by Bert.read).
AS_BERT = {
    "ElectraForMaskedLM": "BertForMaskedLM",
    "ElectraForSequenceClassification": "BertForSequenceClassification",
}
# ElectraConfig's defaults where BertConfig's (which Bert.read falls back on) differ.
DEFAULTS = {"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024, "embedding_size": 128}
PROJECT = (
    ("embeddings_project.weight", "embed_project.weight"),
    ("embeddings_project.bias", "embed_project.bias"),
)
MLM_HEAD = (
    ("generator_predictions.dense.weight", "mlm_dense.weight"),
    ("generator_predictions.dense.bias", "mlm_dense.bias"),
    ("generator_predictions.LayerNorm.weight", "mlm_norm.weight"),
    ("generator_predictions.LayerNorm.bias", "mlm_norm.bias"),
)
DECODER = "generator_lm_head.weight"


@register("electra")
class Electra(Bert):
    prefixes = ("electra.",)
    decoder: ClassVar[str] = DECODER
    mlm_head: ClassVar[tuple[tuple[str, str], ...]] = MLM_HEAD
    mlm_bias: ClassVar[MLMBias] = MLMBias("generator_lm_head.bias", "generator_lm_head.bias")  # one name
    keeps_pooler: ClassVar[bool] = False  # ElectraModel has no pooler; the classifier's dense is its own
    sources: ClassVar[dict[str, str]] = Bert.sources | {"model.embedding_size": "embedding_size"}

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        why = (
            " (ElectraForPreTraining's replaced-token head is no task of tfcompile's; a classifier "
            "fine-tuned from it imports)"
        )
        bert = as_bert(config, architecture, AS_BERT, "an ELECTRA", why)
        config = config.filled(DEFAULTS)
        imported = super().read(config, bert, tensors)
        mlm = bert == "BertForMaskedLM"
        erf_gelu_head(config, mlm, "ELECTRA's generator head")
        width = config.get("embedding_size", 128)
        model = imported.model | ({"embedding_size": width} if width != imported.model["d_model"] else {})
        if not mlm:
            model["pooler_activation"] = "gelu"  # ElectraClassificationHead's dense -> GELU
        return Imported(model, imported.task)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = body_state(tensors, model)
        if model.projects_embeddings:
            state |= {tfc: tensors.take(hf) for hf, tfc in PROJECT}
        if isinstance(spec.task, MaskedLMTask):
            state |= self.mlm_state(tensors, model, state["embed.weight"])
        else:
            state |= {tfc: tensors.take(hf) for hf, tfc in CLASSIFIER}
        return state

    def candidate(self, spec: Spec) -> bool:
        """An encoder BERT cannot write: factorized embeddings, or a classifier's GELU pooler (but
        for ALBERT's shared layers and ModernBERT's RoPE)."""
        model = spec.model
        return (
            isinstance(model, EncoderSpec)
            and isinstance(spec.task, MaskedLMTask | ClassificationTask)
            and (model.projects_embeddings or model.pooler_activation == "gelu")
            and not model.share_layers
            and not isinstance(model.positional, RopePositional)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model, task = spec.model, spec.task
        assert isinstance(model, EncoderSpec)
        need = Needs("ELECTRA")
        body_needs(need, model)
        if isinstance(task, MaskedLMTask):
            need(
                model.activation == "gelu",
                "model.activation",
                model.activation,
                "gelu (the generator head's)",
            )
            need(not task.next_sentence, "task.next_sentence", True, "false (ELECTRA has no such head)")
        else:
            need(
                model.pooler_activation == "gelu", "model.pooler_activation", model.pooler_activation, "gelu"
            )
        return [p for p in need.problems if p.field != "model.bias.lm_head"]  # its head has a bias

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        bert = super().to_config(spec)  # the body's fields are BERT's; ELECTRA's heads and width
        head = (
            "ElectraForMaskedLM"
            if isinstance(spec.task, MaskedLMTask)
            else "ElectraForSequenceClassification"
        )
        written = bert | {
            "architectures": [head],
            "model_type": "electra",
            "embedding_size": model.embedding_width,
        }
        return {k: v for k, v in written.items() if k != "position_embedding_type"}  # not ElectraConfig's

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        out = body_tensors(state, model, "electra.")
        if model.projects_embeddings:
            out |= {f"electra.{hf}": state[tfc] for hf, tfc in PROJECT}
        if isinstance(spec.task, MaskedLMTask):
            out |= {hf: state[tfc] for hf, tfc in MLM_HEAD}
            if not model.tie_embeddings:
                out[DECODER] = state["lm_head.weight"]
            out["generator_lm_head.bias"] = zeros_if_none(
                state.get("lm_head.bias"), state["lm_head.weight"].shape[0]
            )
        else:
            out |= {hf: state[tfc] for hf, tfc in CLASSIFIER}
        return contiguous(out)
