"""One sample per phase for the planner: how the datamodule is set up."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from vramkit.core.planner.tracing.batches import PlanningSetup, sample_batches


class _Rows(L.LightningDataModule):
    """Eight rows of four floats per split; records how it was set up."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[str] = []
        self.rows: torch.Tensor | None = None

    def prepare_data(self) -> None:
        self.stages.append("prepare")

    def setup(self, stage: str) -> None:
        self.stages.append(stage)
        self.rows = torch.zeros(8, 4)

    def train_dataloader(self) -> DataLoader:
        assert self.rows is not None, "not set up"
        return DataLoader(list(self.rows), batch_size=2)

    def val_dataloader(self) -> DataLoader:
        return self.train_dataloader()


class _PlannableRows(_Rows):
    def setup_for_planning(self) -> None:
        self.stages.append("planning")
        self.rows = torch.zeros(8, 4)


def test_a_datamodule_without_a_planning_setup_is_set_up_for_fitting() -> None:
    datamodule = _Rows()
    assert not isinstance(datamodule, PlanningSetup)
    samples = sample_batches(datamodule)
    assert datamodule.stages == ["prepare", "fit"]
    assert samples.train.shape == (1, 4) and samples.train_size == 8


def test_a_planning_setup_replaces_prepare_data_and_the_fit_setup() -> None:
    datamodule = _PlannableRows()
    samples = sample_batches(datamodule)
    assert datamodule.stages == ["planning"]
    assert samples.val.shape == (1, 4) and samples.val_size == 8
