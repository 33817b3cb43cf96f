"""A rich progress bar that also shows the run's ETA, the learning rate and memory in use."""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from pydantic import Field

from vramkit.core.callbacks.progress.console_output import console_is_live
from vramkit.core.compat import lightning_private
from vramkit.core.config.settings import Settings
from vramkit.core.hardware.memory_stats import read_host_memory
from vramkit.core.trainer_assembly.batch_hooks import switch_batch_hook
from vramkit.core.units import GIB, gib


def resident_set_gib() -> float | None:
    """This process's resident set size (GiB); None where the system does not report it."""
    reading = read_host_memory()
    return None if reading is None else gib(reading.current)


def memory_in_use(device: torch.device) -> str | None:
    """A short memory reading: CUDA allocated/reserved GiB on a GPU, else the process RSS.

    Reading the CUDA allocator's counters does not synchronise the device; one
    ``memory_stats`` call gives both (``memory_allocated`` and ``memory_reserved`` would each
    build the whole dictionary, torch/cuda/memory.py).
    """
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        allocated = stats.get("allocated_bytes.all.current", 0) / GIB
        reserved = stats.get("reserved_bytes.all.current", 0) / GIB
        return f"{allocated:.2f}/{reserved:.2f} GiB"
    rss = resident_set_gib()
    return None if rss is None else f"{rss:.2f} GiB rss"


def current_learning_rate(trainer: L.Trainer) -> float | None:
    """The first optimizer's first parameter group's learning rate; None before optimizers exist."""
    optimizers = trainer.optimizers
    if not optimizers or not optimizers[0].param_groups:
        return None
    return float(optimizers[0].param_groups[0]["lr"])


# The per-batch hooks that move the bar: a disabled bar switches them off. It keeps reading
# the rate each step used (on_before_optimizer_step): its get_metrics shows it.
_BATCH_HOOKS = ("on_train_batch_end", "on_validation_batch_end")


class RunProgressBarSettings(Settings):
    """The keys of ``callbacks.progress_bar`` (conf/callbacks/progress_bar.yaml)."""

    refresh_rate: int = Field(10, ge=0)
    """Redraws per second; 0 hides the bar."""
    leave: bool = False
    """Keep each finished epoch's bar on screen."""
    metrics_interval_s: float = Field(0.5, ge=0)
    """Seconds between two readings of the metrics, lr, memory and ETA (on a GPU each waits)."""


