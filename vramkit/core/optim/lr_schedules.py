"""Learning-rate schedules shared by the LightningModules: warm-up (steps or a fraction of the
run), then poly, cosine or constant."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch.optim.lr_scheduler import LRScheduler

from vramkit.core.config.settings import Settings

DECAYS = ("poly", "cosine", "constant")
"""Shapes of the learning rate after the warm-up."""


def warmup_decay_factor(
    step: int, total_steps: int, warmup_steps: int, decay: str = "poly", poly_power: float = 0.9
) -> float:
    """The multiplier of the peak rate at optimizer ``step``: linear warm-up over
    ``warmup_steps``, then ``decay`` to zero at ``total_steps``: DBNet's poly ``(1 - t/T)^power``,
    cosine ``(1 + cos(pi t/T)) / 2``, or constant (the peak rate to the end)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return (1.0 - progress) ** poly_power


class WarmupDecayLR(LRScheduler):
    """Per-step warm-up and decay to zero at ``total_steps``, an end that may move.

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
        decay: str = "poly",
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.planned_steps = int(total_steps)  # the end configure_optimizers planned
        self.total_steps = int(total_steps)  # where the decay reaches zero now
        self.warmup_steps = int(warmup_steps)
        self.poly_power = float(poly_power)
        self.decay = decay
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        factor = warmup_decay_factor(
            self.last_epoch, self.total_steps, self.warmup_steps, self.decay, self.poly_power
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


class WarmupDecaySchedule(Settings):
    """The keys of ``model.lr_schedule``: linear warm-up to the peak rate, then a decay to zero at
    the end of training (per optimizer step)."""

    warmup_steps: int = Field(50, ge=0)
    """Optimizer steps of linear warm-up from 0."""
    warmup_fraction: float | None = Field(None, ge=0.0, lt=1.0)
    """Warm-up as a fraction of the run's optimizer steps (0.05: 5%); when set it replaces
    ``warmup_steps``."""
    decay: Literal["poly", "cosine", "constant"] = "poly"
    """The shape after the warm-up: poly (DBNet), cosine, or constant."""
    poly_power: float = Field(0.9, gt=0.0)
    """Exponent of the poly decay."""

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of ``total_steps`` optimizer steps."""
        if self.warmup_fraction is None:
            return self.warmup_steps
        return round(self.warmup_fraction * total_steps)

    def factor(self, step: int, total_steps: int) -> float:
        """The multiplier of the peak learning rate at optimizer ``step`` of ``total_steps``."""
        return warmup_decay_factor(
            step, total_steps, self.warmup_for(total_steps), self.decay, self.poly_power
        )

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int) -> WarmupDecayLR:
        """A per-step scheduler of ``optimizer`` over ``total_steps`` optimizer steps."""
        total_steps = max(1, total_steps)
        return WarmupDecayLR(
            optimizer,
            total_steps,
            warmup_steps=self.warmup_for(total_steps),
            poly_power=self.poly_power,
            decay=self.decay,
        )

    def lightning_config(
        self, optimizer: torch.optim.Optimizer, total_steps: int
    ) -> dict[str, Any]:
        """What ``configure_optimizers`` returns: ``optimizer`` stepped by this schedule."""
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.build(optimizer, total_steps), "interval": "step"},
        }
