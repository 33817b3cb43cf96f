"""Learning-rate schedules shared by the LightningModules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler


def warmup_poly_factor(step: int, total_steps: int, warmup_steps: int, poly_power: float) -> float:
    """The multiplier of the peak rate at optimizer ``step``: linear warm-up over
    ``warmup_steps``, then DBNet's poly decay ``(1 - t/T)^poly_power``, zero from
    ``total_steps`` on."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return (1.0 - progress) ** poly_power


class WarmupPolyLR(LRScheduler):
    """Per-step warm-up and poly decay to zero at ``total_steps``, an end that may move.

    :meth:`end_at` moves the end between the warm-up and the planned ``total_steps`` (e.g. to
    where ``trainer.max_time`` will stop the run, see
    :class:`vramkit.core.callbacks.max_time_annealing.MaxTimeAnnealing`), so the model the run ends
    with is annealed. The end is part of the state, so a resumed run keeps it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        warmup_steps: int = 50,
        poly_power: float = 0.9,
        last_epoch: int = -1,
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.planned_steps = int(total_steps)  # the end configure_optimizers planned
        self.total_steps = int(total_steps)  # where the decay reaches zero now
        self.warmup_steps = int(warmup_steps)
        self.poly_power = float(poly_power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        factor = warmup_poly_factor(
            self.last_epoch, self.total_steps, self.warmup_steps, self.poly_power
        )
        return [base_lr * factor for base_lr in self.base_lrs]

    def end_at(self, total_steps: int) -> bool:
        """Make the decay reach zero at ``total_steps``, kept after the warm-up and the next
        step and never beyond the planned end; True when the end moved. Takes effect from the
        next step on."""
        earliest = max(self.last_epoch + 1, self.warmup_steps + 1)
        total_steps = min(max(int(total_steps), earliest), self.planned_steps)
        if total_steps == self.total_steps:
            return False
        self.total_steps = total_steps
        return True


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
        return warmup_poly_factor(step, total_steps, self.warmup_steps, self.poly_power)

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int) -> WarmupPolyLR:
        """A per-step scheduler of ``optimizer`` over ``total_steps`` optimizer steps."""
        return WarmupPolyLR(
            optimizer,
            max(1, total_steps),
            warmup_steps=self.warmup_steps,
            poly_power=self.poly_power,
        )

    def lightning_config(
        self, optimizer: torch.optim.Optimizer, total_steps: int
    ) -> dict[str, Any]:
        """What ``configure_optimizers`` returns: ``optimizer`` stepped by this schedule."""
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.build(optimizer, total_steps), "interval": "step"},
        }
