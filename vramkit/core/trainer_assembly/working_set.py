"""Register only the callbacks that have work in a run, vramkit's own as one, and let Lightning
call per batch only the hooks they implement.

Lightning calls every hook of every registered callback on every batch: ``getattr``, the
callback's ``state_key`` (ModelCheckpoint builds it from five settings each time), a profiler
context, then the call, even for ``Callback``'s empty methods. That is several microseconds
per callback and hook, six training hooks per step, whatever the callback does. It skips an
attribute that is not callable (``_call_callback_hooks`` in
lightning/pytorch/trainer/call.py: ``fn = getattr(callback, hook_name); if callable(fn):``).
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    BatchSizeFinder,
    Checkpoint,
    EarlyStopping,
    LearningRateFinder,
    ModelCheckpoint,
    ProgressBar,
    Timer,
)

from vramkit.core.compat import lightning_private
from vramkit.core.trainer_assembly.batch_hooks import PER_BATCH_HOOKS, implements
from vramkit.core.trainer_assembly.callback_group import CallbackGroup
from vramkit.core.trainer_assembly.quiet_profiler import quiet_idle_profiler

log = logging.getLogger(__name__)

T = TypeVar("T", bound=L.Callback)


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
    per-batch hooks of the others that have nothing to do (:func:`skip_idle_batch_hooks`),
    register vramkit's own callbacks as one (:func:`group_vramkit_callbacks`) and give the Trainer
    a no-op profiler without a generator per hook call where it runs Lightning's default
    (:func:`~vramkit.core.trainer_assembly.quiet_profiler.quiet_idle_profiler`).
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
    trainer.callbacks = group_vramkit_callbacks(kept)
    quiet_idle_profiler(trainer)
    return dropped


# Lightning finds these by type in ``trainer.callbacks`` (the progress bar, the checkpoint and
# early-stopping callbacks it calls in a pass of their own, max_time's Timer, the tuners, the
# prediction writers): they stay registered as they are.
_FOUND_BY_TYPE = (
    Checkpoint,
    EarlyStopping,
    ProgressBar,
    Timer,
    BasePredictionWriter,
    BatchSizeFinder,
    LearningRateFinder,
)


def group_vramkit_callbacks(callbacks: list[L.Callback]) -> list[L.Callback]:
    """``callbacks`` with vramkit's own callbacks replaced by one :class:`CallbackGroup` where
    the last of them stood (the others keep their order around it). Callbacks of Lightning's
    kinds that Lightning looks up by type, and a user's own (found by type in their code),
    stay registered as they are."""
    members = [
        callback
        for callback in callbacks
        if type(callback).__module__.startswith("vramkit.")
        and not isinstance(callback, (*_FOUND_BY_TYPE, CallbackGroup))
    ]
    if len(members) < 2:
        return callbacks
    last = max(callbacks.index(member) for member in members)
    others = [callback for callback in callbacks[:last] if callback not in members]
    # vramkit's callbacks registered on their own: the group runs their per-batch hooks, in
    # Lightning's order (it moves the checkpoint callbacks last: _reorder_callbacks in
    # lightning/pytorch/trainer/connectors/callback_connector.py).
    own = [
        callback
        for callback in callbacks
        if type(callback).__module__.startswith("vramkit.")
        and callback not in members
        and not isinstance(callback, CallbackGroup)
    ]
    checkpoints = [c for c in own if isinstance(c, Checkpoint)]
    leading = [c for c in own if callbacks.index(c) < last and c not in checkpoints]
    trailing = [c for c in own if c not in leading and c not in checkpoints] + checkpoints
    group = CallbackGroup(members, leading=leading, trailing=trailing)
    return [*others, group, *callbacks[last + 1 :]]


def callbacks_of_type(trainer: L.Trainer, kind: type[T]) -> list[T]:
    """The callbacks of ``trainer`` that are ``kind``, registered alone or in a group."""
    found: list[T] = []
    for callback in trainer.callbacks:
        members = callback.members if isinstance(callback, CallbackGroup) else [callback]
        found.extend(member for member in members if isinstance(member, kind))
    return found


def idle_batch_hooks(callback: L.Callback) -> list[str]:
    """The per-batch hooks of ``callback`` that never do anything: those its class inherits
    from ``Callback`` (empty methods), and a ``ModelCheckpoint``'s ``on_train_batch_end``
    without ``every_n_train_steps`` or ``train_time_interval`` (it returns at once then:
    lightning/pytorch/callbacks/model_checkpoint.py, ``on_train_batch_end``)."""
    if isinstance(callback, CallbackGroup):
        return []  # it decides which of its hooks are live itself (refresh_batch_hooks)
    hooks = [hook for hook in PER_BATCH_HOOKS if not implements(callback, hook)]
    if (
        isinstance(callback, ModelCheckpoint)
        # A subclass with its own batch hook (ResumeCheckpoint's step checkpoints) keeps it.
        and type(callback).on_train_batch_end is ModelCheckpoint.on_train_batch_end
        and lightning_private.checkpoint_every_n_train_steps(callback) < 1
        and lightning_private.checkpoint_train_time_interval(callback) is None
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
