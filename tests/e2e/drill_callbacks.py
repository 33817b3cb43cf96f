"""Callbacks the end-to-end drills add to a real run (``+callbacks.<name>._target_=...``)."""

from __future__ import annotations

import os
import shutil

import lightning as L

from vramkit.tasks.text_detection.submission_writer import IcdarSubmissionWriter


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


class SignalingSubmissionWriter(IcdarSubmissionWriter):
    """eval.py's prediction writer that sends signal ``signum`` to its own process at the end of
    batch ``batch`` of ``phase`` ("validate" or "predict"), as a scheduler would mid-evaluation
    (``prediction_writer._target_=drill_callbacks.SignalingSubmissionWriter``)."""

    def __init__(
        self, output_dir: str, signum: int, phase: str, batch: int, **writer: object
    ) -> None:
        super().__init__(output_dir, **writer)
        self.signum, self.phase, self.batch = signum, phase, batch

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        module: object,
        outputs: object,
        batch: object,
        batch_idx: int,
        *rest: int,
    ) -> None:
        if self.phase == "validate" and batch_idx == self.batch:
            os.kill(os.getpid(), self.signum)

    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        module: object,
        outputs: object,
        batch: object,
        batch_idx: int,
        *rest: int,
    ) -> None:
        super().on_predict_batch_end(trainer, module, outputs, batch, batch_idx, *rest)
        if self.phase == "predict" and batch_idx == self.batch:
            os.kill(os.getpid(), self.signum)
