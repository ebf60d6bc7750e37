"""Learning-rate schedules: the learning rate at each optimizer step (1-based)."""

from __future__ import annotations

import math

from tfcompile.spec.schema import ConstantSchedule, CosineSchedule, OptimizerSpec, VaswaniSchedule

Schedule = ConstantSchedule | CosineSchedule | VaswaniSchedule


def learning_rate(
    step: int, schedule: Schedule, optimizer: OptimizerSpec, total_steps: int, d_model: int
) -> float:
    if isinstance(schedule, VaswaniSchedule):
        # Vaswani et al. 2017, eq. 3 (notes: cmu-11711-transformers.txt).
        return schedule.scale * d_model**-0.5 * min(step**-0.5, step * schedule.warmup_steps**-1.5)
    peak = optimizer.lr
    if step <= schedule.warmup_steps:
        return peak * step / schedule.warmup_steps
    if isinstance(schedule, ConstantSchedule):
        return peak
    progress = (step - schedule.warmup_steps) / max(total_steps - schedule.warmup_steps, 1)
    floor = peak * schedule.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def peak(schedule: Schedule, optimizer: OptimizerSpec, d_model: int) -> tuple[float, str]:
    """The highest learning rate the schedule reaches, and the spec field that sets it: Vaswani's
    at the end of its warmup, scale * (d_model * warmup_steps)^-0.5; the others' optimizer.lr."""
    if isinstance(schedule, VaswaniSchedule):
        return schedule.scale * (d_model * schedule.warmup_steps) ** -0.5, "train.schedule.scale"
    return optimizer.lr, "train.optimizer.lr"
