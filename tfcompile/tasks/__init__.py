"""Tasks: one module per task, each registering a ``Task`` class (see tfcompile.tasks.task).
Importing this package registers every built-in task."""

# The built-in tasks, registered on import.
from tfcompile.tasks import causal_lm, classification, image_classification, masked_lm, seq2seq
from tfcompile.tasks.task import TASKS, Batch, DataSize, ModelFn, Task, build_model, register_task, task_of

__all__ = [
    "TASKS",
    "Batch",
    "DataSize",
    "ModelFn",
    "Task",
    "build_model",
    "causal_lm",
    "classification",
    "image_classification",
    "masked_lm",
    "register_task",
    "seq2seq",
    "task_of",
]
