"""ProgressLine: one line at a steady interval where the output is a log, none on a terminal."""

from __future__ import annotations

import itertools
import logging

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.progress.progress_line import ProgressLine, eta_seconds, metric_text
from vramkit.core.config.schema import ConfigError


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)  # 4 batches


def _fit(callback: ProgressLine, max_epochs: int = 2) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[callback],
    )
    trainer.fit(_Tiny())
    return trainer


def test_a_line_every_interval_with_step_epoch_loss_throughput_and_eta(caplog):
    line = ProgressLine(interval_s=30)
    seconds = itertools.count(0, 10)  # every clock reading is 10 s later than the one before
    line._clock = lambda: float(next(seconds))
    with caplog.at_level(logging.INFO, logger="vramkit.core.callbacks.progress.progress_line"):
        _fit(line)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "vramkit.core.callbacks.progress.progress_line"
    ]
    # start at 0 s; batch ends read 10, 20, 30 (due: the line reads 40 and 50), 60, 70, 80 ...
    assert len(lines) == 2, lines
    first = lines[0]
    assert first.startswith("step 3/8 (38%) · epoch 1/2 · train/loss ")
    assert " · 0.1 samples/s · " in first  # 3 batches of 2 samples in 40 s
    assert first.endswith("ETA 0:01:07"), first  # 40 s for 3 steps, 5 steps left


def test_no_line_before_the_interval(caplog):
    line = ProgressLine(interval_s=3600)
    with caplog.at_level(logging.INFO, logger="vramkit.core.callbacks.progress.progress_line"):
        _fit(line)
    assert not [
        r for r in caplog.records if r.name == "vramkit.core.callbacks.progress.progress_line"
    ]


def test_on_a_terminal_it_is_not_registered_unless_asked(monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # a terminal, for rich.console.Console
    trainer = L.Trainer(accelerator="cpu", logger=False)
    assert ProgressLine().nothing_to_do(trainer, None) is not None
    assert ProgressLine(on_terminal=True).nothing_to_do(trainer, None) is None
    monkeypatch.setenv("TERM", "dumb")  # Rich does not redraw a bar there
    assert ProgressLine().nothing_to_do(trainer, None) is None
    monkeypatch.delenv("TTY_COMPATIBLE")
    assert ProgressLine().nothing_to_do(trainer, None) is None  # pytest's captured output


def test_eta_and_metric_text():
    assert eta_seconds(40.0, 4, 6) == 60.0
    assert eta_seconds(40.0, 0, 6) is None
    assert eta_seconds(40.0, 4, float("inf")) is None
    assert metric_text(torch.tensor(0.123456)) == "0.1235"
    assert metric_text("abc") is None
    assert metric_text(True) is None


def test_a_non_positive_interval_is_refused():
    with pytest.raises(ConfigError, match="interval_s"):
        ProgressLine(interval_s=0)
