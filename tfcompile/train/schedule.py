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
