"""Callbacks the end-to-end drills add to a real run (``+callbacks.<name>._target_=...``)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch

from vramkit.tasks.text_detection.evaluation.submission_writer import IcdarSubmissionWriter


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


class DivergeAboveRate(L.Callback):
    """Fills every weight with NaN before each batch from optimizer step ``step`` on while the
    schedule's peak learning rate is above ``rate``: a run that diverges at its learning rate and
    trains on at a smaller one."""

    def __init__(self, rate: float, step: int) -> None:
        self.rate, self.step = rate, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        peak = trainer.lr_scheduler_configs[0].scheduler.base_lrs[0]
        if trainer.global_step >= self.step and peak > self.rate:
            with torch.no_grad():
                for parameter in pl_module.parameters():
                    parameter.fill_(math.nan)


class SamplesPerStep(L.Callback):
    """Appends one JSON line per optimizer step to ``path``: the step and a checksum of each
    sample trained in it (the sum of its first tensor, sorted), so two runs' steps compare."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._pending: list[float] = []
        self._started_at = 0  # global_step when the pending samples' step began

    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        if not self._pending:
            self._started_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, *_):
        self._pending += _first_tensor(batch).flatten(1).double().sum(1).tolist()
        if trainer.global_step != self._started_at:  # this batch ended an optimizer step
            record = {"step": trainer.global_step, "samples": sorted(self._pending)}
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            self._pending = []


def _first_tensor(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    values = [batch[key] for key in sorted(batch)] if isinstance(batch, dict) else list(batch)
    return next(_first_tensor(v) for v in values if isinstance(v, torch.Tensor | dict | list))
