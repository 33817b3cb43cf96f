"""`vramkit plan --verify`'s logic with torch.cuda's statistics faked (a CPU fit of two steps)."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.planner.decisions import verify
from vramkit.core.planner.decisions.verify import (
    MeasuredPhase,
    NeedsGpuError,
    append_cases,
    measure_phases,
    require_gpu,
)


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


class _FakeCudaPeaks:
    """A peak that grows by 100 bytes per training batch and 10 per validation batch, and that
    `reset_peak_memory_stats` sets back to 0: the readings tell which moments a phase spans."""

    def __init__(self) -> None:
        self.peak = 0

    def reset(self) -> None:
        self.peak = 0


def test_each_phase_reads_its_own_peaks(monkeypatch):
    cuda = _FakeCudaPeaks()
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", cuda.reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: cuda.peak)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: cuda.peak * 2)

    class Counting(_Linear):
        def training_step(self, batch, batch_idx):
            cuda.peak += 100
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            cuda.peak += 10
            super().validation_step(batch, batch_idx)

    data = TensorDataset(torch.randn(16, 4))
    measured = measure_phases(
        Counting(),
        DataLoader(data, batch_size=2),
        DataLoader(data, batch_size=2),
        precision="32-true",
        steps=3,
        accelerator="cpu",
    )
    # 3 training batches, then the reset at validation's start, then 3 validation batches
    assert measured == {"train": MeasuredPhase(300, 600), "val": MeasuredPhase(30, 60)}


def test_fewer_than_two_steps_are_refused():
    loader = DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2)
    with pytest.raises(ValueError, match="at least 2"):
        measure_phases(_Linear(), loader, loader, precision="32-true", steps=1, accelerator="cpu")


def test_a_cpu_host_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NeedsGpuError, match="needs a CUDA GPU"):
        require_gpu()


def test_cases_are_appended_to_the_shared_file(tmp_path):
    path = tmp_path / "verify.json"
    append_cases(path, [{"id": "a"}])
    append_cases(path, [{"id": "b"}, {"id": "c"}])
    assert [case["id"] for case in json.loads(path.read_text())["cases"]] == ["a", "b", "c"]
    path.write_text("[1, 2]")
    with pytest.raises(verify.ConfigError, match="not a vramkit --verify file"):
        append_cases(path, [{"id": "d"}])
