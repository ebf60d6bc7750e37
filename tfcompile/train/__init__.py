"""Training: the loop, optimizers and schedules, atomic checkpoints, metrics."""

from tfcompile.train.checkpoint import CheckpointError
from tfcompile.train.loop import (
    Trainer,
    TrainError,
    TrainResult,
    load_run_spec,
    load_trained_model,
    read_metrics,
)

__all__ = [
    "CheckpointError",
    "TrainError",
    "TrainResult",
    "Trainer",
    "load_run_spec",
    "load_trained_model",
    "read_metrics",
]
