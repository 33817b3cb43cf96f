"""The hooks Lightning calls on every batch, and whether a callback implements a hook."""

from __future__ import annotations

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
