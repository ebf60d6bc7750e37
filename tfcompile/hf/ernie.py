"""ERNIE (``ErnieForMaskedLM``, ``ErnieForPreTraining``, ``ErnieForSequenceClassification``):
BERT's body and heads under ``ernie.``, with one embedding more where ``use_task_id`` (ERNIE 3.0's):
a task-type table whose row ``task_type_ids`` picks is added to every token's embeddings. A
request names no task type, which transformers then takes as 0 for every token: row 0 is one
vector added to every token, exactly what adding it to every row of the position table does, so
the import folds it in there (the table's other rows are left out) and the spec is BERT's.
A table saved where use_task_id is false, which transformers leaves unread, is refused.
export-hf writes these runs as BERT's classes, which compute them exactly."""

from __future__ import annotations

from tfcompile.hf.architecture import Config, Imported, State, Tensors, register
from tfcompile.hf.bert import Bert, as_bert
from tfcompile.spec import Spec

HEADS = {
    "ErnieForMaskedLM": "BertForMaskedLM",
    "ErnieForPreTraining": "BertForPreTraining",
    "ErnieForSequenceClassification": "BertForSequenceClassification",
}
TASK_TYPES = "embeddings.task_type_embeddings.weight"


@register("ernie")
class Ernie(Bert):
    prefixes = ("ernie.",)

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        bert = as_bert(config, architecture, HEADS, "an ERNIE")
        imported = super().read(config, bert, tensors)
        task_types, used = config.get("task_type_vocab_size", 3), config.get("use_task_id", False)
        config.require(
            bool(used) or TASK_TYPES not in tensors,
            "use_task_id",
            f"is false, and the checkpoint holds {TASK_TYPES}, which transformers then leaves unread",
            "set it to the checkpoint's (true); is config.json the checkpoint's own?",
        )
        config.require(
            not used or (isinstance(task_types, int) and task_types > 0),
            "task_type_vocab_size",
            f"is {task_types!r}: use_task_id adds a row of a task-type table, which has none",
            "a count of task types, at least 1",
        )
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = super().to_state(tensors, spec)
        if TASK_TYPES in tensors:  # use_task_id (read refuses the table else)
            task = tensors.take(TASK_TYPES)[0]  # task type 0's row, added to every token
            state["positional.table.weight"] = state["positional.table.weight"] + task
        return state

    def candidate(self, spec: Spec) -> bool:
        return False  # BERT writes every spec ERNIE could, computing the same
