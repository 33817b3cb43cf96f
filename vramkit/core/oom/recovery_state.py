"""What a guarded module holds and shows to its step runners: the recovery state and a Protocol.

The step runners (:mod:`vramkit.core.oom.guarded_steps`) and the give-up
(:mod:`vramkit.core.oom.give_up`) read a module through :class:`GuardedModule`, not through
:class:`~vramkit.core.oom.resilient_module.OOMResilientModule`: the module imports them, so
they must not import it back (no import cycle, also none for annotations).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from vramkit.core.oom.log_buffer import HeldCalls, LogBuffer

if TYPE_CHECKING:
    import lightning as L

    from vramkit.core.oom.guard_plan import GuardPlan

# What OOMResilientModule.micro_batch_weight returns: one count (a number or a 0-d tensor), or
# one per loss term, by name.
LossWeight = float | torch.Tensor | Mapping[str, float | torch.Tensor]


@dataclass
class OOMRecoveryState:
    """What a module learned from its out-of-memory errors, kept for the rest of the run."""

    train_micro_batch: int | None = None  # samples per training micro-batch; None: whole batch
    val_micro_batch: int | None = None  # samples per validation micro-batch; None: whole batch
    train_recoveries: int = 0  # training OOMs survived
    val_recoveries: int = 0  # validation OOMs survived
    last_resorts: int = 0  # times the last resort (checkpoint and reload) was taken
    last_resort_checkpoint: str | None = None  # the checkpoint the last resort wrote
    fault_above: dict[str, int | None] = field(default_factory=lambda: {"train": None, "val": None})
    gave_up: str | None = None  # why this process stopped working (DDP: it waits for the others)
    # Hand-over to the Lightning hooks that run after training_step returns:
    skip_zero_grad: bool = False  # the step zeroed the gradients itself, before its backward
    backward_done: bool = False  # the step accumulated its gradients; Lightning's pass only syncs
    depth: int = 0  # > 0 inside a guarded step (a subclass calling super() is not guarded twice)
    log_buffer: LogBuffer | HeldCalls | None = None  # where self.log calls go while a step runs
    plan: GuardPlan | None = field(default=None, repr=False)  # this epoch's facts (guard_plan.py)


class GuardedModule(Protocol):
    """The part of a LightningModule that the step runners and the give-up use."""

    oom_state: OOMRecoveryState
    _trainer: L.Trainer | None  # None while the planner traces a step without a Trainer

    @property
    def trainer(self) -> L.Trainer: ...

    @property
    def device(self) -> torch.device: ...

    def micro_batch_weight(self, batch: Any) -> LossWeight: ...

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None: ...

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None: ...

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None: ...
