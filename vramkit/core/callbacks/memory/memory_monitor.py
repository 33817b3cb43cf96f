"""Memory per phase (train, val, test) as ``mem/`` metrics, a table at the end of the run, and a
soft guard that stops training with a checkpoint before the host runs out of memory."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from pydantic import Field
from torch.utils.data import DataLoader

from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.config.settings import Settings
from vramkit.core.hardware.memory_stats import (
    HostRoom,
    MemoryReading,
    read_host_memory,
    read_host_room,
    reset_host_peak,
)
from vramkit.core.tables import render_table
from vramkit.core.trainer_assembly.working_set import callbacks_of_type
from vramkit.core.units import GIB, gib

log = logging.getLogger(__name__)

PHASES = ("train", "val", "test")

# At most this many training steps between two looks of the host-memory guard at the clock: a
# run whose steps suddenly slow down is read at most that many (slow) steps late.
_MAX_STEPS_UNLOOKED = 64

EXIT_HOST_MEMORY = 4
"""Exit status of a run the host-memory guard stopped (2: refused, 3: diverged)."""


class MemoryMonitorSettings(Settings):
    """The keys of ``callbacks.memory_monitor`` (conf/callbacks/memory_monitor.yaml)."""

    summary: bool = True
    """Print the table of peaks per phase at the end of fit/validate/test (global rank 0)."""
    host_guard_fraction: float | None = Field(0.9, gt=0, le=1)
    """Stop training, with last.ckpt written, once the run holds more than this share of the
    host memory it had at its start; null: no guard."""
    host_guard_interval_s: float = Field(0.5, ge=0)
    """Seconds between two readings of the host's memory (at the first step boundary after)."""


class HostMemoryExceeded(SystemExit):
    """Training stopped before the host ran out of memory, after writing a resumable checkpoint.

    A ``SystemExit`` with status :data:`EXIT_HOST_MEMORY`: no traceback, and Hydra's job runner
    lets it through as it does a stop signal's."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_HOST_MEMORY)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass
class HostGauge:
    """The run's host memory against its limit: its resident set at the start plus what the
    host has lost of its room since (so the loader workers, which take their memory from the
    same room, count too)."""

    start: HostRoom
    fraction: float
    read: Callable[[], HostRoom | None] = read_host_room

    @property
    def limit(self) -> int:
        """Bytes the run may hold before the guard stops it."""
        return int(self.fraction * self.start.total)

    def used(self) -> int | None:
        """The run's memory now (bytes); None when it cannot be read."""
        now = self.read()
        if now is None:
            return None
        return self.start.own + self.start.room - now.room


@dataclass
class _PhaseRecord:
    run: MemoryReading | None = None  # peaks over the whole run, current value at its last read
    epochs: int = 0  # epochs whose memory was logged


