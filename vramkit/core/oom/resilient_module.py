"""A LightningModule base class whose training and validation steps survive CUDA OOM errors.

A module inherits :class:`OOMResilientModule` instead of ``L.LightningModule`` and writes its
``training_step`` and ``validation_step`` as usual; the class wraps them when the subclass is
defined. Each step then runs as micro-batches cut along the batch's first dimension (tensors
sliced, per-sample lists sliced, everything else shared), and an out-of-memory error is
answered without losing the batch:

- training: the unfinished samples are redone in micro-batches half the size, their gradients
  accumulated, each micro-batch's loss weighted by its share of what the loss averages over
  (samples unless :meth:`OOMResilientModule.micro_batch_weight` says otherwise: answer cells,
  tokens). For a loss that is such a mean and a model without batch-coupled layers (BatchNorm),
  the gradients are those of the whole batch up to floating-point order. The micro-batch is
  kept for the rest of the run. A second OOM in the same step takes the last
  resort: a checkpoint is saved and the optimizer state reloaded from it into emptied memory,
  then the micro-batch halves again (twice the accumulation).
- validation: the batch is run in halves (the same metrics) and every later validation batch
  is cut into micro-batches of the size that fitted. The dataloader keeps its batch size, so
  the run's configuration and sample order do not change.

A step that runs whole costs nothing beyond the module's own work: no hook, no walk over the
parameters, no extra tensor operation, no collective (what can be decided once is decided at
the epoch's first step, see :mod:`vramkit.core.oom.guard_plan`). Under DDP each process
recovers alone (its micro-batches run no collective; the gradients are all-reduced once, after
the step), and a process that cannot fit one sample waits, without work, for the end of the
epoch, where all stop together (:mod:`vramkit.core.oom.give_up`). ``self.log`` calls of the
micro-batches are merged into the values the whole batch would log. A validation step must
change the module's state only after its device work (DBNet's appends its counts after
prediction), so a redone micro-batch counts once.

With gradient accumulation (``accumulate_grad_batches`` > 1), or once a step has been split,
gradient-arrival hooks watch the parameters (one Python call per parameter per backward
pass): an interrupted backward pass must not spoil gradients that earlier batches or
micro-batches accumulated.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import lightning as L

from vramkit.core.compat import lightning_private
from vramkit.core.data.batches import batch_size_of
from vramkit.core.oom.give_up import stop_together
from vramkit.core.oom.guard_plan import GuardPlan
from vramkit.core.oom.guarded_steps import (
    OUT_OF_MEMORY,
    TrainingStepRunner,
    ValidationStepRunner,
    idle_training_output,
    takes_whole_batch_first,
    train_whole_batch,
    without_loss_terms,
)
from vramkit.core.oom.recovery_state import LossWeight, OOMRecoveryState

log = logging.getLogger(__name__)

_GUARDED = "_oom_guarded"


def _guard_training_step(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def training_step(self: OOMResilientModule, batch: Any, batch_idx: int, *extra: Any) -> Any:
        state = self.oom_state
        if state.depth:
            # A subclass's step calling super(): the guard around the outer call runs it.
            return step(self, batch, batch_idx, *extra)
        plan = state.plan
        if plan is None or not plan.holds_for(self):
            # No trainer: a trace of the step (the planner), not a fit.
            if lightning_private.attached_trainer(self) is None:
                self._unguarded("no Trainer is attached")
                return without_loss_terms(step(self, batch, batch_idx, *extra))
            plan = self._plan_epoch()
        if plan.unguarded_reason is not None:
            self._unguarded(plan.unguarded_reason)
            return without_loss_terms(step(self, batch, batch_idx, *extra))
        if state.gave_up is not None:
            return idle_training_output(self, plan, batch_idx)
        samples = batch_size_of(batch)
        if samples is None:
            return without_loss_terms(step(self, batch, batch_idx, *extra))
        state.depth += 1
        try:
            whole_batch_failed = False
            if takes_whole_batch_first(self, batch_idx):
                output = train_whole_batch(self, plan, step, batch, samples, batch_idx, extra)
                if output is not OUT_OF_MEMORY:
                    return output
                whole_batch_failed = True
            runner = TrainingStepRunner(self, plan, step, batch, samples, batch_idx, extra)
            return runner.run(whole_batch_failed)
        finally:
            state.depth -= 1

    setattr(training_step, _GUARDED, True)
    return training_step


def _guard_validation_step(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def validation_step(self: OOMResilientModule, batch: Any, batch_idx: int, *extra: Any) -> Any:
        state = self.oom_state
        if state.gave_up is not None:
            return None  # this process waits for the others to stop with it
        samples = batch_size_of(batch)
        if state.depth or samples is None or lightning_private.attached_trainer(self) is None:
            return step(self, batch, batch_idx, *extra)
        state.depth += 1
        try:
            return ValidationStepRunner(self, step, batch, samples, batch_idx, extra).run()
        finally:
            state.depth -= 1

    setattr(validation_step, _GUARDED, True)
    return validation_step


def _guard_backward(backward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(backward)
    def guarded_backward(self: OOMResilientModule, loss: Any, *args: Any, **kwargs: Any) -> None:
        state = self.oom_state
        if state.backward_done:
            # The guarded step accumulated the gradients already. Lightning's loss carries only
            # its value, or under DDP a zero-valued touch of every parameter that starts the
            # gradient all-reduce.
            state.backward_done = False
            if loss.requires_grad:
                loss.backward()
            return
        backward(self, loss, *args, **kwargs)

    setattr(guarded_backward, _GUARDED, True)
    return guarded_backward


def _guard_zero_grad(zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(zero_grad)
    def optimizer_zero_grad(
        self: OOMResilientModule, epoch: int, batch_idx: int, optimizer: Any
    ) -> None:
        state = self.oom_state
        if state.skip_zero_grad:
            # Lightning zeroes after training_step; the guarded step did it before its backward.
            state.skip_zero_grad = False
            return
        zero_grad(self, epoch, batch_idx, optimizer)

    setattr(optimizer_zero_grad, _GUARDED, True)
    return optimizer_zero_grad


def _guard_epoch_end(hook: Callable[..., Any], *, ends_training_epoch: bool) -> Callable[..., Any]:
    """Before the module's own epoch-end hook: stop every process together if one gave up
    (one collective per epoch, which every process reaches); after a training epoch, also
    remove what the epoch's plan installed."""

    @functools.wraps(hook)
    def epoch_end(self: OOMResilientModule, *args: Any, **kwargs: Any) -> Any:
        state = self.oom_state
        if state.depth:  # a subclass's hook calling super(): done around the outer call
            return hook(self, *args, **kwargs)
        if ends_training_epoch and state.plan is not None:
            state.plan.release()
            state.plan = None
        stop_together(self)
        state.depth += 1
        try:
            return hook(self, *args, **kwargs)
        finally:
            state.depth -= 1

    setattr(epoch_end, _GUARDED, True)
    return epoch_end


