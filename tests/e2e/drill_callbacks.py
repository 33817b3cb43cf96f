"""Callbacks the end-to-end drills add to a real run (``+callbacks.<name>._target_=...``)."""

from __future__ import annotations

import os

import lightning as L


class SignalSelf(L.Callback):
    """Sends signal ``signum`` to its own process once training reaches step ``step``, as a
    scheduler or a user would, from outside the training loop's control."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step
        self.sent = False

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if not self.sent and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)
