"""What the ARC datamodules share: ``data.*`` validation, the examples and the loaders."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from vramkit.tasks.sage.arc_batching import grid_loader
from vramkit.tasks.sage.arc_data import ArcDataSettings, AugmentSettings, load_examples
from vramkit.tasks.sage.arc_examples import ArcExample
from vramkit.tasks.sage.grid_tokens import MAX_DEMOS


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


class ArcDataModule(L.LightningDataModule, abc.ABC):
    """Training examples of ``train_set`` and validation examples (test pairs) of ``val_set``.

    Subclasses make the datasets (``_make_datasets``); batches are padded to their longest
    sequence and grouped by length. The validation loader is also the test loader: ARC's
    evaluation tasks serve both.
    """

    def __init__(
        self,
        *,
        train_set: str = "arc_agi_1/training",
        val_set: str = "arc_agi_1/evaluation",
        limit_tasks: int | None = None,
        train_queries: str = "all",
        context: str = "demos",
        max_length: int = 1024,
        max_demos: int = MAX_DEMOS,
        augment: Mapping[str, Any] | None = None,
        batch_size: int = 16,
        val_batch_size: int = 16,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
    ) -> None:
        super().__init__()
        self.settings = ArcDataSettings(
            train_set=train_set,
            val_set=val_set,
            limit_tasks=limit_tasks,
            train_queries=train_queries,
            context=context,
            max_length=max_length,
            max_demos=max_demos,
            augment=AugmentSettings.from_mapping(augment, "data.augment"),
        )
        self.batch_size = _positive(batch_size, "data.batch_size")
        self.val_batch_size = _positive(val_batch_size, "data.val_batch_size")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"data.num_workers must be an integer >= 0, got {num_workers!r}")
        self.num_workers = num_workers
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        self.train_examples: list[ArcExample] | None = None
        self.val_examples: list[ArcExample] | None = None
        self.train_dataset = None
        self.val_dataset = None

    def load_examples(self) -> None:
        """Read the ARC sets (once): split by task, overlap rules enforced."""
        if self.train_examples is None:
            self.train_examples, self.val_examples = load_examples(self.settings)

    def setup(self, stage: str | None = None) -> None:
        self.load_examples()
        if self.val_dataset is None:
            self._make_datasets()

    @abc.abstractmethod
    def _make_datasets(self) -> None:
        """Build ``train_dataset`` and ``val_dataset`` from the loaded examples."""

    def _loader(self, dataset, batch_size: int, *, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        return grid_loader(
            dataset,
            dataset.lengths,
            batch_size,
            shuffle=train,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
