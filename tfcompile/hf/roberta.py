"""RoBERTa, XLM-RoBERTa, CamemBERT and data2vec-text (``*ForMaskedLM``,
``*ForSequenceClassification``; data2vec-text's body under ``data2vec_text.``): BERT's body
with positions counted from past the pad id, a masked-LM head that applies GELU whatever
``hidden_act`` says, and a classification head (tanh of a dense layer on <s>, then a projection)
that is BERT's pooler and classifier under other names.

transformers numbers the real tokens of a row padding_idx + 1, padding_idx + 2, ... (the cumsum
of ``input_ids != pad_token_id``); the spec's learned positions start at 0, so the table is read
from row padding_idx + 1 on and ``max_seq_len`` is max_position_embeddings - padding_idx - 1. The
rows before are read by padding alone, which nothing attends to. A real token that is the pad id
(the text "<pad>" itself) takes no position in transformers and the next one in tfcompile.

export-hf writes these runs as BERT's classes, which compute them exactly (positions from 0, the
MLM head's activation from ``hidden_act``): RoBERTa's offset table needs the tokenizer's pad id,
which a spec does not hold."""

from __future__ import annotations

import warnings
from typing import ClassVar

from tfcompile.hf.architecture import Config, Imported, State, Tensors, register
from tfcompile.hf.bert import Bert, MLMBias, as_bert, body_state, erf_gelu_head
from tfcompile.hf.errors import HFWarning
from tfcompile.spec import Spec
from tfcompile.spec.schema import EncoderSpec, MaskedLMTask

PREFIXES = {
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
    "data2vec-text": "Data2VecText",
}
# The head classes -> BERT's with the same task section (read by Bert.read).
AS_BERT = {"ForMaskedLM": "BertForMaskedLM", "ForSequenceClassification": "BertForSequenceClassification"}
MLM_HEAD = (
    ("lm_head.dense.weight", "mlm_dense.weight"),
    ("lm_head.dense.bias", "mlm_dense.bias"),
    ("lm_head.layer_norm.weight", "mlm_norm.weight"),
    ("lm_head.layer_norm.bias", "mlm_norm.bias"),
)
DECODER = "lm_head.decoder.weight"
SEGMENTS = "embeddings.token_type_embeddings.weight"
CLASSIFIER = (  # dense -> tanh on <s> is BERT's pooler; out_proj its classifier
    ("classifier.dense.weight", "pooler.weight"),
    ("classifier.dense.bias", "pooler.bias"),
    ("classifier.out_proj.weight", "classifier.weight"),
    ("classifier.out_proj.bias", "classifier.bias"),
)


@register("roberta", "xlm-roberta", "camembert", "data2vec-text")
class Roberta(Bert):
    prefixes = ("roberta.", "data2vec_text.")
    decoder: ClassVar[str] = DECODER
    mlm_head: ClassVar[tuple[tuple[str, str], ...]] = MLM_HEAD
    mlm_bias: ClassVar[MLMBias] = MLMBias("lm_head.bias", "lm_head.decoder.bias")
    # roberta-base's checkpoint holds a pooler that no RoBERTa head reads: the classifier's dense
    # layer is its own, which transformers' RobertaForSequenceClassification.from_pretrained starts
    # new, and so does a classifier fine-tuned from the import (the pooler is left out).
    keeps_pooler: ClassVar[bool] = False

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        model_type = config.data["model_type"]
        heads = {PREFIXES[model_type] + suffix: bert for suffix, bert in AS_BERT.items()}
        bert = as_bert(config, architecture, heads, f"a {model_type}")
        imported = super().read(config, bert, tensors)
        mlm = bert == "BertForMaskedLM"
        erf_gelu_head(config, mlm, "RoBERTa's masked-LM head")
        pad = config.data.get("pad_token_id", 1)  # left out: the config classes' 1; null: none
        positions = config.get("max_position_embeddings", 512)
        config.require(
            isinstance(pad, int) and 0 <= pad < positions - 2,
            "pad_token_id",
            f"{pad!r}: RoBERTa numbers positions from past the pad id, "
            f"which must be an id below max_position_embeddings ({positions}) - 2",
            "import a model whose config.json names its pad id",
        )
        segments = config.get("type_vocab_size", 2)
        # to_state copies a one-row table for a classifier whose config says one segment: rows of
        # another count than the config's are not the checkpoint's, which transformers fails on.
        table = tensors.tensors.get(SEGMENTS)
        config.require(
            table is None or len(table) == segments,
            "type_vocab_size",
            f"is {segments}, but {SEGMENTS} has {0 if table is None else len(table)} rows",
            "set it to the checkpoint's",
        )
        model = imported.model | {
            "max_seq_len": positions - (max(pad, 0) if isinstance(pad, int) else 0) - 1,  # else refused
            # The spec's classifier takes a pair's second sentence as segment 1 (one row is refused);
            # RoBERTa's tokenizers give every token segment 0, and a copy of its one row as the
            # second answers a pair as RoBERTa does whichever segment it is given.
            "type_vocab_size": 2 if segments == 1 and not mlm else segments,
        }
        valid = isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0
        return Imported(model, imported.task, pad_positions=pad if valid else None)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderSpec)
        state = body_state(tensors, model)
        # positions padding_idx + 1 on, as the spec's 0 on
        state["positional.table.weight"] = state["positional.table.weight"][-model.max_seq_len :]
        segments = state.get("segment_embed.weight")
        if segments is not None and len(segments) == 1:  # a classifier's second row: a copy (read)
            state["segment_embed.weight"] = segments.expand(model.type_vocab_size, -1)
        if isinstance(spec.task, MaskedLMTask):
            state |= self.mlm_state(tensors, model, state["embed.weight"])
        else:
            state |= {tfc: tensors.take(hf) for hf, tfc in CLASSIFIER}
        # roberta-base, a RobertaForMaskedLM, holds a pooler, unread by every RoBERTa head
        # (keeps_pooler), which transformers leaves unread too
        unread = tensors.skip("pooler.")
        if unread:
            warnings.warn(
                HFWarning(f"left out {', '.join(unread)}: a pooler no RoBERTa head reads"), stacklevel=2
            )
        return state

    def candidate(self, spec: Spec) -> bool:
        return False  # BERT writes every spec RoBERTa could, computing the same
