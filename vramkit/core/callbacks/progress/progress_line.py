"""One progress line at a steady interval where the output is a log, not a terminal.

Lightning's progress bars draw for a terminal: written to a file or a pipe (a CI log, a SLURM
log, ``make train | tee``) Rich shows nothing until the bar stops (console_output.py), so such a
log stayed silent for the whole fit. There this callback logs one line every ``interval_s``
seconds instead::

    step 120/960 (12%) · epoch 2/8 · train/loss 0.7341 · 14.2 samples/s · ETA 0:08:31

On a terminal or in a notebook the bar shows the same and this callback is not registered
(``nothing_to_do``), so it costs those runs nothing.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import timedelta
from numbers import Number
from typing import Any

import lightning as L
from pydantic import Field

from vramkit.core.callbacks.progress.console_output import console_is_live
from vramkit.core.config.settings import Settings

log = logging.getLogger(__name__)


class ProgressLineSettings(Settings):
    """The keys of ``callbacks.progress_line`` (conf/callbacks/progress_line.yaml)."""

    interval_s: float = Field(30.0, gt=0)
    """Seconds between two progress lines when the output is not a terminal."""
    on_terminal: bool = False
    """Also print the lines on a terminal (beside the progress bar)."""


def eta_seconds(elapsed_s: float, steps_done: int, steps_left: float) -> float | None:
    """Seconds left at the pace so far (`elapsed_s` for `steps_done` steps); None if unknown."""
    if steps_done <= 0 or not math.isfinite(steps_left):
        return None
    return max(0.0, elapsed_s / steps_done * steps_left)


def metric_text(value: Any) -> str | None:
    """A progress-bar metric as shown in the line (4 significant digits); None if not a number."""
    if hasattr(value, "item"):
        value = value.item()  # a tensor the logger kept: one host read per line
    if isinstance(value, bool) or not isinstance(value, Number):
        return None
    return f"{value:.4g}"


class ProgressLine(L.Callback):
    """Logs step/total, epoch, the progress-bar metrics, samples/s and the fit's ETA every
    ``interval_s`` seconds while training or validating, when the output is not live.

    The batch hooks compare one clock reading with the next due time and return; the metrics
    (which on a GPU wait for the device) are read only when a line is due. Samples/s counts
    the training batches since the last line times the loader's ``batch_size`` (batches/s
    where the loader has none). The ETA extrapolates the time per optimizer step since the fit
    started, validation included in proportion, to the steps left.

    Its keys are the fields of `ProgressLineSettings`, given as keyword arguments and kept
    validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = ProgressLineSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = ProgressLineSettings.for_component(type(self), settings)
        self._clock = time.monotonic
        self._started_at = 0.0
        self._first_step = 0
        self._next_at = math.inf
        self._last_at = 0.0
        self._batches_since = 0

    def nothing_to_do(
        self, trainer: L.Trainer, datamodule: L.LightningDataModule | None
    ) -> str | None:
        """Why no line is needed: a live console shows the progress bar (or no bar at all)."""
        if not trainer.is_global_zero:
            return "rank 0 prints the progress"
        if self.settings.on_terminal or not console_is_live():
            return None
        return "the output is a terminal: the progress bar shows the progress"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now = self._clock()
        self._started_at = self._last_at = now
        self._first_step = trainer.global_step  # a resumed fit counts its pace from here
        self._batches_since = 0
        self._next_at = now + self.settings.interval_s

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._next_at = math.inf  # no line from a validation after the fit (eval, test)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._batches_since += 1
        if self._clock() >= self._next_at:
            self._print(trainer, phase="train")

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._clock() >= self._next_at:
            self._print(trainer, phase=f"validating batch {batch_idx + 1}")

    def line(self, trainer: L.Trainer, phase: str) -> str:
        """The progress line for the fit's state now; `phase` is "train" or what validates."""
        now = self._clock()
        total = trainer.estimated_stepping_batches
        step = trainer.global_step
        parts = [f"step {step}/{total}" if math.isfinite(total) else f"step {step}"]
        if math.isfinite(total) and total > 0:
            parts[0] += f" ({100 * step / total:.0f}%)"
        epochs = trainer.max_epochs
        epoch = trainer.current_epoch + 1
        parts.append(f"epoch {epoch}/{epochs}" if epochs and epochs > 0 else f"epoch {epoch}")
        if phase != "train":
            parts.append(phase)
        for name, value in trainer.progress_bar_metrics.items():
            text = metric_text(value)
            if text is not None:
                parts.append(f"{name} {text}")
        interval = now - self._last_at
        if interval > 0 and self._batches_since:
            batch_size = getattr(trainer.train_dataloader, "batch_size", None)
            if batch_size:
                parts.append(f"{self._batches_since * batch_size / interval:.1f} samples/s")
            else:
                parts.append(f"{self._batches_since / interval:.2f} batches/s")
        eta = eta_seconds(now - self._started_at, step - self._first_step, total - step)
        if eta is not None:
            parts.append(f"ETA {timedelta(seconds=round(eta))}")
        return " · ".join(parts)

    def _print(self, trainer: L.Trainer, phase: str) -> None:
        log.info(self.line(trainer, phase))
        now = self._clock()
        self._last_at = now
        self._batches_since = 0
        self._next_at = now + self.settings.interval_s
