"""Random inputs for any Hugging Face model: token sequences or images, made on demand.

Every sample is a pure function of its index and the seed (nothing is stored, so any dataset
length is free), every sequence has the full ``seq_len`` (fixed shapes: the planner plans the
worst case) and its attention mask is all ones. Token ids are drawn from ``[1, vocab_size)``:
keep ``vocab_size`` at or below the model's vocabulary; the values never change memory.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from vramkit.core.data.loaders import DEFAULT_NUM_WORKERS, build_loader

TOKEN_TASKS = ("causal_lm", "masked_lm", "seq_cls")
_IGNORED = -100  # what Hugging Face losses skip


class RandomTokens(Dataset):
    """``input_ids``, ``attention_mask`` and ``labels`` shaped for a token task."""

    def __init__(
        self,
        length: int,
        *,
        task: str,
        seq_len: int,
        vocab_size: int,
        num_labels: int,
        mlm_probability: float,
        seed: int,
    ) -> None:
        if task not in TOKEN_TASKS:
            raise ValueError(f"data.task must be one of {TOKEN_TASKS}, got {task!r}")
        if vocab_size < 2 or seq_len < 1 or length < 1:
            raise ValueError("data.vocab_size must be >= 2, data.seq_len and the size >= 1")
        self.length = length
        self.task = task
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.num_labels = num_labels
        self.mlm_probability = mlm_probability
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(1, self.vocab_size, (self.seq_len,), generator=generator)
        item = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self.task == "causal_lm":
            item["labels"] = ids.clone()  # the model shifts them
        elif self.task == "masked_lm":
            masked = torch.rand(self.seq_len, generator=generator) < self.mlm_probability
            item["labels"] = torch.where(masked, ids, torch.full_like(ids, _IGNORED))
        else:
            item["labels"] = torch.randint(0, self.num_labels, (), generator=generator)
        return item


class RandomImages(Dataset):
    """``pixel_values`` (C, H, W) from a standard normal and one ``labels`` class per image."""

    def __init__(
        self, length: int, *, image_size: int, num_channels: int, num_labels: int, seed: int
    ) -> None:
        if length < 1 or image_size < 1 or num_channels < 1 or num_labels < 1:
            raise ValueError("data sizes must be >= 1")
        self.length = length
        self.shape = (num_channels, image_size, image_size)
        self.num_labels = num_labels
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return {
            "pixel_values": torch.randn(self.shape, generator=generator),
            "labels": torch.randint(0, self.num_labels, (), generator=generator),
        }


class _RandomDataModule(L.LightningDataModule):
    def __init__(
        self,
        *,
        batch_size: int,
        val_batch_size: int,
        train_size: int,
        val_size: int,
        num_workers: int = DEFAULT_NUM_WORKERS,
        pin_memory: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1 or val_batch_size < 1:
            raise ValueError("data.batch_size and data.val_batch_size must be >= 1")
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.train_size = train_size
        self.val_size = val_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def _dataset(self, length: int, seed: int) -> Dataset:
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        self.train_set = self._dataset(self.train_size, self.seed)
        self.val_set = self._dataset(self.val_size, self.seed + 1)

    def _loader(self, dataset: Any, batch_size: int, shuffle: bool) -> DataLoader:
        return build_loader(
            dataset,
            collate_fn=default_collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=shuffle,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.val_batch_size, shuffle=False)


class RandomTokenDataModule(_RandomDataModule):
    """Random token sequences for ``causal_lm``, ``masked_lm`` or ``seq_cls``."""

    def __init__(
        self,
        *,
        task: str,
        seq_len: int,
        vocab_size: int = 1000,
        num_labels: int = 2,
        mlm_probability: float = 0.15,
        **loader: Any,
    ) -> None:
        super().__init__(**loader)
        self.dataset_options = {
            "task": task,
            "seq_len": seq_len,
            "vocab_size": vocab_size,
            "num_labels": num_labels,
            "mlm_probability": mlm_probability,
        }
        RandomTokens(1, seed=0, **self.dataset_options)  # checks the options now

    def _dataset(self, length: int, seed: int) -> Dataset:
        return RandomTokens(length, seed=seed, **self.dataset_options)


class RandomImageDataModule(_RandomDataModule):
    """Random square images with class labels for ``image_cls``."""

    def __init__(
        self, *, image_size: int = 224, num_channels: int = 3, num_labels: int = 1000, **loader: Any
    ) -> None:
        super().__init__(**loader)
        self.dataset_options = {
            "image_size": image_size,
            "num_channels": num_channels,
            "num_labels": num_labels,
        }
        RandomImages(1, seed=0, **self.dataset_options)

    def _dataset(self, length: int, seed: int) -> Dataset:
        return RandomImages(length, seed=seed, **self.dataset_options)
