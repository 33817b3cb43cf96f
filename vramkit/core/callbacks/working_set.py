"""Register only the callbacks that have work in a run, and let Lightning call per batch only
the hooks they implement.

Lightning calls every hook of every registered callback on every batch: ``getattr``, the
callback's ``state_key`` (ModelCheckpoint builds it from five settings each time), a profiler
context, then the call, even for ``Callback``'s empty methods. That is several microseconds
per callback and hook, six training hooks per step, whatever the callback does. It skips an
attribute that is not callable (``_call_callback_hooks`` in
lightning/pytorch/trainer/call.py: ``fn = getattr(callback, hook_name); if callable(fn):``).
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from vramkit.core.callbacks.batch_hooks import (
    PER_BATCH_HOOKS,
    implemented_batch_hooks,
    implements,
)
from vramkit.core.callbacks.phase_boundary_callbacks import PhaseBoundaryCallbacks

log = logging.getLogger(__name__)


@runtime_checkable
class MayHaveNothingToDo(Protocol):
    """A callback that can tell, once the Trainer and the data exist, that a run gives it
    nothing to do."""

    def nothing_to_do(
        self, trainer: L.Trainer, datamodule: L.LightningDataModule | None
    ) -> str | None:
        """Why this callback has nothing to do when ``trainer`` fits on ``datamodule`` (None:
        loaders given directly); None when it has something to do."""


def keep_working_callbacks(
    trainer: L.Trainer, datamodule: L.LightningDataModule | None = None
) -> list[str]:
    """Take the callbacks with nothing to do out of ``trainer.callbacks``, switch off the
    per-batch hooks of the others that have nothing to do (:func:`skip_idle_batch_hooks`) and
    register vramkit's callbacks without per-batch hooks as one (:func:`group_phase_boundary`).
    Call it after the Trainer is built and before it runs on ``datamodule``; returns the names
    of the callbacks taken out."""
    kept: list[L.Callback] = []
    dropped: list[str] = []
    for callback in trainer.callbacks:
        reason = (
            callback.nothing_to_do(trainer, datamodule)
            if isinstance(callback, MayHaveNothingToDo)
            else None
        )
        if reason is not None:
            dropped.append(type(callback).__name__)
            log.debug("%s not registered: %s", type(callback).__name__, reason)
            continue
        skip_idle_batch_hooks(callback)
        kept.append(callback)
    trainer.callbacks = group_phase_boundary(kept)
    return dropped


def group_phase_boundary(callbacks: list[L.Callback]) -> list[L.Callback]:
    """``callbacks`` with vramkit's own callbacks that implement no per-batch hook replaced by
    one :class:`PhaseBoundaryCallbacks` where the last of them stood (the others keep their
    order around it). Lightning's callbacks and a user's own stay registered as they are:
    Lightning and user code find them in ``trainer.callbacks`` by type; so do checkpoint
    callbacks, which Lightning calls in a pass of their own."""
    members = [
        callback
        for callback in callbacks
        if type(callback).__module__.startswith("vramkit.")
        and not isinstance(callback, Checkpoint | PhaseBoundaryCallbacks)
        and not implemented_batch_hooks(callback)
    ]
    if len(members) < 2:
        return callbacks
    last = max(callbacks.index(member) for member in members)
    grouped = [callback for callback in callbacks[:last] if callback not in members]
    return [*grouped, PhaseBoundaryCallbacks(members), *callbacks[last + 1 :]]


def idle_batch_hooks(callback: L.Callback) -> list[str]:
    """The per-batch hooks of ``callback`` that never do anything: those its class inherits
    from ``Callback`` (empty methods), and a ``ModelCheckpoint``'s ``on_train_batch_end``
    without ``every_n_train_steps`` or ``train_time_interval`` (it returns at once then:
    lightning/pytorch/callbacks/model_checkpoint.py, ``on_train_batch_end``)."""
    hooks = [hook for hook in PER_BATCH_HOOKS if not implements(callback, hook)]
    if (
        isinstance(callback, ModelCheckpoint)
        # A subclass with its own batch hook (ResumeCheckpoint's step checkpoints) keeps it.
        and type(callback).on_train_batch_end is ModelCheckpoint.on_train_batch_end
        and callback._every_n_train_steps < 1
        and callback._train_time_interval is None
    ):
        hooks.append("on_train_batch_end")
    return hooks


def skip_idle_batch_hooks(callback: L.Callback) -> list[str]:
    """Set each of ``callback``'s :func:`idle_batch_hooks` to None on the callback itself,
    which Lightning does not call. Returns them."""
    hooks = idle_batch_hooks(callback)
    for hook in hooks:
        setattr(callback, hook, None)
    return hooks
