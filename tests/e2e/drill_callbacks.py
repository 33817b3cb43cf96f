"""Callbacks the end-to-end drills add to a real run (``+callbacks.<name>._target_=...``)."""

from __future__ import annotations

import os
import shutil

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


class SignalAtStep(L.Callback):
    """Sends signal ``signum`` to its own process at the end of the batch that makes step
    ``step``, and only there: a requeued run resumed past that step never sends it again, as a
    cluster preempts a job once."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class FillDisk(L.Callback):
    """Makes the disk report no free space once training reaches step ``step`` (every
    ``shutil.disk_usage`` answers 0 free from then on, until the run ends), as when
    another process fills the disk during a run."""

    def __init__(self, step: int) -> None:
        self.step = step
        self._real_disk_usage = shutil.disk_usage

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step and shutil.disk_usage is self._real_disk_usage:
            real = self._real_disk_usage

            def full(path: object) -> object:
                usage = real(path)
                return type(usage)(usage.total, usage.total, 0)

            shutil.disk_usage = full

    def teardown(self, trainer: L.Trainer, *args: object) -> None:
        shutil.disk_usage = self._real_disk_usage

    def on_exception(self, trainer: L.Trainer, *args: object) -> None:
        # A run ended by an exception gets no teardown hook; the disk must not stay "full".
        shutil.disk_usage = self._real_disk_usage
