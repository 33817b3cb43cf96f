"""Per-phase memory metrics reach the CSV log, each phase has its own peak, a table is printed."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.core.callbacks.tiny_regression import TinyRegression, regression_loader
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.callbacks.memory import memory_monitor
from vramkit.core.callbacks.memory.memory_monitor import (
    EXIT_HOST_MEMORY,
    HostGauge,
    HostMemoryExceeded,
    MemoryMonitor,
)
from vramkit.core.config.schema import ConfigError
from vramkit.core.hardware.memory_stats import (
    HostRoom,
    MemoryReading,
    read_host_memory,
    reset_host_peak,
)
from vramkit.core.units import GIB

VAL_EXTRA_BYTES = 384 * 2**20  # what each validation step holds on top of training


class _HungryValidation(L.LightningModule):
    """Validation briefly holds VAL_EXTRA_BYTES more than training does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        scratch = torch.ones(VAL_EXTRA_BYTES // 4)
        scratch.add_(1)  # touch every page, so it is resident
        self.log("val/loss", self.layer(batch[0]).pow(2).mean() + scratch[0] * 0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _metrics_rows(save_dir: Path) -> list[dict[str, str]]:
    (path,) = save_dir.glob("**/metrics.csv")
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.skipif(read_host_memory() is None, reason="needs /proc/self/status (Linux)")
def test_phase_memory_reaches_the_csv_with_separate_peaks(tmp_path, capsys):
    monitor = MemoryMonitor()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[monitor],
    )
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer.fit(_HungryValidation(), train_dataloaders=loader, val_dataloaders=loader)

    rows = _metrics_rows(tmp_path)
    names = set(rows[0])
    assert {"mem/train_peak_gib", "mem/train_rss_gib", "mem/val_peak_gib", "mem/val_rss_gib"} <= (
        names
    )
    train = [float(r["mem/train_peak_gib"]) for r in rows if r["mem/train_peak_gib"]]
    val = [float(r["mem/val_peak_gib"]) for r in rows if r["mem/val_peak_gib"]]
    assert len(train) == len(val) == 2  # one value per epoch and phase
    assert all(0 < peak < 64 for peak in train + val)
    if reset_host_peak():
        # training's second epoch came after a validation: its peak is its own
        assert val[0] - train[1] > 0.8 * VAL_EXTRA_BYTES / GIB
    printed = capsys.readouterr().out
    assert "Memory per phase (GiB)" in printed
    assert "train" in printed and "val" in printed


def test_host_memory_is_read_from_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t1\n")
    reading = read_host_memory(status)
    assert (reading.peak, reading.current, reading.reserved_peak) == (2 * 2**20, 2**20, None)
    status.write_text("Name:\tpython\n")
    assert read_host_memory(status) is None
    assert read_host_memory(tmp_path / "missing") is None


def test_a_readonly_system_cannot_reset_the_host_peak(tmp_path):
    assert not reset_host_peak(tmp_path / "no" / "clear_refs")


class _Light(_HungryValidation):
    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())


def test_memory_is_read_at_phase_boundaries_not_per_batch(tmp_path, monkeypatch):
    reads: list[int] = []

    def read() -> MemoryReading:
        reads.append(1)
        return MemoryReading(peak=len(reads) * GIB, current=GIB)

    monkeypatch.setattr(memory_monitor, "read_host_memory", read)
    monkeypatch.setattr(memory_monitor, "reset_host_peak", lambda: True)
    counts = []
    for batches in (4, 12):
        reads.clear()
        monitor = MemoryMonitor(summary=False)
        trainer = L.Trainer(
            accelerator="cpu",
            max_epochs=1,
            val_check_interval=0.5,  # a validation inside the epoch and one at its end
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[monitor],
        )
        loader = DataLoader(TensorDataset(torch.randn(2 * batches, 2)), batch_size=2)
        trainer.fit(_Light(), train_dataloaders=loader, val_dataloaders=loader)
        counts.append(len(reads))
        assert monitor.records["train"].epochs == 1 and monitor.records["val"].epochs == 2
        # training's peak is the highest of its stretches around the inner validation: the
        # last read of the run was training's, at the end of the epoch
        assert monitor.records["train"].run.peak == len(reads) * GIB
    assert counts[0] == counts[1]  # three times as many batches, not one read more


