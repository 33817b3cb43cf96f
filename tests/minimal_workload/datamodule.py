"""The LightningDataModule of the minimal workload: fixed random points, nothing stored."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class RandomPoints(Dataset):
    """``size`` points ``{"inputs": [features], "targets": []}``, a pure function of the seed."""

    def __init__(self, size: int, features: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, features, generator=generator)
        self.targets = self.inputs.sum(dim=1)  # a line the Linear layer can learn exactly

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[index], "targets": self.targets[index]}


class RandomPointsDataModule(L.LightningDataModule):
    """Training and validation points in batches of the sizes the hardware profile decides."""

    def __init__(
        self,
        *,
        batch_size: int,
        val_batch_size: int,
        features: int,
        train_size: int,
        val_size: int,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.num_workers = num_workers
        self.train_set = RandomPoints(train_size, features, seed=0)
        self.val_set = RandomPoints(val_size, features, seed=1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set, self.batch_size, shuffle=True, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, self.val_batch_size, num_workers=self.num_workers)
