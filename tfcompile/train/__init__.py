"""Training: the loop, and its pieces: device set-up, batches, optimizers and schedules, atomic
checkpoints, metrics, progress, and the lock that gives a run folder one writer."""

from tfcompile.train.checkpoint import CheckpointError, RunWarning
from tfcompile.train.loop import Trainer, TrainResult
from tfcompile.train.metrics import read_metrics
from tfcompile.train.runs import TrainError, TrainingFailed, init_from_run, load_run_spec, load_trained_model

__all__ = [
    "CheckpointError",
    "RunWarning",
    "TrainError",
    "TrainResult",
    "Trainer",
    "TrainingFailed",
    "init_from_run",
    "load_run_spec",
    "load_trained_model",
    "read_metrics",
]
