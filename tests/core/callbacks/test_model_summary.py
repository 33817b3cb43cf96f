"""The model summary shows FLOPs counted over the first training step, not zeros."""

from __future__ import annotations

import logging

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks import model_summary
from vramkit.core.callbacks.model_summary import RunModelSummary

BATCH, WIDTH = 4, 16


class _TwoParts(L.LightningModule):
    """A training step that calls its children directly, as the task modules do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, 1)

    def training_step(self, batch, batch_idx):
        return self.head(self.net(batch[0])).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(summary: RunModelSummary) -> None:
    data = DataLoader(TensorDataset(torch.randn(3 * BATCH, WIDTH)), batch_size=BATCH)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[summary],
    )
    trainer.fit(_TwoParts(), data)


def test_flops_of_the_first_step_are_counted_per_layer(caplog):
    summary = RunModelSummary(max_depth=1)
    # at the module's own logger: a Hydra run earlier in this worker stops propagation to root
    with caplog.at_level(logging.INFO, logger=model_summary.__name__):
        _fit(summary)
    # forward 2*B*in*out per Linear; backward twice that (input and weight gradients), except
    # the first layer's input gradient, which nothing needs
    linear = 2 * BATCH * WIDTH * WIDTH
    head = 2 * BATCH * WIDTH
    expected = 3 * (2 * linear + head) - linear
    assert summary.total_flops == expected
    assert "(4 samples)" in caplog.text
    # the counting stops after one step: the hooks are gone from the instance
    assert summary.on_train_batch_start is None


def test_the_table_lists_each_layer_with_its_flops(monkeypatch):
    printed = {}

    def capture(summary_data, *args, total_flops, **kwargs):
        printed.update(dict(summary_data), total=total_flops)

    monkeypatch.setattr(RunModelSummary, "summarize", staticmethod(capture))
    _fit(RunModelSummary(max_depth=1))
    assert printed["Name"] == ["net", "head"]
    assert all(flops not in ("0", "0 ") for flops in printed["FLOPs"])
    assert printed["total"] > 0
