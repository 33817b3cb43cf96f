"""Learning-rate schedules shared by the LightningModules."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WarmupPolySchedule:
    """Linear warm-up to the peak rate, then DBNet's poly decay ``(1 - t/T)^power`` to zero."""

    warmup_steps: int = 50  # optimizer steps of linear warm-up
    poly_power: float = 0.9  # exponent of the decay

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"lr_schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.poly_power <= 0:
            raise ValueError(f"lr_schedule.poly_power must be > 0, got {self.poly_power}")

    def factor(self, step: int, total_steps: int) -> float:
        """The multiplier of the peak learning rate at optimizer ``step`` of ``total_steps``."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_steps = max(1, total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return (1.0 - progress) ** self.poly_power

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int):
        """A per-step ``LambdaLR`` for ``optimizer`` over ``total_steps`` optimizer steps."""
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: self.factor(step, total_steps)
        )
