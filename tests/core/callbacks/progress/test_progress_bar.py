"""RunProgressBar: the fit's ETA, the learning rate and memory in use, read at a bounded rate."""

from __future__ import annotations

import io
import sys

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.memory.memory_monitor import MemoryMonitor
from vramkit.core.callbacks.memory.phase_memory_hygiene import PhaseMemoryHygiene
from vramkit.core.callbacks.progress.progress_bar import (
    RunProgressBar,
    current_learning_rate,
    memory_in_use,
    resident_set_gib,
)
from vramkit.core.trainer_assembly.working_set import group_vramkit_callbacks


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0123)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)


def _fit(
    bar: RunProgressBar, max_epochs: int = 2, callbacks: list[L.Callback] | None = None
) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks or [bar],
    )
    trainer.fit(_Tiny())
    return trainer


def test_the_bar_shows_eta_learning_rate_and_memory():
    screen = io.StringIO()
    bar = RunProgressBar(console_kwargs={"file": screen, "force_terminal": True, "width": 200})
    trainer = _fit(bar)
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert metrics["lr"] == "1.23e-02"
    assert metrics["mem"].endswith("GiB rss")
    assert metrics["eta"] == "0:00:00"  # the fit is over
    assert "train/loss" in metrics
    shown = screen.getvalue()
    assert "lr: 1.23e-02" in shown and "GiB rss" in shown and "eta: " in shown


def test_metrics_are_read_at_most_once_per_interval():
    bar = RunProgressBar(metrics_interval_s=3600.0, refresh_rate=0)
    trainer = _fit(bar, max_epochs=1)
    first = bar.get_metrics(trainer, trainer.lightning_module)
    assert bar.get_metrics(trainer, trainer.lightning_module) is first
    bar.on_train_epoch_end(trainer, trainer.lightning_module)  # the epoch's final numbers
    assert bar.get_metrics(trainer, trainer.lightning_module) is not first


def test_the_run_eta_extrapolates_the_steps_done(monkeypatch):
    bar = RunProgressBar(refresh_rate=0)
    trainer = _fit(bar, max_epochs=1)  # 4 steps
    bar._total_steps = 12  # as if the fit had 12 steps
    clock = {"now": bar._fit_started_at + 8.0}
    monkeypatch.setattr(
        "vramkit.core.callbacks.progress.progress_bar.time.monotonic", lambda: clock["now"]
    )
    # 4 steps in 8 s, 8 left
    assert bar.run_eta_seconds(trainer) == pytest.approx(16.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux only")
def test_resident_set_size_without_psutil_reads_proc(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    rss = resident_set_gib()
    ballast = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    grown = resident_set_gib()
    assert 0.01 < rss < 1024
    assert grown - rss == pytest.approx(64 / 1024, abs=0.03)
    del ballast


def test_memory_and_learning_rate_readers():
    assert memory_in_use(torch.device("cpu")).endswith("GiB rss")
    trainer = L.Trainer(accelerator="cpu", logger=False)
    assert current_learning_rate(trainer) is None  # no optimizer before fit


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match="metrics_interval_s"):
        RunProgressBar(metrics_interval_s=-1)


def test_the_bar_moves_at_most_refresh_rate_times_a_second_and_after_the_last_batch(
    monkeypatch,
):
    moves: list[int] = []

    def counted(self, trainer, pl_module, outputs, batch, batch_idx):
        moves.append(batch_idx)

    monkeypatch.setattr(L.pytorch.callbacks.RichProgressBar, "on_train_batch_end", counted)
    monkeypatch.setattr(
        "vramkit.core.callbacks.progress.progress_bar.time.monotonic", lambda: 100.0
    )
    terminal = {"file": io.StringIO(), "force_terminal": True}
    bar = RunProgressBar(refresh_rate=10, console_kwargs=terminal)
    _fit(bar, max_epochs=2)  # 4 batches per epoch, all at the same instant
    # the first batch of the run, then only each epoch's last: no time has passed in between
    assert moves == [0, 3, 3]


def test_on_a_console_that_is_no_terminal_the_bar_draws_nothing_and_is_not_called(monkeypatch):
    moves: list[int] = []

    def counted(self, trainer, pl_module, outputs, batch, batch_idx):
        moves.append(batch_idx)

    monkeypatch.setattr(L.pytorch.callbacks.RichProgressBar, "on_train_batch_end", counted)
    log_file = io.StringIO()
    bar = RunProgressBar(refresh_rate=10, console_kwargs={"file": log_file})  # a file
    _fit(bar, max_epochs=2)
    assert bar.is_disabled
    assert moves == []
    assert log_file.getvalue() == "", "a log gets no bar frame (progress_line.py logs instead)"
    assert bar.on_train_batch_end is None, "Lightning calls no batch hook of a disabled bar"


def test_a_disabled_bar_in_a_group_is_called_by_neither(monkeypatch):
    moves: list[int] = []
    original = RunProgressBar.on_train_batch_end

    def counted(self, trainer, pl_module, outputs, batch, batch_idx):
        moves.append(batch_idx)
        original(self, trainer, pl_module, outputs, batch, batch_idx)

    monkeypatch.setattr(RunProgressBar, "on_train_batch_end", counted)
    bar = RunProgressBar(console_kwargs={"file": io.StringIO()})  # a file: disabled
    grouped = group_vramkit_callbacks([bar, PhaseMemoryHygiene(), MemoryMonitor(summary=False)])
    assert grouped[0] is bar and bar.on_train_batch_end is None  # the group runs it
    _fit(bar, callbacks=grouped)
    assert bar.is_disabled
    assert moves == [], "the group calls no batch hook of a disabled bar that moves it"
    shown = io.StringIO()
    live = RunProgressBar(console_kwargs={"file": shown, "force_terminal": True, "width": 200})
    _fit(live, callbacks=group_vramkit_callbacks([live, PhaseMemoryHygiene(), MemoryMonitor()]))
    assert moves, "an enabled bar's hook runs, from the group"
    assert "lr: 1.23e-02" in shown.getvalue()
