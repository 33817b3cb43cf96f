"""The hooks Lightning calls on every batch, and whether a callback implements a hook."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L

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


def implements(callback: L.Callback, hook: str) -> bool:
    """Whether ``callback``'s class overrides ``Callback``'s empty ``hook``."""
    return getattr(type(callback), hook) is not getattr(L.Callback, hook)


REFRESH = "_batch_hooks_refresh"
"""Attribute of a callback whose per-batch hooks a ``CallbackGroup`` runs: the group's
``refresh_batch_hooks``, which :func:`switch_batch_hook` calls after a switch."""

TAKEN_OVER = "_batch_hooks_taken_over"
"""Attribute of a registered callback whose per-batch hooks a ``CallbackGroup`` runs: the
hooks it runs, bound (callback_group.py)."""


def taken_over_hooks(callback: L.Callback) -> SimpleNamespace:
    """Where a ``CallbackGroup`` keeps the per-batch hooks of ``callback`` that it runs."""
    taken = callback.__dict__.get(TAKEN_OVER)
    if taken is None:
        taken = callback.__dict__[TAKEN_OVER] = SimpleNamespace()
    return taken


def switch_batch_hook(callback: L.Callback, hook: str, on: bool) -> None:
    """Switch the per-batch ``hook`` that ``callback``'s class implements on or off, where it is
    called: by the ``CallbackGroup`` that runs it (which then decides anew which of its hooks
    are live), else by Lightning (which passes over a hook that is None on the callback:
    working_set.py). The one way to switch a hook of a callback that may be in a group."""
    taken = callback.__dict__.get(TAKEN_OVER)
    if taken is not None and hook in vars(taken):
        setattr(taken, hook, getattr(type(callback), hook).__get__(callback) if on else None)
    elif on:
        callback.__dict__.pop(hook, None)
    else:
        setattr(callback, hook, None)
    refresh = callback.__dict__.get(REFRESH)
    if refresh is not None:
        refresh()
