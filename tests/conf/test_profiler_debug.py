"""``debug=profiler``: the PyTorch profiler records a few steps and writes a trace into the run."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.net(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=2)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2)


def test_debug_profiler_writes_a_trace_of_the_recorded_steps_into_the_run_dir(compose_config):
    cfg = compose_config("+hw=cpu", "debug=profiler")
    run_dir = Path(cfg.paths.output_dir)
    trainer_cfg = cfg.trainer
    profiler = instantiate(trainer_cfg.profiler)
    assert isinstance(profiler, PyTorchProfiler)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=trainer_cfg.max_epochs,
        limit_train_batches=trainer_cfg.limit_train_batches,
        limit_val_batches=trainer_cfg.limit_val_batches,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Tiny())
    traces = sorted((run_dir / "profiler").glob("*.pt.trace.json"))
    assert {("training_step" in p.name, "validation_step" in p.name) for p in traces} == {
        (True, False),
        (False, True),
    }
    training_trace = next(p for p in traces if "training_step" in p.name)
    events = json.loads(training_trace.read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    # the schedule's 3 active steps (kineto also marks the step it stops in), not all 8
    assert 3 <= len(steps) <= 4
    assert (run_dir / "profiler" / "fit-profile.txt").is_file()
