"""Memory per phase (train, val, test) as ``mem/`` metrics, and a table at the end of the run."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from vramkit.core.hardware.memory_stats import MemoryReading, read_host_memory, reset_host_peak
from vramkit.core.tables import render_table
from vramkit.core.units import gib

log = logging.getLogger(__name__)

PHASES = ("train", "val", "test")


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
    """

    def __init__(self, summary: bool = True) -> None:
        self.summary = summary
        self.records = {phase: _PhaseRecord() for phase in PHASES}
        self._epoch: dict[str, MemoryReading | None] = dict.fromkeys(PHASES)
        self._device: torch.device | None = None
        self._peak_resets = True  # False where the host peak cannot be reset (counts from start)
        self._training = False  # a training epoch is under way

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._device = pl_module.device
        if self._device.type != "cuda" and read_host_memory() is None:
            log.info("MemoryMonitor: no /proc/self/status on this system; host memory not logged")

    # Phase boundaries: a phase's peak is read where it ends, and reset where one starts.
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("train")
        self._training = True

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._training:
            self._sample("train")  # a validation inside the epoch ends a stretch of training
            self._training = False
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
        self._start("test")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sample("test")
        self._log(trainer, pl_module, "test")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.summary and trainer.is_global_zero and any(r.epochs for r in self.records.values()):
            print(self.table())

    def table(self) -> str:
        """The run's memory per phase as a plain-text table (GiB)."""
        cuda = self._device is not None and self._device.type == "cuda"
        title = "Memory per phase (GiB)"
        if not cuda and not self._peak_resets:
            title += ": host peaks count from process start"
        columns = ["phase", "peak allocated" if cuda else "peak RSS"]
        columns.append("allocated at end" if cuda else "RSS at end")
        if cuda:
            columns.append("peak reserved")
        columns.append("epochs")
        rows = []
        for phase, record in self.records.items():
            if record.run is None:
                continue
            row = [phase, f"{gib(record.run.peak):.3f}", f"{gib(record.run.current):.3f}"]
            if cuda:
                row.append(f"{gib(record.run.reserved_peak):.3f}")
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
