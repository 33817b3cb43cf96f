"""What the ARC datamodules share: ``data.*`` validation, the examples and the loaders."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from vramkit.core.config.schema import check_settings
from vramkit.core.config.source import source_of
from vramkit.core.data.loaders import LoaderSettings
from vramkit.tasks.sage.arc_batching import grid_loader
from vramkit.tasks.sage.arc_data import ArcDataSettings, load_examples
from vramkit.tasks.sage.arc_examples import ArcExample
from vramkit.tasks.sage.grid_tokens import MAX_DEMOS


@dataclass(frozen=True)
class ArcDataModuleSettings(ArcDataSettings, LoaderSettings):
    """The ``data.*`` keys of an ARC datamodule: the data settings plus how they are loaded."""

    def data_settings(self) -> ArcDataSettings:
        """The settings the examples depend on (what the feature cache fingerprints)."""
        names = [f.name for f in dataclasses.fields(ArcDataSettings)]
        return ArcDataSettings(**{name: getattr(self, name) for name in names})


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
        values = {
            "train_set": train_set,
            "val_set": val_set,
            "limit_tasks": limit_tasks,
            "train_queries": train_queries,
            "context": context,
            "max_length": max_length,
            "max_demos": max_demos,
            "batch_size": batch_size,
            "val_batch_size": val_batch_size,
            "num_workers": num_workers,
            "pin_memory": pin_memory,
            "persistent_workers": persistent_workers,
        }
        if augment is not None:  # null keeps every augmentation on
            values["augment"] = augment
        settings = check_settings(
            values, ArcDataModuleSettings, key_prefix="data.", source=source_of("data")
        )
        self.settings = settings.data_settings()
        self.batch_size = settings.batch_size
        self.val_batch_size = settings.val_batch_size
        self.num_workers = settings.num_workers
        self.pin_memory = settings.pin_memory
        self.persistent_workers = settings.persistent_workers
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