class MemoryMonitor(L.Callback):
    """Logs, for every epoch of every phase, the memory the phase used.

    On a GPU: ``mem/<phase>_peak_gib`` (peak allocated by tensors), ``mem/<phase>_allocated_gib``
    (allocated when the phase ended) and ``mem/<phase>_reserved_gib`` (peak held by PyTorch's
    caching allocator, what the driver sees). On a CPU: ``mem/<phase>_peak_gib`` (the resident
    set's high-water mark) and ``mem/<phase>_rss_gib`` (resident set when the phase ended),
    read from ``/proc/self/status``. The allocator and the kernel keep the peaks themselves, so
    they are read only at phase boundaries, never per batch: reset when a phase starts (a
    validation peak is validation's own), read when it ends or hands over to another phase (a
    validation inside a training epoch), merged per epoch. It owns the peak statistics: nothing
    else may reset them between its reset and its reading. At the end of
    ``fit``/``validate``/``test`` the process with global rank 0 prints a table of the run's
    peaks per phase.

    The host-memory guard (``host_guard_fraction``): a single-process fit reads the host's room
    (MemAvailable, the cgroup's limit, an RLIMIT_AS) at training step boundaries, at most every
    ``host_guard_interval_s`` seconds. The run's memory is its resident set at the start plus
    the room the host has lost since, so its loader workers count. Past ``host_guard_fraction``
    of what it had at the start, it writes the last checkpoint (``callbacks.last_checkpoint``)
    and ends the run with :class:`HostMemoryExceeded` (exit status 4) and one message, before
    the kernel's OOM killer would end it without one (exit 137).

    Its keys are the fields of `MemoryMonitorSettings`, given as keyword arguments
    and kept validated in ``self.settings`` (see `vramkit.core.config.settings`).
    """

    settings_class = MemoryMonitorSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = MemoryMonitorSettings.for_component(type(self), settings)
        self.gauge: HostGauge | None = None  # set at the start of fit when the guard is on
        self._read_at = -math.inf  # time.monotonic() of the guard's last reading
        self._steps = 0  # training steps the guard has seen
        self._next_look = 0  # the step at which it next looks at the clock
        self._looked_at, self._looked_step = -math.inf, 0  # its last look: clock, step
        self.records = {phase: _PhaseRecord() for phase in PHASES}
        self._epoch: dict[str, MemoryReading | None] = dict.fromkeys(PHASES)
        self._workers = dict.fromkeys(PHASES, 0)  # loader processes of each phase
        self._device: torch.device | None = None
        self._peak_resets = True  # False where the host peak cannot be reset (counts from start)
        self._training = False  # a training epoch is under way

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._device = pl_module.device
        if self._device.type != "cuda" and read_host_memory() is None:
            log.info("MemoryMonitor: no /proc/self/status on this system; host memory not logged")
        if stage != "fit" or self.settings.host_guard_fraction is None or self.gauge is not None:
            return
        if trainer.world_size > 1:
            # every rank would have to take the same decision at the same step (a collective
            # per step), or the others hang at the next one
            log.info("MemoryMonitor: the host-memory guard watches single-process runs only")
        else:
            start = read_host_room()
            if start is None:
                log.info("MemoryMonitor: no /proc/meminfo on this system; no host-memory guard")
            else:
                self.gauge = HostGauge(start, self.settings.host_guard_fraction)

    # The host-memory guard: at step boundaries, at most every `host_guard_interval_s`.
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.gauge is None:
            return
        # A step count first: the clock is looked at only on the steps where a reading may be
        # due, at the pace of the steps since the last look (a step only compares two ints).
        self._steps += 1
        if self._steps < self._next_look:
            return
        now = time.monotonic()
        pace = (now - self._looked_at) / (self._steps - self._looked_step)  # s per step
        self._looked_at, self._looked_step = now, self._steps
        interval = self.settings.host_guard_interval_s
        wait = self._read_at + interval - now
        if wait <= 0:
            self._read_at, wait = now, interval
            used = self.gauge.used()
            if used is not None and used > self.gauge.limit:
                self._stop_for_memory(trainer, used)
        self._next_look = self._steps + max(1, min(_MAX_STEPS_UNLOOKED, int(wait / pace)))

    def _stop_for_memory(self, trainer: L.Trainer, used: int) -> None:
        gauge = self.gauge
        assert gauge is not None
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        head = (
            f"host memory: the run holds {used / GIB:.2f} GiB, over "
            f"{gauge.fraction:.0%} of the {gauge.start.total / GIB:.2f} GiB it had at its start "
            f"({gauge.start.source} + its own {gauge.start.own / GIB:.2f} GiB); stopped at "
            f"{where} before the kernel would kill it"
        )
        resume = callbacks_of_type(trainer, ResumeCheckpoint)
        if resume:
            path = resume[0].path
            trainer.save_checkpoint(path)
            tail = (
                f"saved {path}; resume with ckpt_path={path} and a smaller batch "
                "(hw.batch_size=…), fewer loader workers (hw.num_workers=…), or more free memory"
            )
        else:
            tail = "no last checkpoint callback is configured, so nothing was saved"
        message = f"{head}; {tail}"
        log.error(message)
        raise HostMemoryExceeded(message)

    # Phase boundaries: a phase's peak is read where it ends, and reset where one starts.
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._workers["train"] = loader_workers(trainer.train_dataloader)
        self._start("train")
        self._training = True

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._training:
            self._sample("train")  # a validation inside the epoch ends a stretch of training
            self._training = False
        self._workers["val"] = loader_workers(trainer.val_dataloaders)
        self._start("val")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._sample("val")
            self._log(trainer, pl_module, "val")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._reset_peak()  # training resumes: its peak must not include validation's
            self._training = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sample("train")
        self._training = False
        self._log(trainer, pl_module, "train")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._workers["test"] = loader_workers(trainer.test_dataloaders)
        self._start("test")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sample("test")
        self._log(trainer, pl_module, "test")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if (
            self.settings.summary
            and trainer.is_global_zero
            and any(r.epochs for r in self.records.values())
        ):
            print(self.table())

    def table(self) -> str:
        """The run's memory per phase as a plain-text table (GiB).

        On a CPU the resident set is the main process's (``/proc/self/status``): each loader
        worker is a process of its own, not counted here; the table gives how many there were.
        Resetting the peak at each phase start (``clear_refs``) also resets the maximum that
        ``/usr/bin/time`` and ``getrusage`` report for the process: they show the peak since the
        last reset, which can be well below this table's."""
        cuda = self._device is not None and self._device.type == "cuda"
        title = "Memory per phase (GiB)"
        if not cuda and not self._peak_resets:
            title += ": host peaks count from process start"
        columns = ["phase", "peak allocated" if cuda else "peak RSS, main process"]
        columns.append("allocated at end" if cuda else "RSS at end")
        columns.append("peak reserved" if cuda else "loader workers, not counted")
        columns.append("epochs")
        rows = []
        for phase, record in self.records.items():
            if record.run is None:
                continue
            row = [phase, f"{gib(record.run.peak):.3f}", f"{gib(record.run.current):.3f}"]
            if cuda:
                row.append(f"{gib(record.run.reserved_peak):.3f}")
            else:
                row.append(str(self._workers[phase]))
            rows.append([*row, str(record.epochs)])
        return render_table(columns, rows, title=title)

    def _read(self) -> MemoryReading | None:
        if self._device is not None and self._device.type == "cuda":
            return read_cuda_allocator(self._device)
        return read_host_memory()

    def _reset_peak(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)
        else:
            self._peak_resets = reset_host_peak()

    def _start(self, phase: str) -> None:
        self._reset_peak()
        self._epoch[phase] = None

    def _sample(self, phase: str) -> None:
        reading = self._read()
        if reading is None:
            return
        current = self._epoch[phase]
        self._epoch[phase] = reading if current is None else current.merged(reading)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, phase: str) -> None:
        reading = self._epoch[phase]
        if reading is None:
            return
        record = self.records[phase]
        record.run = reading if record.run is None else record.run.merged(reading)
        record.epochs += 1
        if self._device is not None and self._device.type == "cuda":
            values = {
                "peak": reading.peak,
                "allocated": reading.current,
                "reserved": reading.reserved_peak,
            }
        else:
            values = {"peak": reading.peak, "rss": reading.current}
        for name, size in values.items():
            pl_module.log(
                f"mem/{phase}_{name}_gib",
                gib(size),
                reduce_fx="max",
                sync_dist=trainer.world_size > 1,
            )


def loader_workers(loaders: Any) -> int:
    """Loader worker processes behind a phase's dataloader, or a list or dict of them."""
    if isinstance(loaders, DataLoader):
        return loaders.num_workers
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return sum(loader_workers(loader) for loader in loaders)
    return 0


def read_cuda_allocator(device: torch.device) -> MemoryReading:
    """The CUDA caching allocator's peak and current allocated bytes and its peak reserved
    bytes, from one ``torch.cuda.memory_stats`` call: ``max_memory_allocated``,
    ``memory_allocated`` and ``max_memory_reserved`` each build that whole dictionary and
    read one key of it (torch/cuda/memory.py)."""
    stats = torch.cuda.memory_stats(device)
    return MemoryReading(
        peak=stats.get("allocated_bytes.all.peak", 0),
        current=stats.get("allocated_bytes.all.current", 0),
        reserved_peak=stats.get("reserved_bytes.all.peak", 0),
    )