def test_the_host_guard_stops_training_with_a_checkpoint(tmp_path):
    """The host's room shrinks by 1 GiB a step (faked); past 90% of the 10 GiB the run had at
    its start, training stops at a step boundary with last.ckpt written and exit status 4."""
    readings = iter(range(1, 100))

    def shrinking_room() -> HostRoom:
        return HostRoom(room=(9 - next(readings)) * GIB, own=GIB, source="fake")

    monitor = MemoryMonitor(summary=False, host_guard_interval_s=0)
    monitor.gauge = HostGauge(HostRoom(room=9 * GIB, own=GIB, source="fake"), 0.9, shrinking_room)
    last = ResumeCheckpoint(dirpath=str(tmp_path), every_n_train_steps=None)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=3,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[monitor, last],
    )
    with pytest.raises(HostMemoryExceeded) as stopped:
        trainer.fit(TinyRegression(), train_dataloaders=regression_loader(64, 4))
    # used = 1 + 9 - room: 2, 3, … GiB; 9 GiB is the limit, so the 9th reading (10 GiB) stops
    assert stopped.value.code == EXIT_HOST_MEMORY
    assert "holds 10.00 GiB, over 90% of the 10.00 GiB" in str(stopped.value)
    saved = torch.load(last.path, weights_only=False)
    assert saved["global_step"] == 9
    assert f"ckpt_path={last.path}" in str(stopped.value)


def test_the_host_guard_reads_at_most_once_per_interval(tmp_path):
    reads: list[int] = []

    def room() -> HostRoom:
        reads.append(1)
        return HostRoom(room=9 * GIB, own=GIB, source="fake")

    monitor = MemoryMonitor(summary=False, host_guard_interval_s=3600)
    monitor.gauge = HostGauge(HostRoom(room=9 * GIB, own=GIB, source="fake"), 0.9, room)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
    )
    trainer.fit(TinyRegression(), train_dataloaders=regression_loader(40, 4))
    assert len(reads) == 1  # ten steps, one reading


def test_the_host_guard_looks_at_the_clock_only_where_a_reading_may_be_due(monkeypatch):
    """At 1 ms per step and a 0.5 s interval, the guard looks at the clock on its first two
    steps (the second gives the pace) and then at most every 64 steps, not on each step; a
    reading comes once the interval has passed."""
    now = [0.0]
    looks: list[float] = []

    def clock() -> float:
        looks.append(now[0])
        return now[0]

    monkeypatch.setattr(memory_monitor.time, "monotonic", clock)
    reads: list[float] = []

    def room() -> HostRoom:
        reads.append(now[0])
        return HostRoom(room=9 * GIB, own=GIB, source="fake")

    monitor = MemoryMonitor(summary=False, host_guard_interval_s=0.5)
    monitor.gauge = HostGauge(HostRoom(room=9 * GIB, own=GIB, source="fake"), 0.9, room)
    for _ in range(1000):
        now[0] += 0.001
        monitor.on_train_batch_end(None, None, None, None, 0)
    assert len(looks) < 1000 // 32, looks
    assert reads[0] == pytest.approx(0.001)
    assert len(reads) == 2 and 0.5 <= reads[1] - reads[0] <= 0.5 + 0.065, reads


def test_a_guard_fraction_out_of_range_names_its_key():
    with pytest.raises(ConfigError, match=r"callbacks\.memory_monitor\.host_guard_fraction"):
        MemoryMonitor(host_guard_fraction=1.5)
