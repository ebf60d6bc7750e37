"""Training: the loop, optimizers and schedules, atomic checkpoints, metrics."""

from tfcompile.train.checkpoint import CheckpointError
from tfcompile.train.loop import Trainer, TrainResult
from tfcompile.train.runs import TrainError, init_from_run, load_run_spec, load_trained_model, read_metrics

__all__ = [
    "CheckpointError",
    "TrainError",
    "TrainResult",
    "Trainer",
    "init_from_run",
    "load_run_spec",
    "load_trained_model",
    "read_metrics",
]