def _guard_train_epoch_end(hook: Callable[..., Any]) -> Callable[..., Any]:
    return _guard_epoch_end(hook, ends_training_epoch=True)


def _guard_validation_epoch_end(hook: Callable[..., Any]) -> Callable[..., Any]:
    return _guard_epoch_end(hook, ends_training_epoch=False)


_GUARDS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "training_step": _guard_training_step,
    "validation_step": _guard_validation_step,
    "backward": _guard_backward,
    "optimizer_zero_grad": _guard_zero_grad,
    "on_train_epoch_end": _guard_train_epoch_end,
    "on_validation_epoch_end": _guard_validation_epoch_end,
}


class OOMResilientModule(L.LightningModule):
    """Base class of the project's LightningModules: OOM recovery for their steps.

    ``oom_state`` (an :class:`OOMRecoveryState`) holds the learned micro-batch sizes and the
    recovery counts, which the steps log as ``oom/train_recoveries``,
    ``oom/train_micro_batch``, ``oom/train_accumulation``, ``oom/last_resorts``,
    ``oom/val_recoveries`` and ``oom/val_micro_batch`` once an OOM has happened.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.oom_state = OOMRecoveryState()
        self._unguarded_reason_logged = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, guard in _GUARDS.items():
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, _GUARDED, False):
                setattr(cls, name, guard(method))

    def micro_batch_weight(self, batch: Any) -> LossWeight:
        """How much ``batch`` counts in the mean its training loss is: the number of units
        the loss averages over.

        A split training step weights each micro-batch's loss by its share of the whole
        batch's weight, so the accumulated gradients are those of the whole batch. The
        default, the number of samples, is right for a loss that is a mean over samples.
        Override it for a loss averaged over other units: return their count (tokens,
        answer cells), a number or a 0-d tensor (no host synchronisation). A loss that adds
        means over different units returns one count per term, by name, and its
        ``training_step`` returns a dict whose ``"loss_terms"`` maps the same names to the
        terms (their coefficients included; they add up to ``"loss"``). A unit the whole
        batch lacks gives its term no weight.
        """
        return float(batch_size_of(batch))

    def inject_oom_above(self, *, train: int | None = None, val: int | None = None) -> None:
        """Raise ``torch.cuda.OutOfMemoryError`` for every training (validation) micro-batch of
        more than ``train`` (``val``) samples; None turns that phase's fault off. For tests
        and rehearsals of the recovery on any machine."""
        limits = {"train": train, "val": val}
        for phase, limit in limits.items():
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
            ):
                raise ValueError(f"fault.oom_{phase}_above must be an integer >= 1, got {limit!r}")
        self.oom_state.fault_above.update(limits)

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``LightningModule.log``; inside a guarded step the call is held back until the
        step's micro-batches are done, then logged once for the whole batch."""
        buffer = self.oom_state.log_buffer
        if buffer is None:
            super().log(name, value, *args, **kwargs)
        else:
            buffer.record(name, value, args, kwargs)

    backward = _guard_backward(L.LightningModule.backward)
    optimizer_zero_grad = _guard_zero_grad(L.LightningModule.optimizer_zero_grad)
    on_train_epoch_end = _guard_train_epoch_end(L.LightningModule.on_train_epoch_end)
    on_validation_epoch_end = _guard_validation_epoch_end(L.LightningModule.on_validation_epoch_end)

    def _plan_epoch(self) -> GuardPlan:
        state = self.oom_state
        if state.plan is not None:
            state.plan.release()
        state.plan = GuardPlan.for_epoch(self)
        return state.plan

    def _unguarded(self, reason: str) -> None:
        if not self._unguarded_reason_logged:
            self._unguarded_reason_logged = True
            log.warning("Training steps run without OOM recovery: %s.", reason)


__all__ = ["OOMRecoveryState", "OOMResilientModule"]