class RunProgressBar(RichProgressBar):
    """Lightning's rich progress bar plus ``eta`` (the whole fit), ``lr`` and ``mem``.

    ``lr`` is the rate the last optimizer step used (the first optimizer's first parameter
    group), the value LearningRateMonitor logs for that step; before the first step, the rate
    the first step will use. The optimizer's rate read afterwards would be the next step's,
    set by the scheduler right after the step: after a schedule's last step, 0.

    The bar's own time column shows elapsed and remaining time of the current epoch; ``eta``
    extrapolates the time per optimizer step so far to the steps left in the fit (validation
    time included in proportion). Everything shown is recomputed at most every
    ``metrics_interval_s`` seconds: Lightning turns the logged metrics into Python numbers for
    the bar, which on a GPU waits for the device, and doing that on every step would cost
    throughput. The bar itself moves at most ``refresh_rate`` times a second (and after a
    phase's last batch): Lightning's updates it after every batch, tens of microseconds each,
    for a screen that redraws ten times a second. Where the console is no terminal (output to a
    file or a pipe: a batch job, ``nohup``, ``| tee``), Rich shows nothing until the bar stops
    and then one last frame (console_output.py), yet each refresh still builds the whole bar
    (about 0.5 ms of CPU, up to ``refresh_rate`` times a second on Lightning's refresh thread):
    there the bar is disabled at setup, its batch hooks are not called, and
    ``callbacks.progress_line`` (progress_line.py) logs the progress at a steady interval.

    Its keys are the fields of `RunProgressBarSettings`, given as keyword arguments and kept
    validated in ``self.settings`` (see `vramkit.core.config.settings`); ``console_kwargs``,
    no config key, is passed to ``rich.console.Console``.
    """

    settings_class = RunProgressBarSettings

    def __init__(self, console_kwargs: dict[str, Any] | None = None, **settings: Any) -> None:
        self.settings = RunProgressBarSettings.for_component(type(self), settings)
        super().__init__(
            refresh_rate=self.settings.refresh_rate,
            leave=self.settings.leave,
            console_kwargs=console_kwargs,
        )
        self.metrics_interval_s = self.settings.metrics_interval_s
        self._cached: dict[str, Any] | None = None
        self._cached_at = -math.inf
        self._fit_started_at: float | None = None
        self._first_step = 0
        self._total_steps = math.inf
        self._moved_at = -math.inf
        rate = self.settings.refresh_rate
        self._move_interval_s = 1.0 / rate if rate > 0 else math.inf
        self._epoch_batches = math.inf  # training batches of the current epoch
        self._last_step_lr: float | torch.Tensor | None = None  # the rate the last step used

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not console_is_live(lightning_private.rich_console_kwargs(self)):
            self.disable()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._fit_started_at = time.monotonic()
        self._first_step = trainer.global_step  # a resumed run starts counting from here
        self._total_steps = trainer.estimated_stepping_batches  # of the whole fit, from step 0
        self._cached = None
        self._last_step_lr = None
        # Lightning (or the CallbackGroup that runs them) calls a callback's batch hooks on
        # every batch, about 10 us even when they return at once, unless switched off
        # (batch_hooks.py): a disabled bar has nothing to move.
        for hook in _BATCH_HOOKS:
            switch_batch_hook(self, hook, on=self.is_enabled)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Lightning steps the schedulers right after this optimizer step (training_epoch_loop's
        # update_lr_schedulers), so only now does the group hold the rate this step uses. Kept
        # as it is (a tensor for some optimizers): turned into a number only when shown.
        if optimizer is trainer.optimizers[0] and optimizer.param_groups:
            self._last_step_lr = optimizer.param_groups[0]["lr"]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._epoch_batches = self.total_train_batches

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._cached = None  # the epoch's final numbers, not a reading from half a second ago
        super().on_train_epoch_end(trainer, pl_module)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.is_enabled and self._due(batch_idx, self._epoch_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        # a hidden bar has nothing to move (and knows no current dataloader)
        if self.is_enabled and self._due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(
                trainer, pl_module, outputs, batch, batch_idx, dataloader_idx
            )

    def _due(self, batch_idx: int, total: float) -> bool:
        """Whether the bar moves after batch ``batch_idx`` of ``total``: after the last batch,
        and when the last move is ``1 / refresh_rate`` seconds old."""
        if batch_idx + 1 >= total:
            self._moved_at = time.monotonic()
            return True
        now = time.monotonic()
        if now - self._moved_at < self._move_interval_s:
            return False
        self._moved_at = now
        return True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        now = time.monotonic()
        if self._cached is not None and now - self._cached_at < self.metrics_interval_s:
            return self._cached
        items: dict[str, Any] = dict(super().get_metrics(trainer, pl_module))
        eta = self.run_eta_seconds(trainer)
        if eta is not None:
            items["eta"] = str(timedelta(seconds=round(eta)))
        last = self._last_step_lr
        lr = current_learning_rate(trainer) if last is None else float(last)
        if lr is not None:
            items["lr"] = f"{lr:.2e}"
        memory = memory_in_use(trainer.strategy.root_device)
        if memory is not None:
            items["mem"] = memory
        self._cached, self._cached_at = items, now
        return items

    def run_eta_seconds(self, trainer: L.Trainer) -> float | None:
        """Seconds left in the fit at the pace of the optimizer steps so far; None if unknown."""
        if self._fit_started_at is None:
            return None
        done = trainer.global_step - self._first_step
        if done <= 0 or not math.isfinite(self._total_steps):
            return None
        elapsed = time.monotonic() - self._fit_started_at
        return max(0.0, elapsed / done * (self._total_steps - trainer.global_step))
