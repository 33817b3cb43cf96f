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
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger(__name__)

PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


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
    """Take the callbacks with nothing to do out of ``trainer.callbacks`` and switch off the
    per-batch hooks of the others that have nothing to do (:func:`skip_idle_batch_hooks`).
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
    trainer.callbacks = kept
    return dropped


def idle_batch_hooks(callback: L.Callback) -> list[str]:
    """The per-batch hooks of ``callback`` that never do anything: those its class inherits
    from ``Callback`` (empty methods), and a ``ModelCheckpoint``'s ``on_train_batch_end``
    without ``every_n_train_steps`` or ``train_time_interval`` (it returns at once then:
    lightning/pytorch/callbacks/model_checkpoint.py, ``on_train_batch_end``)."""
    hooks = [
        hook
        for hook in PER_BATCH_HOOKS
        if getattr(type(callback), hook) is getattr(L.Callback, hook)
    ]
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
